"""Edge-aware upsampling: the model's low-resolution map brought up to the frame, guided by it.

A depth model sees 224-384 px; the frame has 1920 or 3840. A plain bilinear
upscale turns every object outline into a ramp tens of pixels wide, which a
lens blur or fog matte shows as a halo. Here the depth edges are moved onto
the image's own edges with the fast guided filter (He & Sun 2015, "Fast
Guided Filter", after He, Sun & Tang's guided filter): per window, the map is
modelled as `a * I + b` of the grey guide `I`; `a` and `b` are fitted by box
filters (OpenCV's core `boxFilter`) on the prediction's own grid, where all
its information lives, then upsampled and applied to the guide at its larger
size, so the map's steps follow the guide's edges.

Why this filter and these numbers, measured on the real FastDepth model and
the Middlebury motorcycle at twice the photo's size (1482x1000 JPEG): gradient
energy at ground-truth depth edges relative to elsewhere, as a multiple of the
plain upscale's; Spearman to the ground-truth disparity; Pearson to the plain
upscale; time for the step on a loaded 2-core VM:

    guided filter, guide at 1/4 decode (371x250), r 2, eps 1e-3: 1.93x, 0.768, 0.999, ~2 ms
    guided filter, guide at full decode (1482x1000), same:        1.75x, 0.769, 0.999, ~15 ms
    guided filter, r 4 / r 8 (eps 1e-3), 1/4 decode:              1.72x / 1.67x (Spearman 0.767 / 0.762)
    guided filter, eps 1e-2 (r 2), 1/4 decode:                    1.69x
    joint bilateral upsampling (numpy, 5x5, sigma_r 0.05), 1/4:   1.74x, 0.769, 0.9997, ~40 ms
    joint bilateral upsampling with a 1080p guide:                ~1400 ms
    plain bilinear upscale:                                       1.00x, 0.768

So: the guided filter (linear time, box filters only, no contrib build) with
radius 2 (in prediction pixels) and eps 1e-3 (guide in [0, 1]). A guide
larger than the prediction by more than about twice adds cost and no measured
edge quality, so the guide is the decoded frame as the pipeline already has it
(JPEGs decode at 1/2..1/8 scale when the model needs far fewer pixels), or a
full decode (PNG, TIFF) reduced by a whole factor towards GUIDE_SCALE times
the prediction's short side; the refined map comes back at the guide's size
and is levelled, quantised and upscaled like an unrefined one. Through the
whole pipeline (tests/test_refine.py): 2.15x for the JPEG, 1.88x for a PNG of
the same frame, Spearman unchanged. On one core the step takes about 1.3 ms
for a 1080p or 4K JPEG frame, 3-10 ms with a full-size guide (see
`python -m benchmarks.refine`). A flat map stays flat (a = 0 where the map
does not vary), so no depth edges are invented in flat regions.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

#: Box radius, in pixels of the prediction's grid.
RADIUS = 2
#: Regularisation: larger keeps the map smoother where the guide's contrast is low.
EPS = 1e-3
#: The guide is used at most this many times the prediction's short side.
GUIDE_SCALE = 2


def guide_for(image: np.ndarray, prediction_shape: tuple[int, int]) -> np.ndarray:
    """The grey guide in [0, 1], reduced by a whole factor to about GUIDE_SCALE x the prediction's size.

    A whole factor keeps OpenCV's area reduction on its fast path (a plain block
    mean, ~15x faster than an arbitrary scale); the reduced guide is at most a
    factor's rounding away from the frame's aspect, as a reduced JPEG decode is.
    """
    grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    factor = min(grey.shape) // (GUIDE_SCALE * min(prediction_shape))
    if factor >= 2:
        grey = cv2.resize(grey, None, fx=1 / factor, fy=1 / factor, interpolation=cv2.INTER_AREA)
    top = 65535.0 if grey.dtype == np.uint16 else 255.0
    return grey.astype(np.float32) * np.float32(1 / top)


@dataclass(frozen=True)
class Guide:
    """The filter's half that needs only the frame: the grey guide and its window statistics.

    Why apart: the pipeline makes it on a worker while the model runs (see
    `render.ahead`), so a frame on its own does not wait for it after inference.
    Made for one prediction grid (`grid`, rows and columns) and one radius.
    """

    grid: tuple[int, int]
    radius: int
    #: The grey guide in [0, 1] at its working size (`guide_for`).
    full: np.ndarray
    #: The guide at the grid the fit is made on, and its window mean and variance there.
    fit: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def guide(image: np.ndarray, grid: tuple[int, int], radius: int = RADIUS) -> Guide:
    """`image`'s guide for refining a prediction of `grid` (rows, columns)."""
    full = guide_for(image, grid)
    gh, gw = full.shape
    lh, lw = grid
    if lh * lw > gh * gw:  # a guide smaller than the prediction: fit at the guide's size
        lh, lw = gh, gw
    fit = cv2.resize(full, (lw, lh), interpolation=cv2.INTER_AREA)
    ksize = (2 * radius + 1, 2 * radius + 1)
    mean = cv2.boxFilter(fit, -1, ksize)
    var = cv2.sqrBoxFilter(fit, cv2.CV_32F, ksize) - mean * mean
    return Guide(tuple(grid), radius, full, fit, mean, var)  # type: ignore[arg-type]


def edges(
    nearness: np.ndarray, image: np.ndarray, *, radius: int = RADIUS, eps: float = EPS, prepared: Guide | None = None
) -> np.ndarray:
    """`nearness` (float32, prediction grid) refined along `image`'s edges, at the guide's size.

    The result is float32 in [0, 1] with the guide's aspect; the caller scales
    it to the frame (the guide may be a reduced decode of it). `prepared`:
    `guide(image, ...)` made beforehand; made here when it is missing or was
    made for another grid or radius.
    """
    g = prepared
    if g is None or g.grid != nearness.shape or g.radius != radius:
        g = guide(image, nearness.shape, radius)
    gh, gw = g.full.shape
    lh, lw = g.fit.shape
    p = nearness.astype(np.float32, copy=False)
    if p.shape != (lh, lw):
        p = cv2.resize(p, (lw, lh), interpolation=cv2.INTER_AREA)
    ksize = (2 * radius + 1, 2 * radius + 1)
    mean_p = cv2.boxFilter(p, -1, ksize)
    cov_ip = cv2.boxFilter(g.fit * p, -1, ksize) - g.mean * mean_p
    a = cov_ip / (g.var + np.float32(eps))
    b = mean_p - a * g.mean
    a = cv2.boxFilter(a, -1, ksize)
    b = cv2.boxFilter(b, -1, ksize)
    if (lw, lh) != (gw, gh):
        a = cv2.resize(a, (gw, gh), interpolation=cv2.INTER_LINEAR)
        b = cv2.resize(b, (gw, gh), interpolation=cv2.INTER_LINEAR)
    q = cv2.multiply(a, g.full)
    cv2.add(q, b, dst=q)
    return np.clip(q, 0.0, 1.0, out=q)
