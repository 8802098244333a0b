"""A model's input/output contract, read from its graph rather than assumed.

MiDaS exports take float NCHW, quantised models take uint8 NHWC, Depth
Anything has dynamic height and width, and outputs come as [1,H,W], [1,1,H,W]
or [1,H,W,1]. Reading this from the session lets any of them run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from depthwatch.errors import ModelError

if TYPE_CHECKING:
    from depthwatch.model.profiles import Profile

NCHW, NHWC = "NCHW", "NHWC"

#: A frame's long side goes to the model at most this many times the profile's side: a frame up
#: to 8:1 (panoramas included) keeps its aspect with its short side at the side; a longer strip
#: fits this box instead, so its tensor (and the prediction, the refine guide's grid and the maps
#: made at its size) stays bounded whatever the frame's shape (`model_input_size`).
MAX_ASPECT = 8

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
}


@dataclass(frozen=True)
class Contract:
    input_name: str
    input_dtype: type
    layout: str
    #: Fixed input height and width, or None where the graph leaves them dynamic.
    height: int | None
    width: int | None
    output_name: str
    output_shape: tuple[Any, ...]

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """(width, height) when the graph fixes both, else None."""
        if self.height is None or self.width is None:
            return None
        return self.width, self.height

    def describe(self) -> str:
        size = f"{self.width}x{self.height}" if self.fixed_size else "dynamic size"
        dtype = np.dtype(self.input_dtype).name
        shape = "x".join(str(d) for d in self.output_shape)
        return (
            f"input {self.input_name!r} {dtype} {self.layout} {size} -> "
            f"output {self.output_name!r} [{shape}]"
        )


def _dim(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def read_contract(session: Any) -> Contract:
    """Read the contract from an onnxruntime session; ModelError if it is no depth model."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1:
        raise ModelError(f"the model has {len(inputs)} inputs; a depth model takes one image")
    if not outputs:
        raise ModelError("the model has no outputs")
    inp, out = inputs[0], outputs[0]
    dtype = _DTYPES.get(inp.type)
    if dtype is None:
        raise ModelError(f"input {inp.name!r} has type {inp.type}; expected float, float16 or uint8")
    shape = list(inp.shape)
    if len(shape) != 4:
        raise ModelError(f"input {inp.name!r} has shape {shape}; expected a 4-d image batch")
    if shape[1] == 3:
        layout, h, w = NCHW, shape[2], shape[3]
    elif shape[3] == 3:
        layout, h, w = NHWC, shape[1], shape[2]
    else:
        raise ModelError(f"input {inp.name!r} has shape {shape}; no axis of 3 colour channels")
    out_shape = tuple(out.shape)
    if len(out_shape) not in (2, 3, 4):
        raise ModelError(f"output {out.name!r} has shape {list(out_shape)}; expected a depth map")
    return Contract(inp.name, dtype, layout, _dim(h), _dim(w), out.name, out_shape)


def depth_map(output: np.ndarray) -> np.ndarray:
    """The [H, W] map inside a [1,H,W], [1,1,H,W], [1,H,W,1] or [H,W] output."""
    while output.ndim > 2 and output.shape[0] == 1:
        output = output[0]
    if output.ndim == 3 and output.shape[-1] == 1:
        output = output[..., 0]
    if output.ndim != 2:
        raise ModelError(f"the model returned shape {list(output.shape)}; expected one depth map")
    return output


def model_input_size(contract: Contract, profile: Profile, frame_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of the tensor the model takes for a frame of `frame_size`.

    A dynamic model with `keep_aspect` gets the frame's aspect, its short side at
    the profile's side, inside a box of side x MAX_ASPECT * side: a 1 x 70000
    strip would otherwise ask for a tensor 17.9 million rows tall.
    """
    if contract.fixed_size:
        return contract.fixed_size
    side = profile.input_size
    if not side:
        raise ModelError(
            f"the model's input size is dynamic; set model.input_size for profile {profile.name!r}"
        )
    m = profile.multiple_of
    fixed_w, fixed_h = contract.width, contract.height
    if not profile.keep_aspect:
        w = h = side
    else:
        fw, fh = frame_size
        scale = min(side / min(fw, fh), MAX_ASPECT * side / max(fw, fh))
        w, h = fw * scale, fh * scale
    w = fixed_w or max(m, int(round(w / m)) * m)
    h = fixed_h or max(m, int(round(h / m)) * m)
    return w, h
