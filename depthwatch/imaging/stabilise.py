"""Shot-stable normalisation: the same scene point keeps its grey from one map to the next.

Why: MiDaS-family models predict inverse depth only up to an unknown scale and
shift per frame, and a metric model (FastDepth) drifts in scale too; min-max
normalising each map on its own makes the grey of a wall jump whenever
something near or far enters or leaves the frame, and an effect driven by the
map pumps. So each prediction is *aligned* to the shot so far, pulled towards
the previous map where the two agree, and mapped to grey with a range that
belongs to the shot, not to the frame.

How, for each frame after a shot's first (the same steps live and offline):

1. Motion (`measure`): OpenCV's DIS optical flow between the previous frame's
   grey thumbnail (THUMB_WIDTH wide, the frame's own aspect) and this one's,
   forward and backward. A pixel whose flow comes back to where it started
   (`consistent`) is a scene point seen in both frames; the rest is occluded,
   coming into view, or moving too fast to follow. About 1 ms per frame.
2. Cut (`Motion.score`): a bad alignment alone is not a cut. A cut is a frame
   that the flow cannot explain (most pixels inconsistent, and the previous
   frame warped by the flow leaves a large photometric residual) AND whose
   content changed (the mean HSV change, as PySceneDetect's ContentDetector
   measures it). Fast motion, parallax and people walking through keep most
   pixels consistent, or leave a small residual; only a new picture fails all three.
   Live (the daemon) decides on the frame itself; offline, where the frames
   after are known, a frame that nearly scores as a cut is one if it stands
   out from its neighbours (a burst of fast motion does not).
3. Alignment (`_follow`): the previous map, in the shot's units, is warped by
   the flow onto this frame; this prediction's scale and shift are fitted to it
   on the consistent pixels only, trimmed of the worst-fitting quarter twice
   (something that moved on its own). The scale is the ratio of spreads, not
   the least-squares slope, which noise biases towards 0 and which, chained
   over a shot, would fade the map a little every frame.
4. Temporal filter: the aligned map is pulled towards the warped previous map
   on consistent pixels where the two agree (weight up to CARRY, falling off
   where they differ by more than AGREE of the shot's range), as far as each
   pixel is trusted (`_trust`: less where the flow is fast, MOVE_PX, and where
   the previous frame warped by the flow does not match this one, MISMATCH;
   live, also where the pixel moves on its own, not with the camera, OWN_PX).
   The model's own frame-to-frame noise averages out on the still scene;
   occluded pixels, a moving subject whose flow is off and the background it
   uncovers take the new prediction, so nothing lags or ghosts. Offline, a backward pass pulls each map towards the
   LAG frames after it as well.
5. The grey range is the frame statistic (min and max, or `clip_percent`
   percentiles) of the filtered map; live it follows the shot through an
   exponential moving average, offline it is the mean over the frames around it.

A shot's first map is exactly the `frame` map (live), or that map stretched
over its shot's range (offline): no grey levels cross a cut.

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

Offline (`depthwatch once` over a sequence, and the render farm) there is one
shot planner, a generator with bounded memory:

    frames = ((key, summarise(prediction, kind, image, clip), prediction) for each frame in order)
    for key, nearness, first in stabilised(frames, kind, clip):   # [0, 1] maps, in frame order
        write(key, nearness)

It holds at most `window + LOOKAHEAD + 1` frames (see `held_at_most`) whatever
the sequence's length: a map leaves as soon as the frames it depends on have
come in, so predictions never pile up for a whole sequence, and none is
computed twice.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from depthwatch.imaging import normalise
from depthwatch.model.profiles import INVERSE_DEPTH

#: The colour thumbnail motion and cuts are measured on: this wide, the frame's own aspect.
THUMB_WIDTH = 160
#: DIS optical flow's fast preset: about 1.5 ms forward and backward at 160x90; the ultrafast
#: one saves 0.4 ms and leaves 8% more flicker.
FLOW_PRESET = cv2.DISOPTICAL_FLOW_PRESET_FAST
#: Forward-backward check: a pixel is consistent when |f + b| <= CONSISTENT_REL * (|f| + |b|)
#: (squared) + CONSISTENT_PX^2, the usual test (Sundaram, Brox, Keutzer 2010).
CONSISTENT_REL = 0.01
CONSISTENT_PX = 0.7
#: The cut score's units: the share of inconsistent pixels, and the mean grey residual of
#: the warped previous frame (0-255), each at which a cut is as likely as not; the score is
#: their geometric mean, and a frame scores 1 or more to be a cut.
CUT_INCONSISTENT = 0.8
CUT_RESIDUAL = 30.0
#: The residual is in units of a frame with this much contrast (the grey's standard deviation,
#: 0-255): a cut between two dark, flat shots leaves a residual as small as their contrast, so
#: its texture part is scaled up, by MAX_BOOST at most. A frame under FLAT (black, or one
#: colour) gives the flow nothing to follow: all of it counts as inconsistent, and the residual
#: is taken as it is (a fade's last frames are nearly flat too, and change little).
CONTRAST = 45.0
MAX_BOOST = 3.0
FLAT = 1.5
#: And the content must have changed: the mean HSV change of ContentDetector (0-255)
#: at least this (its AdaptiveDetector's own `min_content_val`).
CUT_CONTENT = 15.0
#: Offline: frames looked at on each side, and how far a cut's score must stand above theirs.
LOOKAHEAD = 2
STAND_OUT = 2.0
#: Offline: a frame just under the live threshold that stands out this well is a cut too.
BATCH_SCORE = 0.8
#: Alignment: the share of consistent pixels kept after trimming, and how many refits.
KEEP = 0.75
REFITS = 2
#: Where the flow is fast it is less exact: the carry falls to half at this speed
#: (thumbnail pixels a frame), so what moves follows its own frame and does not lag.
MOVE_PX = 6.0
#: Where the previous frame warped by the flow differs from this one by this much (grey,
#: 0-255), the previous map is trusted half as much (see `_trust`).
MISMATCH = 16.0
#: Live: a pixel whose flow is this far from the camera's (thumbnail pixels a frame) moves on its
#: own, and its carry falls towards OWN_FLOOR of what it was (a sharp knee, so the flow's own
#: noise leaves the background still); the camera's motion is fitted on about CAMERA_PIXELS.
OWN_PX = 1.0
OWN_FLOOR = 0.5
CAMERA_PIXELS = 1024
#: Pixels the fit samples (every k-th row and column of the map): plenty for two numbers.
FIT_PIXELS = 4096
#: At least this share of the map consistent to fit on it; below, the fit uses every pixel.
MIN_CONSISTENT = 0.05
#: Temporal filter: the weight of the warped previous map where the two agree, falling
#: off where they differ by more than AGREE x the shot's range.
CARRY = 0.92
AGREE = 0.3
#: Offline: frames after each one that its map is also pulled towards (a backward pass), and how strongly.
LAG = 12
BACK_CARRY = 0.9
#: Offline: the share of BACK_CARRY a shot's first frame gets (it must stay that frame's own map).
FIRST_BACK = 0.5
#: Offline: the filter's AGREE; a little wider, as the two passes lag less than one.
BATCH_AGREE = 0.42
#: Daemon: how fast the grey range follows the shot (share of the new frame's range per frame).
RANGE_RATE = 0.05
#: Offline: the range of a frame is the mean of the filtered ranges of the frames up to
#: this many before and after it, inside its shot (so a long shot's tone can drift slowly;
#: 2 s at 25 fps, which most shots are shorter than).
WINDOW = 50
#: Daemon: outputs remembered at most, and forgotten after this long without a frame.
MAX_OUTPUTS = 32
IDLE_S = 600.0


@dataclass(frozen=True)
class Summary:
    """What the offline planner needs of a frame beside its prediction: its colour thumbnail.

    Small enough to send over a network (about 43 KB at 160x90).
    """

    #: BGR uint8, THUMB_WIDTH wide (empty: no image, so no motion and no cut known).
    thumbnail: np.ndarray


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The image at THUMB_WIDTH (its aspect kept), BGR: every k-th pixel to about twice the size, then area.

    About 0.1 ms for a 1920x1080 image, where one bilinear or area resize of it
    costs 1 ms or more; the last halving by area keeps the aliasing that would
    throw the flow off.
    """
    h, w = image.shape[:2]
    tw = THUMB_WIDTH
    th = max(8, int(round(h * tw / w)))
    step = min(w // (2 * tw), h // (2 * th))
    if step >= 2:
        image = np.ascontiguousarray(image[::step, ::step])
    small = cv2.resize(image, (tw, th), interpolation=cv2.INTER_AREA)
    if small.dtype != np.uint8:  # 16-bit or float frames (EXR, 16-bit TIFF): the flow and HSV want 8 bits
        top = 65535.0 if small.dtype == np.uint16 else 1.0
        small = np.clip(np.nan_to_num(small.astype(np.float32)) * np.float32(255 / top), 0, 255).astype(np.uint8)
    if small.ndim == 2:
        return cv2.cvtColor(small, cv2.COLOR_GRAY2BGR)
    return small if small.shape[2] == 3 else np.ascontiguousarray(small[:, :, :3])


def summarise(
    prediction: np.ndarray,
    output_kind: str,
    image: np.ndarray | None,
    clip_percent: tuple[float, float] | None = None,
) -> Summary:
    """A frame's Summary from its decoded image (BGR, any scale); the prediction is not needed yet."""
    return Summary(np.zeros((0, 0, 3), np.uint8) if image is None else thumbnail(image))


def _nearness_clip(clip: tuple[float, float] | None, output_kind: str) -> tuple[float, float] | None:
    """`clip_percent` is set on the model's own values; nearness of a depth model runs the other way."""
    if clip is None or output_kind == INVERSE_DEPTH:
        return clip
    return 100.0 - clip[1], 100.0 - clip[0]


# -- motion and cuts -----------------------------------------------------------------------

_flow = threading.local()


def _dis() -> Any:
    """One DIS instance per thread (it keeps buffers; the worker threads measure at once)."""
    dis = getattr(_flow, "dis", None)
    if dis is None:
        dis = _flow.dis = cv2.DISOpticalFlow_create(FLOW_PRESET)
    return dis


@functools.lru_cache(maxsize=8)
def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (x, y) of an h x w image, float32; shared, so read-only."""
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    gx.flags.writeable = gy.flags.writeable = False
    return gx, gy


@dataclass(frozen=True)
class Motion:
    """How one frame follows the one before, measured on their thumbnails."""

    #: Where each thumbnail pixel of this frame was in the previous one (h, w, 2), float32.
    backward: np.ndarray
    #: Where that is trusted: the flow back and forth agrees, and lands inside the frame.
    consistent: np.ndarray
    #: The other way (offline smoothing): where each pixel of the previous frame went, and where trusted.
    forward: np.ndarray
    forward_consistent: np.ndarray
    #: How far the previous map, carried along `backward`, is trusted at each pixel (0..1,
    #: float32; see `_trust`), and the next one's along `forward`.
    trust: np.ndarray
    forward_trust: np.ndarray
    #: Share of pixels not consistent (0..1).
    inconsistent: float
    #: Mean |grey - previous grey warped by the flow| (0-255), its texture part as if the frames had CONTRAST.
    residual: float
    #: Mean HSV change, pixel by pixel, without motion (ContentDetector's score, 0-255).
    content: float
    #: The previous frame is flat (black, or one colour) and this one is not: a picture
    #: coming out of black (a cut from black, the end of a fade through black).
    from_flat: bool = False
    #: Live: 1 where a pixel moves with the camera, down to OWN_FLOOR where it moves on its
    #: own (its flow is not the camera's, see `camera`): the daemon's motion segmentation.
    still: np.ndarray | None = None

    @property
    def score(self) -> float:
        """The cut score: 1 or more, the flow cannot explain this frame (see the module's notes)."""
        if self.content < CUT_CONTENT:
            return 0.0
        if self.from_flat:
            return 2.0  # nothing of a flat frame's map belongs to the picture after it
        return float(np.sqrt(self.inconsistent / CUT_INCONSISTENT * self.residual / CUT_RESIDUAL))


def measure(before: np.ndarray, after: np.ndarray) -> Motion | None:
    """The motion from thumbnail `before` to `after` (None if either is unknown or they differ in size)."""
    if before.size == 0 or after.size == 0 or before.shape != after.shape:
        return None
    g0 = cv2.cvtColor(before, cv2.COLOR_BGR2GRAY)
    g1 = cv2.cvtColor(after, cv2.COLOR_BGR2GRAY)
    dis = _dis()
    forward = dis.calc(g0, g1, None)
    backward = dis.calc(g1, g0, None)
    h, w = g1.shape
    gx, gy = _grid(h, w)
    mx, my = gx + backward[..., 0], gy + backward[..., 1]
    consistent = _checked(backward, forward, mx, my)
    forward_consistent = _checked(forward, backward, gx + forward[..., 0], gy + forward[..., 1])
    warped = cv2.remap(g0, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    mismatch = cv2.absdiff(warped, g1)
    residual = float(mismatch.mean())
    inconsistent = 1.0 - float(consistent.mean())
    c0, c1 = float(cv2.meanStdDev(g0)[1][0, 0]), float(cv2.meanStdDev(g1)[1][0, 0])
    contrast = min(c0, c1)
    if contrast < FLAT:
        inconsistent = 1.0  # black or one colour: the flow has nothing to follow, it is no evidence
    elif contrast < CONTRAST:
        # Only the texture's part of the residual is scaled up: the light changing on a flat
        # picture moves its mean, which says nothing new.
        texture = np.abs((warped - np.float32(warped.mean())) - (g1 - np.float32(g1.mean()))).mean()
        residual += (min(MAX_BOOST, CONTRAST / contrast) - 1.0) * float(texture)
    ahead = cv2.remap(g1, gx + forward[..., 0], gy + forward[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    trust = _trust(backward, consistent, mismatch)
    own = backward - camera(backward, consistent)
    own = np.square(own[..., 0]) + np.square(own[..., 1])
    own *= np.float32(1 / OWN_PX**2)
    np.square(own, out=own)
    own += 1
    still = np.reciprocal(own)
    still *= np.float32(1 - OWN_FLOOR)
    still += np.float32(OWN_FLOOR)
    forward_trust = _trust(forward, forward_consistent, cv2.absdiff(ahead, g0))
    h0 = cv2.cvtColor(before, cv2.COLOR_BGR2HSV)
    h1 = cv2.cvtColor(after, cv2.COLOR_BGR2HSV)
    content = float(cv2.absdiff(h0, h1).mean())
    return Motion(backward, consistent, forward, forward_consistent, trust, forward_trust, inconsistent, residual, content, c0 < FLAT <= c1, still)


def camera(flow: np.ndarray, consistent: np.ndarray) -> np.ndarray:
    """The camera's share of `flow`: an affine motion fitted to the consistent pixels, trimmed twice.

    A pan, a push-in or a handheld shake moves the whole picture as one; what
    is left over is parallax and what moves on its own. Returns the fitted
    flow at every pixel (h, w, 2).
    """
    h, w = consistent.shape
    gx, gy = _grid(h, w)
    step = max(1, int(np.sqrt(h * w / CAMERA_PIXELS)))
    x, y = gx[::step, ::step].ravel(), gy[::step, ::step].ravel()
    f = flow[::step, ::step].reshape(-1, 2).astype(np.float64)
    keep = consistent[::step, ::step].ravel()
    if keep.sum() < 16:
        keep = np.ones_like(keep)
    a = np.stack([x, y, np.ones_like(x)], axis=1)[keep].astype(np.float64)
    f = f[keep]
    for round_ in range(REFITS + 1):
        coef = np.linalg.solve(a.T @ a + np.eye(3) * 1e-6, a.T @ f)  # 3x3: no LAPACK threads
        if round_ < REFITS and len(f) > 32:
            off = np.square(a @ coef - f).sum(axis=1)
            best = np.argpartition(off, int(len(f) * KEEP))[: int(len(f) * KEEP)]
            a, f = a[best], f[best]
    coef = coef.astype(np.float32)
    fitted = np.empty((h, w, 2), np.float32)
    fitted[..., 0] = gx * coef[0, 0] + gy * coef[1, 0] + coef[2, 0]
    fitted[..., 1] = gx * coef[0, 1] + gy * coef[1, 1] + coef[2, 1]
    return fitted


def _trust(flow: np.ndarray, consistent: np.ndarray, mismatch: np.ndarray) -> np.ndarray:
    """How far a neighbour's map carried along `flow` may be trusted at each pixel (see `Motion.trust`).

    0 off `consistent`; less where the flow is fast (MOVE_PX: it is less
    exact there), and where the neighbour warped by the flow does not look
    like the pixel (MISMATCH, grey levels): the flow is wrong there, or the
    pixel has just come into view beside a moving subject, so the map there
    takes the new prediction instead of keeping where the subject was.
    """
    speed = np.square(flow[..., 0]) + np.square(flow[..., 1])
    speed *= np.float32(1 / MOVE_PX**2)
    speed += 1
    m = mismatch.astype(np.float32)
    m *= np.float32(1 / MISMATCH)
    np.square(m, out=m)
    m += 1
    m *= speed
    return np.divide(consistent, m, dtype=np.float32)


def _checked(flow: np.ndarray, other: np.ndarray, mx: np.ndarray, my: np.ndarray) -> np.ndarray:
    """Where `flow` (landing at mx, my) is undone by the `other` way's flow there, inside the frame."""
    h, w = flow.shape[:2]
    there = cv2.remap(other, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    fx, fy, tx, ty = flow[..., 0], flow[..., 1], there[..., 0], there[..., 1]
    # Channel by channel: numpy's sum over a last axis of 2 is ten times slower than this.
    loop = np.square(fx + tx) + np.square(fy + ty)
    size = fx * fx + fy * fy + tx * tx + ty * ty
    inside = (mx >= 0) & (mx <= w - 1) & (my >= 0) & (my <= h - 1)
    return inside & (loop <= CONSISTENT_REL * size + CONSISTENT_PX**2)


def _is_new_picture(before: np.ndarray, after: np.ndarray, motion: Motion | None) -> bool:
    """The daemon's cut test: the flow cannot explain the frame, or it is another size (another clip).

    With no image to compare (either thumbnail empty), the shot goes on.
    """
    if motion is None:
        return before.size > 0 and after.size > 0
    return motion.score >= 1.0


# -- one frame joining its shot ------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """warped previous ~ scale * nearness + shift over the pixels kept."""

    scale: float
    shift: float


def fit(x: np.ndarray, r: np.ndarray) -> Fit:
    """Scale and shift taking values `x` onto `r` (1-D, paired), trimming the worst-fitting ones."""
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
        shift = float(rm - scale * xm)
        if round_ < REFITS:
            residual = np.abs(scale * x + shift - r)
            cut = int(x.size * KEEP)
            keep = np.argpartition(residual, cut)[:cut]
            x, r = x[keep], r[keep]
    return Fit(scale, shift)


def _on_map(motion: Motion, shape: tuple[int, ...], forward: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward (or forward) flow as remap coordinates at the map's resolution, and its trust there."""
    h, w = shape[:2]
    flow, trusted = (motion.forward, motion.forward_trust) if forward else (motion.backward, motion.trust)
    th, tw = trusted.shape
    flow = cv2.resize(flow, (w, h), interpolation=cv2.INTER_LINEAR)
    gx, gy = _grid(h, w)
    mx = gx + flow[..., 0] * np.float32(w / tw)
    my = gy + flow[..., 1] * np.float32(h / th)
    return mx, my, cv2.resize(trusted, (w, h), interpolation=cv2.INTER_LINEAR)


def _follow(
    n: np.ndarray, previous: tuple[np.ndarray, np.ndarray], motion: Motion | None, span: float, agree: float = 0.0, segment: bool = False
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
        mx, my, trust = _on_map(motion, n.shape)
    step = max(1, int(np.sqrt(n.size / FIT_PIXELS)))
    c = trust[::step, ::step] > 0
    if mx is None:
        before = last_aligned[::step, ::step]
    else:
        before = cv2.remap(last_aligned, mx[::step, ::step], my[::step, ::step], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    x = n[::step, ::step]
    f = fit(x[c], before[c]) if c.mean() >= MIN_CONSISTENT else fit(x.ravel(), before.ravel())
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
    return aligned, _blend(aligned, carried, trust, span, CARRY, agree or AGREE)


def _blend(aligned: np.ndarray, carried: np.ndarray, trust: np.ndarray, span: float, carry: float, agree: float) -> np.ndarray:
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
        mx, my, trust = _on_map(motion, maps[k].shape, forward=True)
        carried = cv2.remap(out, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        out = _blend(maps[k], carried, trust, span, carry if k == 0 else BACK_CARRY, BATCH_AGREE)
    return out


def _stretch(aligned: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """clip((aligned - lo) / (hi - lo), 0, 1) as one multiply-add on float32."""
    span = hi - lo
    if not span > 1e-12 * max(1.0, abs(hi)):
        return np.zeros_like(aligned)
    out = aligned * np.float32(1 / span)
    out -= np.float32(lo / span)
    return np.clip(out, 0.0, 1.0, out=out)


# -- streaming: the daemon -----------------------------------------------------------------


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
        clip = _nearness_clip(clip_percent, output_kind)
        small = np.zeros((0, 0, 3), np.uint8) if image is None else thumbnail(image)
        with self._lock:
            self._forget_idle(time.monotonic())
            shot = self._shots.get(output)
        motion = None
        if shot is not None and shot.key == key:
            motion = measure(shot.thumbnail, small)
        if shot is None or shot.key != key or _is_new_picture(shot.thumbnail, small, motion):
            number, why = (1, "new") if shot is None else (shot.number + 1, "cut" if shot.key == key else "model")
            lo, hi = normalise.bounds(n, clip)
            state = _Shot(key, seq, number, small, (n, n), lo, hi)
            return ShotMap(normalise.frame(prediction, output_kind, clip_percent), number, why, state)
        aligned, filtered = _follow(n, shot.previous, motion, shot.hi - shot.lo, segment=True)
        flo, fhi = normalise.bounds(filtered, clip)
        lo = shot.lo + RANGE_RATE * (flo - shot.lo)
        hi = shot.hi + RANGE_RATE * (fhi - shot.hi)
        state = _Shot(key, seq, shot.number, small, (aligned, filtered), lo, hi)
        return ShotMap(_stretch(filtered, lo, hi), shot.number, "", state)

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


# -- offline: a sequence, with look-ahead and bounded memory --------------------------------


@dataclass
class _Pending:
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


def held_at_most(window: int = WINDOW) -> int:
    """The most frames `stabilised` holds at once (each two maps at model resolution: 400 KB at 224x224)."""
    return window + LOOKAHEAD + 1


def is_cut(scores: dict[int, float], t: int) -> bool:
    """Offline: frame t starts a shot, given the cut scores of the frames around it (by index).

    A frame the daemon would call a cut (1 or more) is one here too, so a run
    of unrelated stills is a run of cuts. One that nearly is (BATCH_SCORE or
    more) is a cut if it stands out STAND_OUT times above the mean of the
    LOOKAHEAD frames on each side: a cut is one frame the flow cannot explain,
    where fast motion makes several in a row.
    """
    s = scores.get(t, 0.0)
    if s >= 1.0:
        return True
    if s < BATCH_SCORE:
        return False
    around = [scores[i] for i in range(t - LOOKAHEAD, t + LOOKAHEAD + 1) if i != t and i in scores]
    return s >= STAND_OUT * (float(np.mean(around)) if around else 0.0)


class _Planner:
    """The state of `stabilised`: frames in, maps out, in order, with bounded look-ahead."""

    def __init__(self, output_kind: str, clip: tuple[float, float] | None, window: int) -> None:
        self.kind = output_kind
        self.clip = clip
        self.window = window
        self.pending: deque[_Pending] = deque()  # received, not yet out (the decided ones first)
        self.scores: dict[int, float] = {}  # cut scores of the frames around the ones to decide
        self.decided = 0  # how many of `pending` are decided
        self.previous: _Pending | None = None  # the last frame decided
        self.before: deque[tuple[float, float]] = deque(maxlen=window)  # ranges of the shot's frames out
        self.received = 0

    def push(self, key: Any, summary: Summary, prediction: np.ndarray) -> Iterator[tuple[Any, np.ndarray, bool]]:
        last = self.pending[-1] if self.pending else self.previous
        motion = measure(last.thumbnail, summary.thumbnail) if last is not None else None
        index = self.received
        self.received += 1
        self.scores[index] = motion.score if motion is not None else 0.0
        self.pending.append(_Pending(index, key, normalise.nearness(prediction, self.kind), summary.thumbnail, motion))
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
        resized = frame.motion is None and previous is not None and _is_new_picture(previous.thumbnail, frame.thumbnail, None)
        if previous is None or resized or is_cut(self.scores, frame.index):
            frame.first = True
            frame.aligned = frame.filtered = frame.n
        else:
            assert previous.aligned is not None and previous.filtered is not None
            span = previous.bounds[1] - previous.bounds[0]
            frame.aligned, frame.filtered = _follow(frame.n, (previous.aligned, previous.filtered), frame.motion, span, BATCH_AGREE)
        frame.bounds = normalise.bounds(frame.filtered, self.clip)
        frame.n = None  # type: ignore[assignment]  # aligned and filtered are all that is needed from here
        self.previous = frame
        for old in [i for i in self.scores if i < frame.index - LOOKAHEAD]:
            del self.scores[old]

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
            assert smooth is not None
            yield head.key, _stretch(smooth, lo, hi), head.first
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
    window: int = WINDOW,
) -> Iterator[tuple[Any, np.ndarray, bool]]:
    """(key, [0, 1] nearness map, whether it starts a shot) for each of `frames`, in the same order.

    `frames` yields (key, summary, prediction) in frame order; the key is
    whatever the caller needs back (a job). A map leaves as soon as the frames
    it depends on are in (LOOKAHEAD for its cut, `window` for its range), so
    at most `held_at_most(window)` frames are held, however long the sequence.
    A shot's maps share one tone curve; a shot of one frame gets its own `frame` map.
    """
    planner = _Planner(output_kind, _nearness_clip(clip_percent, output_kind), window)
    for key, summary, prediction in frames:
        yield from planner.push(key, summary, prediction)
    yield from planner.finish()
