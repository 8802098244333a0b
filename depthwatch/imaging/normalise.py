"""Step 1 of the render chain: a raw prediction -> a [0, 1] map where 1 = nearest.

Pure and per frame. Whatever the model's convention (inverse depth: larger =
nearer; metric depth: larger = farther), what leaves here is nearness, at the
model's resolution, before any invert or levels. `output.normalise: frame`
is exactly `frame()`; `stable` (see `stabilise`) aligns each prediction to the
shot so far and falls back to `frame()` for the first map of every shot.
"""

from __future__ import annotations

import numpy as np

from depthwatch.model.profiles import INVERSE_DEPTH

FRAME = "frame"
STABLE = "stable"
MODES = (STABLE, FRAME)


def nearness(prediction: np.ndarray, output_kind: str) -> np.ndarray:
    """The prediction as float32 with larger = nearer, non-finite values as 0.

    Metric depth is negated, not inverted: the per-frame map is linear in depth,
    and the stable path must share its tone curve (see `stabilise`).
    """
    d = np.nan_to_num(prediction.astype(np.float32, copy=False), nan=0.0, posinf=0.0, neginf=0.0)
    return d if output_kind == INVERSE_DEPTH else np.negative(d)


def frame(prediction: np.ndarray, output_kind: str, clip_percent: tuple[float, float] | None = None) -> np.ndarray:
    """Each map on its own: (x - lo) / (hi - lo) with lo, hi the min and max (or percentiles).

    Guarded for a flat map (all 0). The classic Flask example's 255 / max * (x - min)
    divides by the maximum instead of the range and wraps in uint8 when min < 0;
    this does neither.
    """
    d = np.nan_to_num(prediction.astype(np.float32, copy=False), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = bounds(d, clip_percent)
    span = hi - lo
    if not span > 1e-12 * max(1.0, abs(hi)):
        return np.zeros_like(d)
    n = np.clip((d - lo) * np.float32(1 / span), 0.0, 1.0)
    return n if output_kind == INVERSE_DEPTH else 1.0 - n


def bounds(values: np.ndarray, clip_percent: tuple[float, float] | None) -> tuple[float, float]:
    """The range a map is stretched over: min and max, or the `clip_percent` percentiles."""
    if clip_percent:
        lo, hi = (float(v) for v in np.percentile(values, clip_percent))
        return lo, hi
    return float(values.min()), float(values.max())
