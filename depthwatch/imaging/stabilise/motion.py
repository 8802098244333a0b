"""Motion and cuts: how one frame follows the one before, measured on colour thumbnails.

Why its own module: the flow, its forward-backward check, the per-pixel trust
and the camera's share of the motion are what both the daemon's Stabiliser and
the offline planner build on, and the cut test (live on the frame itself,
offline with look-ahead) is made of the same measures.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
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
#: 160 wide ends the process (a segmentation fault, OpenCV 5.1). From 16 up every flow
#: of `FLOWS` was seen to hold, at any length up to 5000.
MIN_FLOW_SIDE = 16
#: The flow (OpenCV's DIS) is measured down to the thumbnail itself (DIS's finest pyramid level 0),
#: live and offline. Offline: the planner's two passes carry every map along the flow twice, so a
#: flow twice as fine on a walker's limbs and a car's edges shows twice. On twenty-nine real clips,
#: with the floor (0.9625 then) and planner.BATCH_RAMP chosen with it: every clip inside the batch
#: targets (worst warp error 0.229x, lowest median and worst tenth on moving pixels 0.953 and 0.885;
#: were 0.229x, 0.936 and 0.868 at half the thumbnail). The planner's cost a frame at 1080p: 8.5 ->
#: 13.0 ms (docs/stable.md, "The planner's flow at the thumbnail"). Live too (see LIVE_PRESET): at
#: half the thumbnail (80 pixels wide) the live flow did not see what moves on a few pixels only,
#: leaves stirring in a tree (OpenCV's tree.avi: the moving pixels' worst tenth 0.865 live).
FLOW_SCALE = 0
#: Offline: the medium preset (larger patches, more iterations), with its variational refinement:
#: the planner's narrower agreement and backward pass were tuned on the refined flow.
BATCH_PRESET = cv2.DISOPTICAL_FLOW_PRESET_MEDIUM
#: Live: the fast preset, without the variational refinement (LIVE_REFINEMENT). The medium preset at
#: the whole thumbnail would double the stabiliser's cost a frame (3.6 -> 6.9 ms at 1080p); the fast
#: one adds 1.5-1.7 ms to the followed-shot path (3.4 -> 5.0 ms; CPU 6.0 -> 9.0, OpenCV runs DIS on
#: every core), 1.4-1.6 ms over the stabiliser as issue #34 was filed, which allows 2 ms
#: (`benchmarks.stable.per_frame`: 3.5 ms then, on the same machine). Against the medium preset
#: at half the thumbnail, on thirty-two real clips and five more no setting was chosen on (OpenCV's
#: samples): the worst live warp error 0.313x -> 0.300x of the bare model's, the lowest worst tenth on
#: moving pixels 0.894 -> 0.910 (the tree 0.865 -> 0.886), the lowest median 0.956 -> 0.956; the cuts
#: found are the same (docs/stable.md, "The live flow at the whole thumbnail").
LIVE_PRESET = cv2.DISOPTICAL_FLOW_PRESET_FAST
#: Live, a frame that may be a cut (its content changed by CUT_CONTENT or more: under it, nothing is a
#: cut) is judged first on the coarser flow the live cut test used until LIVE_PRESET came: the medium
#: preset at half the thumbnail (DIS's level 1), unrefined. A cut needs no flow to follow, so only a
#: frame that is no cut pays for the finer one: a cut frame costs what it did (the editor jumping from
#: shot to shot waits at each one: 1.9 ms a 1080p frame, 3.4 with the finer flow); the 3.9% of
#: frames that change that much without a cut (fast pans, on 37 real clips) pay both, about 0.8 ms
#: more. The cuts found and every map are the same either way (`benchmarks.cuts`, the 37 clips):
#: this is cost alone (docs/stable.md, "The live flow at the whole thumbnail").
CUT_FLOW_SCALE = 1
CUT_PRESET = cv2.DISOPTICAL_FLOW_PRESET_MEDIUM
#: Live, without the variational refinement at each level (the preset's 5 iterations): it is about
#: half the flow's cost, and live the maps are as good without it (docs/stable.md, "The live flow at
#: half the thumbnail").
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
#: about 0.1 a frame; within a shot real footage here keeps under 0.12, docs/stable.md "Punch-ins").
ZOOM_CUT = 0.18
#: Offline: frames looked at on each side, and how far a cut's score must stand above theirs.
LOOKAHEAD = 2
STAND_OUT = 2.0
#: Offline: a frame just under the live threshold that stands out this well is a cut too.
BATCH_SCORE = 0.8
#: Offline: a jump cut (the same set-up a moment later: an interview trimmed, a take shortened)
#: keeps the colours and much of the picture, so it scores under a cut; but the flow fails on
#: that one frame far more than on the frames around it, where motion fails it on a run of
#: frames. A frame whose `Motion.failure` is JUMP_FAILURE or more (the planner's own floor since
#: its flow became finer: BATCH_JUMP_FAILURE) and JUMP_STAND_OUT times the mean of its LOOKAHEAD
#: neighbours' on each side is a cut. Chosen on real footage (the edits of
#: benchmarks.cuts and the clips of benchmarks.stable, about 6,000 frames): the jumps fail 0.13 or
#: more and stand out 2.6-13x; nothing else failing 0.12 or more stands out over 2.2x (under the
#: floor, frames that hardly fail stand out up to 3.0x). `python -m benchmarks.cuts --jumps`;
#: docs/stable.md, "Jump cuts". Live a jump is no cut (see `is_new_picture` and JUMP_LIVE).
JUMP_FAILURE = 0.12
JUMP_STAND_OUT = 2.4
#: The planner's own floor, since its flow is finer (the thumbnail itself, refined) and fails less: one jump of
#: benchmarks.cuts' failed 0.111 with it (0.131 at half the thumbnail). With 0.10 the jumps found are
#: as before, and nothing else failing 0.10 or more stands out over 2.03x (was 2.15x at 0.12).
BATCH_JUMP_FAILURE = 0.10
#: Live, with no frame after to compare: a frame (JUMP_FAILURE or more) whose residual and whose
#: failure are both JUMP_LIVE times the median of the shot's last JUMP_HISTORY frames' (at least
#: JUMP_KNOWN of them) jumped (`is_jump`): an edit's jump cut, or an editor scrubbing to another
#: moment. The daemon cannot tell which, so it keeps the shot and its tone curve and only carries
#: nothing of the last map into that frame's (live.Stabiliser.map).
JUMP_LIVE = 4.0
JUMP_HISTORY = 8
JUMP_KNOWN = 4
#: The trimmed fits (the alignment's and the camera's): the share of pixels kept each round, and how many refits.
KEEP = 0.75
REFITS = 2
#: Offline, where the flow is fast it is less exact: the carry falls to half at this speed
#: (thumbnail pixels a frame), so what moves follows its own frame and does not lag. Live the
#: carry does not fall with speed: `alignment.keep_shape` bounds a moving subject's lag frame by
#: frame there, and the falloff also cut the carry on every pixel of a panning picture. Without it
#: (with alignment.CARRY 0.99 and the floor judged on the pixels the flow follows both ways), on
#: twenty-nine real clips and three street shots at 320x180, the worst live warp error 0.343x ->
#: 0.316x of the bare model's, the lowest median and worst tenth on moving pixels 0.930 / 0.862 ->
#: 0.954 / 0.887 (docs/stable.md, "The live carry on a panning picture").
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


def is_new_picture(before: np.ndarray, after: np.ndarray, motion: Motion | None) -> bool:
    """The daemon's cut test: the flow cannot explain the frame, or it is another size (another clip).

    Decided on the frame itself. A jump cut is not one here: the daemon cannot tell an edit's jump
    from an editor scrubbing to another moment of the shot, where the shot's tone curve must hold;
    `is_jump` lets the frame keep the shot and carry nothing instead. With no image to compare
    (either thumbnail empty), the shot goes on.
    """
    if motion is None:
        return before.size > 0 and after.size > 0
    return motion.score >= 1.0


def is_jump(motion: Motion, recent: Sequence[tuple[float, float]]) -> bool:
    """Live: the flow fails on this frame far more than it did on the shot's last frames (see JUMP_LIVE).

    `recent`: (residual, failure) of the shot's frames before this one, oldest first.
    """
    recent = recent[-JUMP_HISTORY:]
    if len(recent) < JUMP_KNOWN or motion.failure < JUMP_FAILURE:
        return False
    residual = float(np.median([r for r, _f in recent]))
    failure = float(np.median([f for _r, f in recent]))
    return motion.residual >= JUMP_LIVE * residual and motion.failure >= JUMP_LIVE * failure


def is_cut(motions: Mapping[int, Motion | None], t: int) -> bool:
    """Offline: frame t starts a shot, given the motions of the frames around it (by index; None: no flow).

    A frame the daemon would call a cut (1 or more) is one here too, so a run
    of unrelated stills is a run of cuts. One that nearly is (BATCH_SCORE or
    more) is a cut if it stands out STAND_OUT times above the mean of the
    LOOKAHEAD frames on each side: a cut is one frame the flow cannot explain,
    where fast motion makes several in a row. And a jump cut, whose content
    hardly changes, is one whose flow fails JUMP_STAND_OUT times more than
    its neighbours' (BATCH_JUMP_FAILURE or more).
    """
    motion = motions.get(t)
    if motion is None:
        return False
    s = motion.score
    if s >= 1.0:
        return True
    if s >= BATCH_SCORE and s >= STAND_OUT * _mean_around(motions, t, "score"):
        return True
    failure = motion.failure
    return failure >= BATCH_JUMP_FAILURE and failure >= JUMP_STAND_OUT * _mean_around(motions, t, "failure")


def failure_stand_out(motions: Mapping[int, Motion | None], t: int) -> float:
    """How many times more the flow fails on frame t than on its LOOKAHEAD neighbours each side (what
    JUMP_STAND_OUT is a line on; inf where they do not fail at all, 0 where t has no motion)."""
    motion = motions.get(t)
    if motion is None:
        return 0.0
    mean = _mean_around(motions, t, "failure")
    return motion.failure / mean if mean > 0 else float("inf")


def _mean_around(motions: Mapping[int, Motion | None], t: int, measure_: str) -> float:
    """The mean `score` or `failure` of the LOOKAHEAD frames on each side of t that have a motion (0 if none)."""
    around = [getattr(m, measure_) for i in range(t - LOOKAHEAD, t + LOOKAHEAD + 1) if i != t and (m := motions.get(i)) is not None]
    return float(np.mean(around)) if around else 0.0
