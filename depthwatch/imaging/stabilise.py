"""Shot-stable normalisation: the same scene point keeps its grey from one map to the next.

Why: MiDaS-family models predict inverse depth only up to an unknown scale and
shift per frame, and a metric model (FastDepth) drifts in scale too; min-max
normalising each map on its own makes the grey of a wall jump whenever
something near or far enters or leaves the frame, and an effect driven by the
map pumps. So each prediction is first *aligned* to the shot so far, then
mapped to grey with a range that belongs to the shot, not to the frame.

How, step by step (the same for both uses below):

1. `summarise()` reduces a frame to a `Summary` of about 10 KB: its
   prediction as nearness (`normalise.nearness`) area-averaged to a 32x32 grid,
   the frame's own range of nearness (what `frame` mode would stretch), a
   coarse colour histogram and a 64x64 grey thumbnail of the decoded image.
2. Motion (`motion`): one global translation between consecutive thumbnails by
   phase correlation, so a pan compares the same scene points.
3. Alignment (`fit`): a scale and shift taking the grid onto the shot's
   reference grid (moved with the camera), refitted twice without the
   worst-fitting 25% of cells (the part that moved, or came into view), so a
   person walking through does not tilt the whole map. The scale is the ratio
   of spreads, not the least-squares slope, which noise biases towards 0 and
   which, chained over a shot, would fade the map a little every frame.
4. A cut is a jump in the colour histogram (Hellinger distance), or an
   alignment that fits badly (low correlation, a scale far from 1): a new shot
   starts, and its first map is exactly the `frame` map. No grey levels cross a cut.
5. Temporal filter (`_blend`): the aligned map is pulled towards the previous
   one, moved with the camera, where the two agree: the model's own
   frame-to-frame noise (most of what is left after alignment, for a small
   model like FastDepth) averages out, and something that really moved keeps
   its new value.
6. The grey range is the frame statistic (min and max, or `clip_percent`
   percentiles) of the filtered map; in the daemon it follows the shot
   through an exponential moving average, offline it is the shot's own.

Metric depth is aligned as negated depth, not as disparity (1 / depth): the
`frame` map is linear in depth, the first map of a shot must be exactly that
map, and every map of a shot must share one tone curve; a metric model's
frame-to-frame error is mostly a scale, which an affine fit in either space covers.

Streaming (the daemon): `Stabiliser` keeps one small state per output path
(LRU-bounded, forgotten after `IDLE_S` without a frame, a new shot when the
model generation or the normalise settings change). `map()` works from a
snapshot of it and changes nothing; `landed()`, called once the map is written,
makes the state that frame leaves the output's, unless a newer frame's already
is. So the state follows exactly the maps the editor sees, in order, and a
frame abandoned or superseded before it is written leaves no trace.

Offline (`depthwatch once` over a sequence, and the render farm):

    summaries = [summarise(prediction, kind, image, clip) for each frame in order]
    params = plan(summaries)                    # pure; cheap; one Params per frame
    # then apply(), frame by frame, in order (below)

`plan` needs only the summaries (about 10 KB a frame), so remote workers can
return them and the client plans. `apply` needs each frame's prediction again
(kept, or recomputed) and its `Params` (a few floats), and goes through a
shot in frame order, each call handing the next one its filtered map:

    previous = None
    for prediction, p in zip(predictions, params):
        depth, previous = apply(prediction, kind, p, previous, clip)
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import cv2
import numpy as np

from depthwatch.imaging import normalise
from depthwatch.model.profiles import INVERSE_DEPTH

#: The alignment grid (cells); area-averaging to it also makes the fit tolerant of small motion.
GRID = (32, 32)
#: The grey thumbnail motion is measured on (the frame stretched like the model's input).
THUMB = (64, 64)
#: Share of grid cells kept after trimming the worst residuals, and how many refits.
KEEP = 0.75
REFITS = 2
#: Colour histogram bins per channel (8 x 8 x 8).
BINS = 8
#: A Hellinger distance between consecutive frames' histograms above this is a cut.
COLOUR_CUT = 0.45
#: An alignment correlating less than this, or needing a scale outside SCALE_RANGE, is a cut.
FIT_CUT = 0.6
SCALE_RANGE = (0.25, 4.0)
#: Temporal filter: the weight of the (motion-compensated) previous map where the two
#: agree, falling off where they differ by more than AGREE x the shot's range (a thing
#: that moved on its own keeps the new frame's value, so nothing ghosts).
CARRY = 0.85
AGREE = 0.15
#: Daemon: how fast the grey range follows the shot (share of the new frame's range per frame),
#: and how much of each new frame goes into the reference grid.
RANGE_RATE = 0.05
REFERENCE_RATE = 0.5
#: Offline: the shot's range is taken from these quantiles of its frames' aligned ranges,
#: so one odd frame does not flatten the whole shot.
SHOT_QUANTILES = (0.1, 0.9)
#: Daemon: outputs remembered at most, and forgotten after this long without a frame.
MAX_OUTPUTS = 32
IDLE_S = 600.0

_EMPTY = np.zeros(0, np.float32)


@dataclass(frozen=True)
class Summary:
    """What planning needs of one frame: small enough to send over a network (about 10 KB)."""

    #: Nearness area-averaged to GRID, float32 (raw model units, larger = nearer).
    grid: np.ndarray
    #: The range `frame` mode stretches, in nearness units (lo < hi unless flat).
    lo: float
    hi: float
    #: Colour histogram of the decoded frame, float32, sums to 1 (empty: unknown).
    colours: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: Grey thumbnail (THUMB) of the decoded frame, uint8 (empty: unknown, no motion).
    grey: np.ndarray = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True)
class Params:
    """How `apply` maps one frame: align (scale, shift), filter with the previous map, stretch."""

    #: Shot number (1, 2, ...) within the sequence, and whether this frame starts it.
    shot: int
    first: bool
    #: Use the `frame` map exactly (a shot of one frame).
    exact: bool = False
    scale: float = 1.0
    shift: float = 0.0
    #: Motion since the previous frame, in THUMB pixels.
    dx: float = 0.0
    dy: float = 0.0
    #: The shot's range in aligned units.
    lo: float = 0.0
    hi: float = 1.0


def _thumbnail(image: np.ndarray) -> np.ndarray:
    """The image at THUMB, BGR: bilinear to twice the size, then a 2x2 area average.

    About 0.05 ms for a 480x270 image, where one area resize costs 1 ms; the
    last halving keeps the aliasing that would throw the motion estimate off.
    """
    w, h = THUMB
    if image.shape[1] > 2 * w and image.shape[0] > 2 * h:
        image = cv2.resize(image, (2 * w, 2 * h), interpolation=cv2.INTER_LINEAR)
    small = cv2.resize(image, THUMB, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(small, cv2.COLOR_GRAY2BGR) if small.ndim == 2 else small


def summarise(
    prediction: np.ndarray,
    output_kind: str,
    image: np.ndarray | None,
    clip_percent: tuple[float, float] | None = None,
) -> Summary:
    """A frame's Summary from its raw prediction and its decoded image (BGR, any scale)."""
    n = normalise.nearness(prediction, output_kind)
    return _summary(n, output_kind, image, clip_percent)


def _summary(n: np.ndarray, output_kind: str, image: np.ndarray | None, clip: tuple[float, float] | None) -> Summary:
    return _summary_of(n, output_kind, None if image is None else _thumbnail(image), clip)


def _summary_of(n: np.ndarray, output_kind: str, small: np.ndarray | None, clip: tuple[float, float] | None) -> Summary:
    """The Summary of nearness `n` and the frame's THUMB-sized thumbnail (None: no image)."""
    grid = cv2.resize(n, GRID, interpolation=cv2.INTER_AREA)
    lo, hi = normalise.bounds(n, _nearness_clip(clip, output_kind))
    if small is None:
        return Summary(grid, lo, hi)
    hist = cv2.calcHist([small], [0, 1, 2], None, [BINS] * 3, [0, 256] * 3).ravel()
    hist = (hist / max(1.0, float(hist.sum()))).astype(np.float32)
    grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
    return Summary(grid, lo, hi, hist, grey)


def _nearness_clip(clip: tuple[float, float] | None, output_kind: str) -> tuple[float, float] | None:
    """`clip_percent` is set on the model's own values; nearness of a depth model runs the other way."""
    if clip is None or output_kind == INVERSE_DEPTH:
        return clip
    return 100.0 - clip[1], 100.0 - clip[0]


def colour_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Hellinger distance of two histograms: 0 the same, 1 nothing in common (0 if either is unknown)."""
    if a.size == 0 or b.size == 0:
        return 0.0
    return float(np.sqrt(max(0.0, 1.0 - float(np.sqrt(a * b).sum()))))


_WINDOW = cv2.createHanningWindow(THUMB, cv2.CV_32F)


def motion(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """How far the picture moved between two grey thumbnails (THUMB pixels; 0, 0 if unknown).

    Phase correlation: one global translation, which is what a pan or a tilt is.
    A weak peak (no clear single motion) counts as none, and so does a move of
    more than 1/8 of the picture in one frame: faster than a whip pan, and what
    repetitive texture in two unrelated frames can fake.
    """
    if before.size == 0 or after.size == 0 or before.shape != after.shape:
        return 0.0, 0.0
    (dx, dy), response = cv2.phaseCorrelate(before.astype(np.float32), after.astype(np.float32), _WINDOW)
    if response < 0.1 or abs(dx) > before.shape[1] / 8 or abs(dy) > before.shape[0] / 8:
        return 0.0, 0.0
    return float(dx), float(dy)


def shifted(image: np.ndarray, dx: float, dy: float) -> tuple[np.ndarray, np.ndarray]:
    """`image` moved by (dx, dy) of its own pixels, and where the result is valid."""
    valid = np.zeros(image.shape, bool)
    h, w = image.shape
    valid[max(0, math.ceil(dy)) : h + min(0, math.floor(dy)), max(0, math.ceil(dx)) : w + min(0, math.floor(dx))] = True
    if dx == 0.0 and dy == 0.0:
        return image, valid
    m = np.float32([[1, 0, dx], [0, 1, dy]])
    return cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE), valid


def _scaled(dx: float, dy: float, shape: tuple[int, ...]) -> tuple[float, float]:
    """THUMB-pixel motion in pixels of an array of `shape`."""
    return dx * shape[1] / THUMB[0], dy * shape[0] / THUMB[1]


@dataclass(frozen=True)
class Fit:
    """reference ~ scale * grid + shift over the cells kept, and how well the grids correlate."""

    scale: float
    shift: float
    correlation: float

    @property
    def good(self) -> bool:
        return self.correlation >= FIT_CUT and SCALE_RANGE[0] <= self.scale <= SCALE_RANGE[1]


def fit(grid: np.ndarray, reference: np.ndarray, valid: np.ndarray | None = None) -> Fit:
    """Scale and shift taking `grid` onto `reference`, trimming the worst-fitting cells.

    The correlation is over every (valid) cell, before trimming; a flat grid or
    reference fits nothing (a cut).
    """
    if grid.shape != reference.shape:
        return Fit(1.0, 0.0, -1.0)
    x = grid.ravel().astype(np.float64)
    r = reference.ravel().astype(np.float64)
    if valid is not None:
        x, r = x[valid.ravel()], r[valid.ravel()]
        if x.size < grid.size // 4:
            return Fit(1.0, 0.0, -1.0)
    scale, shift, corr = 1.0, 0.0, -1.0
    for round_ in range(REFITS + 1):
        xm, rm = x.mean(), r.mean()
        dx, dr = x - xm, r - rm
        vx, vr = float(dx @ dx), float(dr @ dr)
        if vx <= 1e-12 * max(1.0, xm * xm) * x.size or vr <= 1e-12 * max(1.0, rm * rm) * r.size:
            return Fit(1.0, 0.0, -1.0)
        cov = float(dx @ dr)
        if round_ == 0:
            # Judged on every cell: trimming would make two unrelated frames look alike.
            corr = cov / np.sqrt(vx * vr)
        # The spreads' ratio (reduced major axis), not cov / var(x): noise in the grid
        # biases the least-squares slope towards 0, and chained over a shot that
        # shrinks the map a little more with every frame.
        scale = float(np.sqrt(vr / vx)) if cov > 0 else 0.0
        shift = rm - scale * xm
        if round_ < REFITS:
            residual = np.abs(scale * x + shift - r)
            cut = int(x.size * KEEP)
            keep = np.argpartition(residual, cut)[:cut]
            x, r = x[keep], r[keep]
    return Fit(float(scale), float(shift), float(corr))


def _blend(aligned: np.ndarray, previous: np.ndarray | None, dx: float, dy: float, span: float) -> np.ndarray:
    """The temporal filter: the new aligned map pulled towards the previous one where they agree."""
    if previous is None or previous.shape != aligned.shape or not span > 0:
        return aligned
    before, valid = shifted(previous, *_scaled(dx, dy, aligned.shape))
    diff = before - aligned
    weight = diff * np.float32(1 / (AGREE * span))
    np.square(weight, out=weight)
    np.negative(weight, out=weight)
    np.exp(weight, out=weight)
    weight *= np.float32(CARRY) * valid
    weight *= diff
    weight += aligned
    return weight


@dataclass(frozen=True)
class _Step:
    """How a new frame joins its shot: the fit, the motion since the last frame, the new reference."""

    fit: Fit
    dx: float
    dy: float
    reference: np.ndarray


@dataclass(frozen=True)
class _Track:
    """A shot as it goes: the reference grid, last grey thumbnail and map, in aligned units.

    Immutable: a frame makes the next one (`after`), so a map can be computed from
    a snapshot while another worker lands its own.
    """

    number: int
    reference: np.ndarray | None
    colours: np.ndarray | None
    grey: np.ndarray | None
    previous: np.ndarray | None = None
    #: An output's first frame keeps only its thumbnail (and `previous`); the rest is
    #: worked out if a second frame comes (`ready`), so a burst of stills pays nothing for it.
    thumbnail: np.ndarray | None = None

    @classmethod
    def start(cls, number: int, summary: Summary, previous: np.ndarray | None = None) -> _Track:
        return cls(number, summary.grid, summary.colours, summary.grey, previous)

    def ready(self, output_kind: str, clip: tuple[float, float] | None) -> _Track:
        """This track with its reference, colours and grey thumbnail worked out."""
        if self.reference is not None or self.previous is None:
            return self
        return _Track.start(self.number, _summary_of(self.previous, output_kind, self.thumbnail, clip), self.previous)

    def follow(self, summary: Summary) -> _Step | None:
        """Align a new frame to the shot, or None where it is a cut."""
        if colour_distance(summary.colours, self.colours) > COLOUR_CUT:
            return None
        dx, dy = motion(self.grey, summary.grey)
        reference, valid = shifted(self.reference, *_scaled(dx, dy, self.reference.shape))
        f = fit(summary.grid, reference, valid)
        if not f.good:
            return None
        aligned = f.scale * summary.grid + f.shift
        return _Step(f, dx, dy, np.where(valid, reference + REFERENCE_RATE * (aligned - reference), aligned))

    def after(self, summary: Summary, step: _Step, filtered: np.ndarray | None) -> _Track:
        return _Track(self.number, step.reference, summary.colours, summary.grey, filtered)


# -- streaming: the daemon -----------------------------------------------------------------


@dataclass(frozen=True)
class _Shot:
    """One output's state after frame `seq`: its shot so far and the grey range (aligned units)."""

    key: Hashable
    seq: int
    track: _Track
    lo: float
    hi: float
    used: float = field(default_factory=time.monotonic, compare=False)


@dataclass(frozen=True)
class ShotMap:
    """A map, the shot it belongs to, why a new shot began with it ('' if none: 'new', 'cut',
    'model'), and the state it leaves for `Stabiliser.landed`."""

    map: np.ndarray
    shot: int
    started: str = ""
    state: _Shot | None = field(default=None, repr=False)


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
    first), each about 270 KB at 256x256, and none idle longer than `idle_s`.
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
    ) -> ShotMap:
        """The [0, 1] nearness map of frame `seq` of `output`, consistent with its shot so far."""
        n = normalise.nearness(prediction, output_kind)
        with self._lock:
            self._forget_idle(time.monotonic())
            shot = self._shots.get(output)
        if shot is None:
            lo, hi = normalise.bounds(n, _nearness_clip(clip_percent, output_kind))
            thumbnail = None if image is None else _thumbnail(image)
            state = _Shot(key, seq, _Track(1, None, None, None, n, thumbnail), lo, hi)
            return ShotMap(normalise.frame(prediction, output_kind, clip_percent), 1, "new", state)
        summary = _summary(n, output_kind, image, clip_percent)
        track = shot.track.ready(output_kind, clip_percent)
        step = track.follow(summary) if shot.key == key else None
        if step is None:
            number, why = shot.track.number + 1, "cut" if shot.key == key else "model"
            state = _Shot(key, seq, _Track.start(number, summary, n), summary.lo, summary.hi)
            return ShotMap(normalise.frame(prediction, output_kind, clip_percent), number, why, state)
        f = step.fit
        aligned = n * np.float32(f.scale)
        aligned += np.float32(f.shift)
        filtered = _blend(aligned, shot.track.previous, step.dx, step.dy, shot.hi - shot.lo)
        flo, fhi = normalise.bounds(filtered, _nearness_clip(clip_percent, output_kind))
        lo = shot.lo + RANGE_RATE * (flo - shot.lo)
        hi = shot.hi + RANGE_RATE * (fhi - shot.hi)
        state = _Shot(key, seq, track.after(summary, step, filtered), lo, hi)
        return ShotMap(_stretch(filtered, lo, hi), track.number, "", state)

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


def _stretch(aligned: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """clip((aligned - lo) / (hi - lo), 0, 1) as one multiply-add on float32."""
    span = hi - lo
    if not span > 1e-12 * max(1.0, abs(hi)):
        return np.zeros_like(aligned)
    out = aligned * np.float32(1 / span)
    out -= np.float32(lo / span)
    return np.clip(out, 0.0, 1.0, out=out)


# -- offline: a whole sequence at once -----------------------------------------------------


def plan(summaries: Sequence[Summary]) -> list[Params]:
    """Per-frame Params for a sequence in frame order, normalising each shot as a whole.

    Cuts are found as the daemon finds them, and each frame is aligned to the
    shot as the daemon aligns it; the range is the shot's own (SHOT_QUANTILES of
    its frames' aligned ranges) instead of one that follows. A shot of one frame
    gets exactly its `frame` map.
    """
    params: list[Params] = []
    shot: list[Params] = []
    ranges: list[tuple[float, float]] = []
    track: _Track | None = None
    for s in summaries:
        step = track.follow(s) if track is not None else None
        if step is None:
            params += _close(shot, ranges)
            track = _Track.start(track.number + 1 if track is not None else 1, s)
            shot, ranges = [Params(track.number, True)], [(s.lo, s.hi)]
            continue
        assert track is not None
        f = step.fit
        track = track.after(s, step, None)
        shot.append(Params(track.number, False, False, f.scale, f.shift, step.dx, step.dy))
        ranges.append((f.scale * s.lo + f.shift, f.scale * s.hi + f.shift))
    return params + _close(shot, ranges)


def _close(shot: list[Params], ranges: list[tuple[float, float]]) -> list[Params]:
    """A finished shot's Params with its range filled in."""
    if len(shot) == 1:
        return [replace(shot[0], exact=True)]
    if not shot:
        return []
    lo = float(np.quantile([r[0] for r in ranges], SHOT_QUANTILES[0]))
    hi = float(np.quantile([r[1] for r in ranges], SHOT_QUANTILES[1]))
    return [replace(p, lo=lo, hi=hi) for p in shot]


def apply(
    prediction: np.ndarray,
    output_kind: str,
    params: Params,
    previous: np.ndarray | None = None,
    clip_percent: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One frame's [0, 1] nearness map (1 = nearest) under its planned Params.

    Frames of a shot are applied in order: `previous` is what the call for the
    frame before returned second (ignored for a shot's first frame), and what
    this call returns second goes to the next one. Cheap (about 1 ms at 224x224);
    run it where the predictions are gathered.
    """
    n = normalise.nearness(prediction, output_kind)
    if params.exact:
        return normalise.frame(prediction, output_kind, clip_percent), n
    aligned = n * np.float32(params.scale)
    aligned += np.float32(params.shift)
    if not params.first:
        aligned = _blend(aligned, previous, params.dx, params.dy, params.hi - params.lo)
    return _stretch(aligned, params.lo, params.hi), aligned
