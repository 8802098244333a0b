"""What went wrong on the inference thread, in one line: a prediction that is no depth map, an exception.

The engine completes every future it is given, with a result or with one of
these lines; an error of depthwatch's own also has its traceback logged.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence

import numpy as np

from depthwatch.errors import DepthwatchError
from depthwatch.model import providers

log = logging.getLogger("depthwatch.model.engine")

#: What to do about a model file that onnxruntime cannot load.
FIX_MODEL = "; the file is damaged or not an ONNX model: fetch it again or point model.path at a working .onnx file"


class EngineStopped(DepthwatchError):
    """Work was handed to an engine that has stopped (or never loaded)."""


def unusable(prediction: np.ndarray, tensor: np.ndarray | None = None, applied: Sequence[str] = ()) -> str | None:
    """Why a prediction is no depth map, in one line, or None: checked as it leaves the engine.

    Cheap at model resolution (a few hundred thousand values): finite
    everywhere, and more than one value unless the input `tensor` was one
    flat colour (a black frame in a fade may well get a flat map).
    """
    finite = np.isfinite(prediction)
    if not finite.all():
        bad = int(prediction.size - np.count_nonzero(finite))
        where = f" on {applied[0]}" if applied and applied[0] != providers.CPU else ""
        return (
            f"the model returned NaN or infinite values ({bad} of {prediction.size}; a float16 overflow{where}?); "
            "no map written"
        )
    if prediction.size == 0:
        return "the model returned an empty map; no map written"
    low, high = float(prediction.min()), float(prediction.max())
    if not high > low and (tensor is None or tensor.min() != tensor.max()):
        return f"the model returned the same value ({low:g}) at every pixel of a frame that is not one flat colour; no map written"
    return None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type where it has none), at most 300 characters."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def internal(what: str, exc: BaseException) -> str:
    """One line for an error of depthwatch's own (not the model's, not the frame's), its traceback logged."""
    log.error("internal error %s: %s\n%s", what, first_line(exc), "".join(traceback.format_exception(exc)).rstrip())
    return f"internal error {what}: {type(exc).__name__}: {first_line(exc)}"
