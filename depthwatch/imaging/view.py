"""From an EXR's float pixels to the 8-bit display picture a depth model was trained on.

EXR frames from a renderer or a colourist are scene-linear: 0.18 is mid grey,
a lamp or a specular highlight is 5 or 50. A model trained on photographs
(display-referred, sRGB) sees such a frame, fed raw, as dark and flat, and
clipping at 1 would flatten every highlight to one white. So the view
transform is the sRGB curve (IEC 61966-2-1; Rec.709's is within a few levels
of it) after a soft shoulder: linear up to `KNEE`, then rolled off towards 1
(with the same slope at the knee, so no band shows), never reaching it. Frames already display-referred (`input.exr_colour: display`)
are only clipped to [0, 1].

Both transforms run as one table lookup on half-float bit patterns (65,536
entries): a float frame is rounded to half first (11 significant bits, far
more than the 8 that come out), which makes a 1080p frame a few milliseconds
of work instead of a power function per pixel. The same table sends NaN to
black, -Inf to black and +Inf to white: every pixel the model sees is finite.
"""

from __future__ import annotations

import functools

import numpy as np

LINEAR, DISPLAY = "linear", "display"
#: Scene-linear values above this are rolled off towards 1 (display white) instead of clipped.
KNEE = 0.8


def rolled_off(x: np.ndarray) -> np.ndarray:
    """Linear to KNEE, then a smooth shoulder approaching 1: values above 1 stay apart.

    The shoulder is Reinhard's t / (1 + t) on the part above the knee: slope 1
    at the knee (no band), 1.0 lands at 0.9, 2 at 0.97, 10 at 0.996, and its
    slow tail keeps highlights of 5 or 10 apart instead of one flat white.
    """
    x = np.maximum(np.asarray(x, np.float64), 0.0)
    room = 1.0 - KNEE
    with np.errstate(invalid="ignore"):  # +Inf: inf / inf, replaced by its limit, 1
        t = (x - KNEE) / room
        return np.where(x <= KNEE, x, np.where(np.isposinf(x), 1.0, KNEE + room * t / (1.0 + t)))


def srgb_encode(x: np.ndarray) -> np.ndarray:
    """The sRGB transfer curve, linear [0, 1] to display [0, 1]."""
    x = np.clip(np.asarray(x, np.float64), 0.0, 1.0)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)


def srgb_decode(v: np.ndarray) -> np.ndarray:
    """The inverse: display [0, 1] to linear light (for tests and for making linear frames)."""
    v = np.clip(np.asarray(v, np.float64), 0.0, 1.0)
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


@functools.lru_cache(maxsize=2)
def _table(colour: str) -> np.ndarray:
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = np.isnan(halves)
        halves = np.where(bad, 0.0, halves)  # NaN: black; +-Inf are handled by the curves
        shown = srgb_encode(rolled_off(halves)) if colour == LINEAR else np.clip(halves, 0.0, 1.0)
    shown = np.where(np.isposinf(halves), 1.0, shown)
    return np.round(shown * 255.0).astype(np.uint8)


def to_display(channels: np.ndarray, colour: str) -> np.ndarray:
    """uint8 pixels (same shape) for float or half `channels` in `colour` (LINEAR or DISPLAY)."""
    with np.errstate(over="ignore"):  # beyond half's range: +-Inf, which the table maps
        halves = np.ascontiguousarray(channels, dtype=np.float16)
    return _table(colour)[halves.view(np.uint16)]


def count_not_finite(channels: np.ndarray) -> int:
    """How many values are NaN or infinite (the frame's line says so: they were replaced)."""
    return int(channels.size - np.count_nonzero(np.isfinite(channels)))
