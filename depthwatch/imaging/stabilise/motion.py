"""Motion: how one frame follows the one before, measured on colour thumbnails.

Why its own module: the flow, its forward-backward check, the per-pixel trust
and the camera's share of the motion are what both the daemon's Stabiliser and
the offline planner build on, and the measures the cut tests decide on
(`cuts`) come from the same flow: `Motion.score` and `Motion.failure`.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

#: The colour thumbnail motion and cuts are measured on: this wide, the frame's own aspect.
THUMB_WIDTH = 160
#: ... and at most this tall: a portrait frame up to 1:4 is THUMB_WIDTH wide, a taller strip fits
#: this height instead. Each side is bounded, so a 1 x 70000 strip gets a thumbnail of a few hundred
#: pixels, not 160 x 11.2 million (`thumbnail_size`).
THUMB_HEIGHT = 4 * THUMB_WIDTH
#: The flow (OpenCV's DIS) is measured only on thumbnails at least this many pixels on each side:
#: under 8 it raises, and with the cut test's preset at level 1 a thumbnail 12-15 pixels high and
#: 160 wide ends the process (a segmentation fault, OpenCV 5.1). From 16 up every flow of `FLOWS`
#: holds, at any length up to 5000.
MIN_FLOW_SIDE = 16
#: The flow (OpenCV's DIS) is measured down to the thumbnail itself (DIS's finest pyramid level 0),
#: live and offline, so what moves on a few thumbnail pixels (a walker's limbs, a car's edges,
#: leaves stirring in a tree) is followed, not smoothed over. Offline it counts twice: the planner's
#: two passes carry every map along the flow. With it every clip of `python -m benchmarks.stable`
#: (and `--held-out`, `--fresh`, `--samples`) meets the targets live and offline (docs/stable.md,
#: "Figures"); the planner costs about 12 ms a 1080p frame (the same command's cost line).
FLOW_SCALE = 0
#: Offline: the medium preset (larger patches, more iterations), with its variational refinement:
#: the planner's agreement and backward pass (planner.BATCH_AGREE, BACK_CARRY) are set for the
#: refined flow.
BATCH_PRESET = cv2.DISOPTICAL_FLOW_PRESET_MEDIUM
#: Live: the fast preset, without the variational refinement (LIVE_REFINEMENT). The medium preset at
#: the whole thumbnail would about double the stabiliser's cost a frame; the fast one keeps a followed
#: 1080p frame at about 5 ms (OpenCV runs DIS on every core: 9 ms of CPU on two), within what the
#: daemon allows the stabiliser, and still sees what moves on a few pixels: the lowest live worst
#: tenth on moving pixels is 0.886 (OpenCV's tree.avi), the worst live warp error 0.300x of the bare
#: model's (`python -m benchmarks.stable`; docs/stable.md, "Figures").
LIVE_PRESET = cv2.DISOPTICAL_FLOW_PRESET_FAST
#: Live, a frame that may be a cut (its content changed by CUT_CONTENT or more: under it, nothing is a
#: cut) is judged first on a coarser flow: the medium preset at half the thumbnail (DIS's level 1),
#: unrefined. A cut needs no flow to follow, so only a frame that is no cut pays for the finer one: a
#: cut frame costs about 1.9 ms at 1080p, against 3.4 with the finer flow (the editor jumping from shot
#: to shot waits at each one); the 3.9% of frames that change that much without a cut (fast pans, on
#: 37 real clips) pay both, about 0.8 ms more. The cuts found and every map are the same either way
#: (`python -m benchmarks.cuts`): this is cost alone.
CUT_FLOW_SCALE = 1
CUT_PRESET = cv2.DISOPTICAL_FLOW_PRESET_MEDIUM
#: Live, without the variational refinement at each level (the preset's 5 iterations): it is about
#: half the flow's cost, and live the maps are as good without it.
LIVE_REFINEMENT = 0
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
#: A reframe between two frames, in one frame's time, of this much or more (the log of the
#: camera's scale: 0.18 is 1.2x in or out) is a cut: a punch-in or -out on continuing action, which
#: the flow explains as a zoom. A camera zooms far slower (a crash zoom of 3x in half a second is
#: about 0.1 a frame; within a shot real footage here keeps under 0.12: `python -m benchmarks.cuts
#: --zooms`; docs/stable.md, "Cuts").
ZOOM_CUT = 0.18
#: The trimmed fits (the alignment's and the camera's): the share of pixels kept each round, and how many refits.
KEEP = 0.75
REFITS = 2
#: Offline, where the flow is fast it is less exact: the carry falls to half at this speed
#: (thumbnail pixels a frame), so what moves follows its own frame and does not lag. Live the
#: carry does not fall with speed: `alignment.keep_shape` bounds a moving subject's lag frame by
#: frame there, and a falloff with speed would cut the carry on every pixel of a panning picture,
#: so the map would flicker there (`tests/test_stable.py`, `test_a_pan_holds_live_and_what_moves_keeps_its_shape`).
MOVE_PX = 6.0
#: Where the previous frame warped by the flow differs from this one by this much (grey,
#: 0-255), the previous map is trusted half as much (see `_trust`).
MISMATCH = 16.0
#: Live: a pixel whose flow is this far from the camera's (thumbnail pixels a frame) moves on its
#: own, and its carry falls towards OWN_FLOOR of what it is otherwise (a sharp knee, so the flow's
#: own noise leaves the background still); the camera's motion is fitted on about CAMERA_PIXELS.
OWN_PX = 1.0
OWN_FLOOR = 0.5
CAMERA_PIXELS = 1024


def thumbnail_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) of a frame's thumbnail: its aspect kept, inside THUMB_WIDTH x THUMB_HEIGHT.

    Why both sides: the thumbnail's size comes from the frame's aspect, and a
    hostile strip's aspect is anything; inside the box, the thumbnail (and the
    flow and trust measured at its size) has at most 102,400 pixels whatever
    the frame's shape. A frame smaller than the box is scaled up to it, as the
    flow's units (CONSISTENT_PX, OWN_PX, MOVE_PX) are thumbnail pixels.
    """
    scale = min(THUMB_WIDTH / width, THUMB_HEIGHT / height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The image at `thumbnail_size` (its aspect kept), BGR: every k-th pixel to about twice the size, then area.

    About 0.1 ms for a 1920x1080 image, where one bilinear or area resize of it
    costs 1 ms or more; the last halving by area keeps the aliasing that would
    throw the flow off.
    """
    h, w = image.shape[:2]
    tw, th = thumbnail_size(w, h)
    step = min(w // (2 * tw), h // (2 * th))
    if step >= 2:
        image = _every(image, step)
    small = cv2.resize(image, (tw, th), interpolation=cv2.INTER_AREA)
    if small.dtype != np.uint8:  # 16-bit or float frames (EXR, 16-bit TIFF): the flow and HSV want 8 bits
        top = 65535.0 if small.dtype == np.uint16 else 1.0
        small = np.clip(np.nan_to_num(small.astype(np.float32)) * np.float32(255 / top), 0, 255).astype(np.uint8)
    if small.ndim == 2:
        return cv2.cvtColor(small, cv2.COLOR_GRAY2BGR)
    return small if small.shape[2] == 3 else np.ascontiguousarray(small[:, :, :3])


def _every(image: np.ndarray, step: int) -> np.ndarray:
    """image[::step, ::step], contiguous: by OpenCV's nearest-neighbour resize where it can.

    Why: numpy's strided copy of a 1080p frame takes 0.3-0.6 ms, OpenCV's
    0.08-0.13 ms, on every frame live and offline. OpenCV picks the same pixels
    only where the size divides by `step`, so the last column and row of a size
    that does not are taken by numpy, and the result is the same to the bit.
    """
    h, w = image.shape[:2]
    fh, fw = h // step, w // step
    rows_whole = image.ndim == 2 or (image.ndim == 3 and image.shape[2] <= 4 and image.strides[1] == image.strides[2] * image.shape[2])
    if not rows_whole or image.strides[image.ndim - 1] != image.itemsize or image.dtype not in _DECIMATED:
        return np.ascontiguousarray(image[::step, ::step])
    out = cv2.resize(image[: fh * step, : fw * step], (fw, fh), interpolation=cv2.INTER_NEAREST)
    if out.ndim < image.ndim:  # one channel comes back without its axis
        out = out[..., None]
    if fw * step < w:
        out = np.concatenate([out, image[: fh * step : step, fw * step : fw * step + 1]], axis=1)
    if fh * step < h:
        out = np.concatenate([out, image[fh * step :: step, ::step]], axis=0)
    return out


_DECIMATED = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))
_flow = threading.local()


#: The flows by use: (preset, finest level, variational refinement iterations; None: the preset's own).
FLOWS = {
    "live": (LIVE_PRESET, FLOW_SCALE, LIVE_REFINEMENT),
    "cut": (CUT_PRESET, CUT_FLOW_SCALE, LIVE_REFINEMENT),
    "offline": (BATCH_PRESET, FLOW_SCALE, None),
}


def _dis(kind: str) -> Any:
    """One DIS instance of each kind (`FLOWS`) per thread (it keeps buffers; the worker threads measure at once)."""
    dis = getattr(_flow, kind, None)
    if dis is None:
        preset, level, refinement = FLOWS[kind]
        dis = cv2.DISOpticalFlow_create(preset)
        dis.setFinestScale(level)
        if refinement is not None:
            dis.setVariationalRefinementIterations(refinement)
        setattr(_flow, kind, dis)
    return dis


@functools.lru_cache(maxsize=8)
def grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
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
    #: The other way: where each pixel of the previous frame went (the forward-backward check).
    forward: np.ndarray
    #: How far the previous map, carried along `backward`, is trusted at each pixel (0..1,
    #: float32; see `_trust`).
    trust: np.ndarray
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
    #: own (its flow is not the camera's, see `_camera_fit`): the daemon's motion segmentation.
    still: np.ndarray | None = None
    #: Offline (the planner's backward pass): where the previous frame's pixels, carried along
    #: `forward`, are trusted on the previous frame; what `trust` is the other way.
    forward_trust: np.ndarray | None = None
    #: How much the camera's motion scales the picture from the previous frame to this one (the
    #: log of its scale; > 0 in, < 0 out): a punch-in or -out when ZOOM_CUT or more.
    zoom: float = 0.0

    @property
    def failure(self) -> float:
        """How badly the flow explains this frame, whatever changed: the geometric mean of the two units."""
        return float(np.sqrt(self.inconsistent / CUT_INCONSISTENT * self.residual / CUT_RESIDUAL))

    @property
    def score(self) -> float:
        """The cut score: 1 or more, the flow cannot explain this frame (see the module's notes)."""
        if self.content < CUT_CONTENT:
            return 0.0
        if self.from_flat:
            return 2.0  # nothing of a flat frame's map belongs to the picture after it
        if abs(self.zoom) >= ZOOM_CUT:
            return 2.0  # a reframe in one frame: the editor cut to a closer or wider take
        return self.failure


def measure(before: np.ndarray, after: np.ndarray, *, live: bool = False) -> Motion | None:
    """The motion from thumbnail `before` to `after` (None if either is unknown, they differ in size,
    or a side is under MIN_FLOW_SIDE: the flow cannot be measured there).

    `live`: the daemon's (with the motion segmentation, `Motion.still`); else the
    planner's (with the trust the other way, `Motion.forward_trust`, for its backward
    pass). Each leaves out what only the other uses: about 0.5 ms a frame either way.
    Live, a frame that may be a cut is judged on a coarser flow first (CUT_PRESET).
    """
    if before.size == 0 or after.size == 0 or before.shape != after.shape or min(before.shape[:2]) < MIN_FLOW_SIDE:
        return None
    g0 = cv2.cvtColor(before, cv2.COLOR_BGR2GRAY)
    g1 = cv2.cvtColor(after, cv2.COLOR_BGR2GRAY)
    h0 = cv2.cvtColor(before, cv2.COLOR_BGR2HSV)
    h1 = cv2.cvtColor(after, cv2.COLOR_BGR2HSV)
    content = float(cv2.absdiff(h0, h1).mean())
    if live and content >= CUT_CONTENT:
        judged = _measured(g0, g1, content, "cut")
        if judged.score >= 1.0:
            return judged
    return _measured(g0, g1, content, "live" if live else "offline")


def _measured(g0: np.ndarray, g1: np.ndarray, content: float, kind: str) -> Motion:
    """`measure` with the flow of `kind` (`FLOWS`) between the grey thumbnails, their content change known."""
    live = kind != "offline"
    dis = _dis(kind)
    forward = dis.calc(g0, g1, None)
    backward = dis.calc(g1, g0, None)
    h, w = g1.shape
    gx, gy = grid(h, w)
    mx, my = gx + backward[..., 0], gy + backward[..., 1]
    consistent = _checked(backward, forward, mx, my)
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
    trust = _trust(backward, consistent, mismatch, fast=not live)
    fit = _camera_fit(backward, consistent)
    still = forward_trust = None
    if live:
        own = backward - _fitted(fit, h, w)
        own = np.square(own[..., 0]) + np.square(own[..., 1])
        own *= np.float32(1 / OWN_PX**2)
        np.square(own, out=own)
        own += 1
        still = np.reciprocal(own)
        still *= np.float32(1 - OWN_FLOOR)
        still += np.float32(OWN_FLOOR)
    else:
        fx, fy = gx + forward[..., 0], gy + forward[..., 1]
        ahead = cv2.remap(g1, fx, fy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        forward_trust = _trust(forward, _checked(forward, backward, fx, fy), cv2.absdiff(ahead, g0))
    return Motion(
        backward, consistent, forward, trust, inconsistent, residual, content, c0 < FLAT <= c1, still, forward_trust, _zoom(fit)
    )


def _camera_fit(flow: np.ndarray, consistent: np.ndarray) -> np.ndarray:
    """The camera's share of `flow`: an affine motion fitted to the consistent pixels, trimmed twice.

    A pan, a push-in or a handheld shake moves the whole picture as one; what
    is left over is parallax and what moves on its own (`Motion.still`), and
    its scale is the zoom (`Motion.zoom`). Returns the fit, flow = [x, y, 1] @ coef
    (3x2, float64), made on about CAMERA_PIXELS; `_fitted` draws it.
    """
    h, w = consistent.shape
    gx, gy = grid(h, w)
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
    return coef


def _fitted(coef: np.ndarray, h: int, w: int) -> np.ndarray:
    """The affine flow `coef` at every pixel of an h x w thumbnail (h, w, 2), float32."""
    gx, gy = grid(h, w)
    c = coef.astype(np.float32)
    fitted = np.empty((h, w, 2), np.float32)
    fitted[..., 0] = gx * c[0, 0] + gy * c[1, 0] + c[2, 0]
    fitted[..., 1] = gx * c[0, 1] + gy * c[1, 1] + c[2, 1]
    return fitted


def _zoom(coef: np.ndarray) -> float:
    """The log of the camera's scale from the previous frame to this one (see `Motion.zoom`).

    The fit is of the backward flow: a pixel at x was at x + f(x), so the
    previous frame's picture is (1 + df/dx) times this one's, per axis.
    """
    area = (1.0 + coef[0, 0]) * (1.0 + coef[1, 1])
    return float(-0.5 * np.log(area)) if area > 1e-6 else 0.0


def _trust(flow: np.ndarray, consistent: np.ndarray, mismatch: np.ndarray, *, fast: bool = True) -> np.ndarray:
    """How far a neighbour's map carried along `flow` may be trusted at each pixel (see `Motion.trust`).

    0 off `consistent`; where the neighbour warped by the flow does not look
    like the pixel (MISMATCH, grey levels), less: the flow is wrong there, or the
    pixel has just come into view beside a moving subject, so the map there
    takes the new prediction instead of keeping where the subject was. `fast`
    (offline): less where the flow is fast too (MOVE_PX: it is less exact there).
    """
    m = mismatch.astype(np.float32)
    m *= np.float32(1 / MISMATCH)
    np.square(m, out=m)
    m += 1
    if fast:
        speed = np.square(flow[..., 0]) + np.square(flow[..., 1])
        speed *= np.float32(1 / MOVE_PX**2)
        speed += 1
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
