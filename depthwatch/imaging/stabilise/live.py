"""The daemon's stabiliser: one small shot state per output path, moved on only by maps that land.

Why its own module: the daemon maps frames as they come, with no frame after
to look at, from several worker threads at once; what it keeps per output
(bounded, forgotten when idle, a new shot on a model or settings change) and
when that state moves on (only once a map is written, in the order maps land)
is its own concern, apart from the maths it shares with the offline planner.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from depthwatch.imaging import normalise
from depthwatch.imaging.stabilise.alignment import follow, keep_shape, nearness_clip, stretch
from depthwatch.imaging.stabilise.cuts import JUMP_HISTORY, is_jump, is_new_picture
from depthwatch.imaging.stabilise.motion import Motion, measure, thumbnail

#: Daemon: how fast the grey range follows the shot (share of the new frame's range per frame).
RANGE_RATE = 0.05
#: Daemon: outputs remembered at most, and forgotten after this long without a frame.
MAX_OUTPUTS = 32
IDLE_S = 600.0


@dataclass(frozen=True)
class _Shot:
    """One output's state after frame `seq`: the shot so far, in the shot's units."""

    key: Hashable
    seq: int
    number: int
    thumbnail: np.ndarray
    #: The frame's aligned and filtered maps (what the next frame fits to, and blends with).
    previous: tuple[np.ndarray, np.ndarray]
    lo: float
    hi: float
    #: The filtered map's own range (its bounds' width), which the next frame's agreement is
    #: measured against where it is narrower than the grey range's span (see `map`).
    extent: float
    #: (residual, failure) of the motions of the shot's last frames, oldest first (`cuts.is_jump`).
    recent: tuple[tuple[float, float], ...] = ()
    used: float = field(default_factory=time.monotonic, compare=False)


@dataclass(frozen=True)
class ShotMap:
    """A map, the shot it belongs to, why a new shot began with it ('' if none: 'new', 'cut',
    'model'), and the state it leaves for `Stabiliser.landed`."""

    map: np.ndarray
    shot: int
    started: str = ""
    state: _Shot | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Lookahead:
    """A frame's thumbnail and its motion from its output's state as that was, made before its prediction.

    Why: the flow needs only the two pictures, so the pipeline measures it on a
    worker while the model runs (see `render.ahead`); `map` uses it only if the
    output's state is still the one it was measured from (`since`).
    """

    thumbnail: np.ndarray
    since: _Shot | None = None
    motion: Motion | None = None


class Stabiliser:
    """Per-output shot state for the daemon; thread-safe.

    `map()` computes a frame's map from the output's state as it is (a snapshot;
    nothing changes), and `landed()` makes the state it leaves the output's,
    once the map is written: the state follows exactly the maps an editor sees,
    in the order they land. A frame superseded before it is written leaves no
    trace, and a frame older than the one that made the state leaves none either.
    `key` is whatever must match for the state to carry over (the model's
    generation, the settings): a mismatch starts a new shot.
    Memory: at most `max_outputs` outputs (the least recently used forgotten
    first), each about 250 KB for a 224x224 model, and none idle longer than `idle_s`.
    """

    def __init__(self, max_outputs: int = MAX_OUTPUTS, idle_s: float = IDLE_S) -> None:
        self._shots: OrderedDict[Path, _Shot] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_outputs
        self._idle_s = idle_s

    def __len__(self) -> int:
        return len(self._shots)

    def state(self, output: Path) -> _Shot | None:
        with self._lock:
            return self._shots.get(output)

    def lookahead(self, output: Path, image: np.ndarray | None, key: Hashable, *, motion: bool = True) -> Lookahead:
        """What `map` will need of this frame alone: its thumbnail, and (`motion`) the flow from the output's state.

        `motion=False` where the state will likely have moved on before the map
        is made (an older frame of the output still in flight): the flow is then
        measured once, in `map`, not twice.
        """
        small = _thumbnail_of(image)
        if not motion:
            return Lookahead(small)
        with self._lock:
            shot = self._shots.get(output)
        if shot is None or shot.key != key:
            return Lookahead(small)
        return Lookahead(small, shot, measure(shot.thumbnail, small, live=True))

    def map(
        self,
        output: Path,
        prediction: np.ndarray,
        output_kind: str,
        image: np.ndarray | None,
        *,
        key: Hashable,
        seq: int,
        clip_percent: tuple[float, float] | None = None,
        ahead: Lookahead | None = None,
    ) -> ShotMap:
        """The [0, 1] nearness map of frame `seq` of `output`, consistent with its shot so far.

        `ahead`: this frame's `lookahead`, made while the model ran (used where it still holds).
        """
        n = normalise.nearness(prediction, output_kind)
        clip = nearness_clip(clip_percent, output_kind)
        small = ahead.thumbnail if ahead is not None else _thumbnail_of(image)
        with self._lock:
            self._forget_idle(time.monotonic())
            shot = self._shots.get(output)
        motion = None
        if shot is not None and shot.key == key:
            measured = ahead is not None and ahead.since is shot
            motion = ahead.motion if measured else measure(shot.thumbnail, small, live=True)  # type: ignore[union-attr]
        if shot is None or shot.key != key or is_new_picture(shot.thumbnail, small, motion):
            number, why = (1, "new") if shot is None else (shot.number + 1, "cut" if shot.key == key else "model")
            lo, hi = normalise.bounds(n, clip)
            state = _Shot(key, seq, number, small, (n, n), lo, hi, hi - lo)
            return ShotMap(normalise.frame(prediction, output_kind, clip_percent), number, why, state)
        # Whether the carried map and this one agree is judged against the scene's depth range as
        # the map has it, not the grey range's span: that span follows the map slowly, so where the
        # map's range shrinks through a shot (a street reframed: to half) it lags wider, and an
        # agreement measured against it would carry a crossing subject's last map along. (The
        # planner measures it against the previous filtered map's bounds too: its `span`.)
        span = min(shot.hi - shot.lo, shot.extent) if shot.extent > 0 else shot.hi - shot.lo
        recent = shot.recent
        if motion is not None and is_jump(motion, recent):
            # A jump (an edit's, or the editor scrubbing): the same shot and tone curve, but nothing
            # of the last map carried, whose flow here is mostly wrong matches.
            aligned, filtered = follow(n, shot.previous, motion, span, carry=0.0)
        else:
            aligned, filtered = follow(n, shot.previous, motion, span, segment=True)
            filtered = keep_shape(filtered, aligned, motion)  # and what the next frame carries
        if motion is not None:
            recent = (*recent[1 - JUMP_HISTORY :], (motion.residual, motion.failure))
        flo, fhi = normalise.bounds(filtered, clip)
        lo = shot.lo + RANGE_RATE * (flo - shot.lo)
        hi = shot.hi + RANGE_RATE * (fhi - shot.hi)
        state = _Shot(key, seq, shot.number, small, (aligned, filtered), lo, hi, fhi - flo, recent)
        return ShotMap(stretch(filtered, lo, hi), shot.number, "", state)

    def landed(self, output: Path, shot_map: ShotMap) -> bool:
        """The map of `shot_map` was written: its state becomes the output's, unless a newer one's did."""
        state = shot_map.state
        if state is None:
            return False
        with self._lock:
            current = self._shots.get(output)
            if current is not None and current.seq >= state.seq:
                return False
            self._shots[output] = state
            self._shots.move_to_end(output)
            while len(self._shots) > self._max:
                self._shots.popitem(last=False)
            return True

    def _forget_idle(self, now: float) -> None:
        while self._shots:
            output, oldest = next(iter(self._shots.items()))
            if now - oldest.used <= self._idle_s:
                return
            del self._shots[output]

    def clear(self) -> None:
        with self._lock:
            self._shots.clear()


def _thumbnail_of(image: np.ndarray | None) -> np.ndarray:
    """The frame's thumbnail; an empty one where there is no picture (no flow, no cut test)."""
    return np.zeros((0, 0, 3), np.uint8) if image is None else thumbnail(image)
