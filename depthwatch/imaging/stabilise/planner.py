"""The offline shot planner (`depthwatch once` over a sequence, clips, the render farm): frames in, maps out, with look-ahead and bounded memory.

Why its own module: offline the frames after each one are known, so a cut is
decided with look-ahead, each map is also pulled towards the frames after it
(a backward pass), and a frame's grey range is the mean over the frames
around it; and all of it streams, holding at most `held_at_most` frames
whatever the sequence's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from depthwatch.imaging import normalise
from depthwatch.imaging.stabilise.alignment import blend, follow, keep_shape, nearness_clip, on_map, stretch
from depthwatch.imaging.stabilise.cuts import LOOKAHEAD, is_cut, is_new_picture
from depthwatch.imaging.stabilise.motion import Motion, measure, thumbnail

#: Offline: frames after each one that its map is also pulled towards (a backward pass), and how
#: strongly: hard, since `alignment.keep_shape` bounds the lag on moving subjects frame by frame, so
#: the pull is free to hold the still scene.
LAG = 12
BACK_CARRY = 0.95
#: Offline: the share of BACK_CARRY a shot's first frame gets (it must stay that frame's own map).
FIRST_BACK = 0.5
#: Offline: the forward filter's carry and agreement (see `alignment.CARRY`). The agreement is wide
#: (0.8 of the shot's range) for the same reason: the floor, not the gate, holds back what moves, so
#: the still scene holds more. With these, every clip of `python -m benchmarks.stable` (and
#: `--held-out`, `--fresh`, `--samples`) meets the offline targets: the worst warp error 0.228x of the
#: bare model's, the lowest median on moving pixels 0.951 (docs/stable.md, "Figures").
BATCH_CARRY = 0.92
BATCH_AGREE = 0.8
#: Offline: the range of a frame is the mean of the filtered ranges of the frames up to
#: this many before and after it, inside its shot (so a long shot's tone can drift slowly;
#: 2 s at 25 fps, which most shots are shorter than).
RANGE_WINDOW = 50
#: Offline: the floor under moving subjects (`alignment.keep_shape`) is ramped in from 0.8 to 1.2
#: MOVING_PX, where live ramps it in from 0.5 to 1.0. A slow pixel's carried map lags by little, and
#: the backward pass already halves the lag, so pulling the slowest pixels to their own frame's map
#: would buy little shape for a map that trembles with the model's noise. The floor itself is live's
#: (alignment.FIDELITY), judged on the moving pixels the flow follows both ways, and the ramp's share
#: counts in the floor's correlation as it is applied (`alignment._least_pull`).
BATCH_RAMP = (0.8, 1.2)


@dataclass(frozen=True)
class Summary:
    """What the offline planner needs of a frame beside its prediction: its colour thumbnail.

    Small enough to send over a network (about 43 KB at 160x90).
    """

    #: BGR uint8, THUMB_WIDTH wide (empty: no image, so no motion and no cut known).
    thumbnail: np.ndarray


def summarise(
    prediction: np.ndarray,
    output_kind: str,
    image: np.ndarray | None,
    clip_percent: tuple[float, float] | None = None,
) -> Summary:
    """A frame's Summary from its decoded image (BGR, any scale); the prediction is not needed yet."""
    return Summary(np.zeros((0, 0, 3), np.uint8) if image is None else thumbnail(image))


@dataclass
class _HeldFrame:
    """A frame in the planner: its nearness, its motion from the frame before, and once decided, its map."""

    index: int
    key: Any
    n: np.ndarray
    thumbnail: np.ndarray
    motion: Motion | None
    first: bool = False
    aligned: np.ndarray | None = None
    filtered: np.ndarray | None = None
    bounds: tuple[float, float] = (0.0, 1.0)


def held_at_most(window: int = RANGE_WINDOW) -> int:
    """The most frames `stabilised` holds at once (each two maps at model resolution: 400 KB at 224x224)."""
    return window + LOOKAHEAD + 1


def _smoothed(maps: list[np.ndarray], motions: list[Motion | None], span: float, carry: float) -> np.ndarray:
    """Offline: the first of a run of filtered maps, pulled towards those after it (a backward pass).

    `motions[k]` is the motion from maps[k] to maps[k + 1]. The forward
    filter only knows the past; this brings in the frames that follow, so
    the model's noise averages over both sides and nothing leads or lags.
    """
    if not span > 0:  # a flat shot: nothing to pull towards
        return maps[0]
    out = maps[-1]
    for k in range(len(maps) - 2, -1, -1):
        motion = motions[k]
        if motion is None:
            out = maps[k]
            continue
        mx, my, trust = on_map(motion, maps[k].shape, forward=True)
        carried = cv2.remap(out, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        out = blend(maps[k], carried, trust, span, carry if k == 0 else BACK_CARRY, BATCH_AGREE)
    return out


class _Planner:
    """The state of `stabilised`: frames in, maps out, in order, with bounded look-ahead."""

    def __init__(self, output_kind: str, clip: tuple[float, float] | None, window: int) -> None:
        self.kind = output_kind
        self.clip = clip
        self.window = window
        self.pending: deque[_HeldFrame] = deque()  # received, not yet out (the decided ones first)
        self.motions: dict[int, Motion | None] = {}  # the motions of the frames around the ones to decide (cuts)
        self.decided = 0  # how many of `pending` are decided
        self.previous: _HeldFrame | None = None  # the last frame decided
        self.before: deque[tuple[float, float]] = deque(maxlen=window)  # ranges of the shot's frames out
        self.received = 0

    def push(self, key: Any, summary: Summary, prediction: np.ndarray) -> Iterator[tuple[Any, np.ndarray, bool]]:
        last = self.pending[-1] if self.pending else self.previous
        motion = measure(last.thumbnail, summary.thumbnail) if last is not None else None
        index = self.received
        self.received += 1
        self.motions[index] = motion
        self.pending.append(_HeldFrame(index, key, normalise.nearness(prediction, self.kind), summary.thumbnail, motion))
        while self.decided < len(self.pending) - LOOKAHEAD:
            self._decide()
        return self._ready(final=False)

    def finish(self) -> Iterator[tuple[Any, np.ndarray, bool]]:
        while self.decided < len(self.pending):
            self._decide()
        return self._ready(final=True)

    def _decide(self) -> None:
        frame = self.pending[self.decided]
        self.decided += 1
        previous = self.previous
        # A frame of another size is a new shot, as in the daemon; with no thumbnail the shot goes on.
        resized = frame.motion is None and previous is not None and is_new_picture(previous.thumbnail, frame.thumbnail, None)
        if previous is None or resized or is_cut(self.motions, frame.index):
            frame.first = True
            frame.aligned = frame.filtered = frame.n
        else:
            assert previous.aligned is not None and previous.filtered is not None
            span = previous.bounds[1] - previous.bounds[0]
            frame.aligned, frame.filtered = follow(
                frame.n, (previous.aligned, previous.filtered), frame.motion, span, BATCH_AGREE, carry=BATCH_CARRY
            )
        frame.bounds = normalise.bounds(frame.filtered, self.clip)
        frame.n = None  # type: ignore[assignment]  # aligned and filtered are all that is needed from here
        self.previous = frame
        for old in [i for i in self.motions if i < frame.index - LOOKAHEAD]:
            del self.motions[old]

    def _ready(self, final: bool) -> Iterator[tuple[Any, np.ndarray, bool]]:
        """Frames whose range is known: every frame of its shot within `window` after it is decided."""
        while self.decided:
            head = self.pending[0]
            after: list[tuple[float, float]] = []
            ended = final
            for frame in list(self.pending)[1 : self.decided]:
                if frame.first:
                    ended = True
                    break
                after.append(frame.bounds)
                if len(after) == self.window:
                    break
            if not ended and len(after) < self.window:
                return
            if head.first:
                self.before.clear()
            ranges = [*self.before, head.bounds, *after]
            lo = float(np.mean([r[0] for r in ranges]))
            hi = float(np.mean([r[1] for r in ranges]))
            run = [head, *list(self.pending)[1 : 1 + min(LAG, len(after))]]
            filtered = [f.filtered for f in run]
            # A shot's first map stays close to that frame's own: a lighter pull from the frames after it.
            carry = BACK_CARRY * (FIRST_BACK if head.first else 1.0)
            smooth = _smoothed(filtered, [f.motion for f in run[1:]], hi - lo, carry) if len(run) > 1 and carry > 0 else head.filtered
            assert smooth is not None and head.aligned is not None
            if not head.first:
                smooth = keep_shape(smooth, head.aligned, head.motion, ramp=BATCH_RAMP)
            yield head.key, stretch(smooth, lo, hi), head.first
            self.before.append(head.bounds)
            self.pending.popleft()
            self.decided -= 1
            if self.previous is not head:
                head.aligned = head.filtered = None  # out: only the last frame decided is needed


def stabilised(
    frames: Iterable[tuple[Any, Summary, np.ndarray]],
    output_kind: str,
    clip_percent: tuple[float, float] | None = None,
    *,
    window: int = RANGE_WINDOW,
) -> Iterator[tuple[Any, np.ndarray, bool]]:
    """(key, [0, 1] nearness map, whether it starts a shot) for each of `frames`, in the same order.

    `frames` yields (key, summary, prediction) in frame order; the key is
    whatever the caller needs back (a job). A map leaves as soon as the frames
    it depends on are in (LOOKAHEAD for its cut, `window` for its range), so
    at most `held_at_most(window)` frames are held, however long the sequence.
    A shot's maps share one tone curve; a shot of one frame gets its own `frame` map.
    """
    planner = _Planner(output_kind, nearness_clip(clip_percent, output_kind), window)
    for key, summary, prediction in frames:
        yield from planner.push(key, summary, prediction)
    yield from planner.finish()
