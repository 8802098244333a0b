"""The alignment maths: one frame's prediction fitted to its shot, filtered with a neighbour's map, stretched to grey.

Why its own module: the fit (a trimmed scale and shift), the blend towards a
neighbour's map carried by the flow, and the stretch over the shot's range are
the same pure functions for the daemon and the offline planner; they hold no
state and know nothing of outputs or sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from depthwatch.imaging.stabilise.motion import KEEP, REFITS, Motion, grid
from depthwatch.model.profiles import INVERSE_DEPTH

#: Pixels the fit samples (every k-th row and column of the map): plenty for two numbers.
FIT_PIXELS = 4096
#: At least this share of the map consistent to fit on it; below, the fit uses every pixel.
MIN_CONSISTENT = 0.05
#: Temporal filter (live; the planner passes its own): the weight of the warped previous map
#: where the two agree, falling off where they differ by more than AGREE x the shot's range
#: (`span`: live, the previous filtered map's own range where narrower than the grey range's).
#: A high carry and a wide agreement, since `keep_shape` bounds the lag on moving subjects frame by
#: frame: the gates need not hold it back on every frame for the sake of the worst ones, so the still
#: scene holds more. The carry is high enough (0.99) because live it does not fall with the flow's
#: speed (`motion.MOVE_PX`); 0.98 and 0.97 give a slightly higher worst warp error. With these, every
#: clip of `python -m benchmarks.stable` (and `--held-out`, `--fresh`, `--samples`) meets the live
#: targets: the worst warp error 0.300x of the bare model's (docs/stable.md, "Figures").
CARRY = 0.99
AGREE = 2.0
#: Each frame the shot's scale (what the fit multiplies the model's own map by) is pulled this share
#: of the way, in log, back towards the model's own (1). Why: chained frame to frame, the fit's scale
#: drifts (on a street shot the filtered map's own range halves through the shot), and a shot's grey
#: range, which stays put, would clip the first frames and wash out the last. 0.02 (a half-life of
#: about 35 frames) keeps the still scene's greys steady from frame to frame; the street crops still
#: keep only 0.56-0.63 of the bare map's contrast live (docs/stable.md, "Known limits";
#: `tests/test_stable.py`, `test_a_shot_whose_scale_drifts_keeps_its_contrast`).
SCALE_PULL = 0.02
#: A moving subject keeps its own shape (`keep_shape`): on the pixels that move, a map correlates at
#: least FIDELITY with the frame's own (aligned) map. Moving: MOVING_PX thumbnail pixels a frame or
#: more (the shared measure's 1.5 px at 320 wide, at the thumbnail's 160); below MIN_MOVING such
#: pixels at the map's resolution a frame has no moving subject to keep. Live and offline alike,
#: judged on the moving pixels the flow follows both ways (as the shared measure counts them).
#: 0.955, above the measure's 0.95: the thumbnail's flow is smoother than the measure's at 320 wide,
#: so it counts a margin of slower pixels around a subject, which lag less; a frame held at 0.950
#: there measures 0.945 in the median (the street crop at 320x180, batch). With the pull where the
#: map lags (`_least_pull`), 0.955 meets the targets on every clip of `python -m benchmarks.stable`,
#: live and offline (docs/stable.md, "Figures").
FIDELITY = 0.955
MOVING_PX = 0.75
MIN_MOVING = 64
#: Where the pull is ramped in, in MOVING_PX: from no pull at the first speed to the whole pull at the
#: second, so no seam shows where the moving pixels end. Live from half MOVING_PX; the planner passes
#: its own (`planner.BATCH_RAMP`).
RAMP = (0.5, 1.0)


def nearness_clip(clip: tuple[float, float] | None, output_kind: str) -> tuple[float, float] | None:
    """`clip_percent` is set on the model's own values; nearness of a depth model runs the other way."""
    if clip is None or output_kind == INVERSE_DEPTH:
        return clip
    return 100.0 - clip[1], 100.0 - clip[0]


@dataclass(frozen=True)
class Fit:
    """warped previous ~ scale * nearness + shift over the pixels kept."""

    scale: float
    shift: float


def fit(x: np.ndarray, r: np.ndarray, pull: float = 0.0) -> Fit:
    """Scale and shift taking values `x` onto `r` (1-D, paired), trimming the worst-fitting ones.

    `pull`: the share, in log, by which the scale is brought back towards 1 (SCALE_PULL), about
    the kept pixels' centre, so the level stays where it fits.
    """
    x = x.astype(np.float64)
    r = r.astype(np.float64)
    scale, shift = 1.0, 0.0
    for round_ in range(REFITS + 1):
        if x.size < 8:
            return Fit(scale, shift)
        xm, rm = x.mean(), r.mean()
        dx, dr = x - xm, r - rm
        vx, vr = float(dx @ dx), float(dr @ dr)
        if vx <= 1e-12 * max(1.0, xm * xm) * x.size or vr <= 1e-12 * max(1.0, rm * rm) * r.size:
            return Fit(1.0, float(rm - xm))  # flat: keep the scale, match the level
        cov = float(dx @ dr)
        # The spreads' ratio (reduced major axis), not cov / var(x): noise biases the
        # least-squares slope towards 0, and chained over a shot that fades the map.
        scale = float(np.sqrt(vr / vx)) if cov > 0 else 1.0
        if round_ == REFITS and pull:
            scale = float(scale ** (1.0 - pull))
        shift = float(rm - scale * xm)
        if round_ < REFITS:
            residual = np.abs(scale * x + shift - r)
            cut = int(x.size * KEEP)
            keep = np.argpartition(residual, cut)[:cut]
            x, r = x[keep], r[keep]
    return Fit(scale, shift)


def on_map(motion: Motion, shape: tuple[int, ...], forward: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward (or forward) flow as remap coordinates at the map's resolution, and its trust there."""
    h, w = shape[:2]
    flow, trusted = (motion.forward, motion.forward_trust) if forward else (motion.backward, motion.trust)
    assert trusted is not None, "the trust the other way is measured offline only (measure(live=False))"
    th, tw = trusted.shape
    flow = cv2.resize(flow, (w, h), interpolation=cv2.INTER_LINEAR)
    gx, gy = grid(h, w)
    mx = gx + flow[..., 0] * np.float32(w / tw)
    my = gy + flow[..., 1] * np.float32(h / th)
    return mx, my, cv2.resize(trusted, (w, h), interpolation=cv2.INTER_LINEAR)


def follow(
    n: np.ndarray,
    previous: tuple[np.ndarray, np.ndarray],
    motion: Motion | None,
    span: float,
    agree: float = AGREE,
    segment: bool = False,
    carry: float = CARRY,
) -> tuple[np.ndarray, np.ndarray]:
    """This frame's nearness `n` aligned to the shot, and filtered with the previous map.

    `previous` is the frame before's (aligned, filtered) maps, in the shot's
    units. The fit is to the previous *aligned* map, whose noise is the same
    kind as this prediction's: fitted to the filtered one (smoother), the ratio
    of spreads would come out below 1 every frame and the map would fade.
    Returns this frame's (aligned, filtered).
    """
    last_aligned, last_filtered = previous
    if last_aligned.shape != n.shape:
        return n, n
    if motion is None:
        mx = my = None
        trust = np.ones(n.shape, np.float32)
    else:
        mx, my, trust = on_map(motion, n.shape)
    step = max(1, int(np.sqrt(n.size / FIT_PIXELS)))
    c = trust[::step, ::step] > 0
    if mx is None:
        before = last_aligned[::step, ::step]
    else:
        before = cv2.remap(last_aligned, mx[::step, ::step], my[::step, ::step], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    x = n[::step, ::step]
    f = fit(x[c], before[c], SCALE_PULL) if c.mean() >= MIN_CONSISTENT else fit(x.ravel(), before.ravel(), SCALE_PULL)
    aligned = n * np.float32(f.scale)
    aligned += np.float32(f.shift)
    if not span > 0:
        return aligned, aligned
    if mx is None:
        carried = last_filtered
    else:
        carried = cv2.remap(last_filtered, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    if segment and motion is not None and motion.still is not None:
        # Live, with no frames after to average over: a subject moving on its own keeps less of
        # its last map, so it follows its own frame while the still background holds. Offline the
        # backward pass brings the lag down instead, which the warp error can afford there.
        trust = trust * cv2.resize(motion.still, trust.shape[::-1], interpolation=cv2.INTER_LINEAR)
    return aligned, blend(aligned, carried, trust, span, carry, agree)


def blend(aligned: np.ndarray, carried: np.ndarray, trust: np.ndarray, span: float, carry: float, agree: float) -> np.ndarray:
    """`aligned` pulled towards `carried` (a neighbour's map, warped onto this frame) where they agree and it is trusted."""
    diff = carried - aligned
    weight = diff * np.float32(1 / (agree * span))
    np.square(weight, out=weight)
    np.negative(weight, out=weight)
    np.exp(weight, out=weight)
    weight *= np.float32(carry) * trust
    weight *= diff
    weight += aligned
    return weight


def keep_shape(
    filtered: np.ndarray,
    aligned: np.ndarray,
    motion: Motion | None,
    least: float = FIDELITY,
    ramp: tuple[float, float] = RAMP,
) -> np.ndarray:
    """`filtered` with its moving pixels pulled towards `aligned` just enough to correlate `least` with it there.

    Why: the filter carries each pixel's last map along the flow, which holds a
    still scene steady, but where a subject moves the flow is least exact and
    the carried map lags: a walker keeps part of where it was. The agreement
    and trust gates limit that on average; this bounds it frame by frame, on
    the worst frames, where the gates cannot see it. The pull is the least one
    (`_least_pull`: more where a pixel is further from `aligned`) that brings
    the correlation on the moving pixels the flow follows both ways (as the
    shared measure counts them) to `least`, applied to every moving pixel
    alone, ramped in over `ramp` (and counted as ramped), so a frame whose
    subject already keeps its shape, and every still pixel, is left as it
    was. Correlation, not difference: the shot's scale and shift, which the
    filter is there to keep, do not count against it.
    """
    if motion is None or filtered.shape != aligned.shape:
        return filtered
    h, w = filtered.shape
    speed = cv2.magnitude(motion.backward[..., 0], motion.backward[..., 1])
    speed = cv2.resize(speed, (w, h), interpolation=cv2.INTER_LINEAR)
    # Judged on the moving pixels the flow follows both ways: off them nothing is carried (the
    # trust is 0 there), so they match the aligned map already and would hide a lag on the rest.
    consistent = cv2.resize(motion.consistent.view(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST)
    moving = (speed > MOVING_PX) & consistent.view(bool)
    if cv2.countNonZero(moving.view(np.uint8)) < MIN_MOVING:
        return filtered
    begin, whole = ramp[0] * MOVING_PX, ramp[1] * MOVING_PX
    share = np.clip((speed - np.float32(begin)) * np.float32(1 / (whole - begin)), 0.0, 1.0)
    pull = _least_pull(filtered[moving], aligned[moving], share[moving], least)
    if pull is None:
        return filtered
    return pull.applied(filtered, share, aligned - filtered)


@dataclass(frozen=True)
class _Pull:
    """How hard `keep_shape` pulls: pixel by pixel min(1, gain x |gap| / scale) of the ramp's share
    (scale 0: the whole share)."""

    gain: float
    scale: float

    def applied(self, filtered: np.ndarray, share: np.ndarray, gap: np.ndarray) -> np.ndarray:
        """`filtered` with each pixel moved its pulled share of `gap` (a new array, `share`'s type)."""
        if self.scale > 0:
            moved = np.abs(gap).astype(share.dtype, copy=False)
            moved *= share.dtype.type(self.gain / self.scale)
            np.minimum(moved, 1, out=moved)
            moved *= share
        else:
            moved = share.copy()
        moved *= gap
        moved += filtered
        return moved


def _least_pull(filtered: np.ndarray, aligned: np.ndarray, share: np.ndarray, least: float) -> _Pull | None:
    """The least pull that brings the moving pixels' correlation with `aligned` to `least` (None: none needed).

    Why a pull that grows with the gap, not one share for every moving pixel:
    a lag shows where the carried map and the frame's own differ most (the
    subject's old place), while where they differ by the model's noise alone
    the carried map is the steadier one. Pulling every pixel the same share
    to reach the floor would put that noise back on the whole subject;
    weighted by the gap, the same correlation is reached with the still
    parts of a subject left steady (a lower warp error at the same floor:
    `test_the_pull_goes_where_the_map_lags_and_the_steady_rest_stays`). The ramp's share counts in
    the correlation as it is applied: judged as if every moving pixel took
    the whole pull, the planner's ramp (`planner.BATCH_RAMP`) would leave the
    slower ones short of it, and the frame under the floor.
    """
    f = filtered.astype(np.float64)
    a = aligned.astype(np.float64)
    a -= a.mean()
    aa = a @ a
    if aa <= 0:
        return None
    n = len(f)

    def correlation(x: np.ndarray) -> float:
        spread = (x @ x - x.sum() ** 2 / n) * aa
        return float(x @ a / np.sqrt(spread)) if spread > 0 else 1.0

    if correlation(f) >= least:
        return None
    gap = aligned.astype(np.float64) - f
    share = share.astype(np.float64)
    reach = share * gap  # what the whole ramp's share moves each pixel by
    scale = float(np.sqrt(np.mean(np.square(reach))))
    if not scale > 0 or correlation(f + reach) < least:
        return _Pull(1.0, 0.0)  # the whole ramp's share, where even that falls short

    def correlation_at(gain: float) -> float:
        return correlation(_Pull(gain, scale).applied(f, share, gap))

    # The log of the gain, to within 1%: at e^-6 the pull is a fraction of a percent, at e^6 every
    # pixel that differs by more than a fraction of a percent of the typical gap takes its whole share.
    low, high = -6.0, 6.0
    for _ in range(10):
        mid = (low + high) / 2
        low, high = (low, mid) if correlation_at(float(np.exp(mid))) >= least else (mid, high)
    return _Pull(float(np.exp(high)), scale)


def stretch(aligned: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """clip((aligned - lo) / (hi - lo), 0, 1) as one multiply-add on float32."""
    span = hi - lo
    if not span > 1e-12 * max(1.0, abs(hi)):
        return np.zeros_like(aligned)
    out = aligned * np.float32(1 / span)
    out -= np.float32(lo / span)
    return np.clip(out, 0.0, 1.0, out=out)

