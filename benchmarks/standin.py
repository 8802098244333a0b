"""The stand-in model: MiDaS v2.1 small's I/O contract at a comparable cost, without weights.

Input `image` float32 [1, 3, 256, 256] (RGB in [0, 1]), output `depth` float32
[1, 256, 256]: the contract of the official MiDaS v2.1 small export, so
depthwatch runs it with the `midas-v21-small` profile. Inside is an
encoder-decoder of 3x3 convolutions with seeded random weights:

    stem     conv 3->32 stride 2 (128x128), conv 32->64 stride 2 (64x64)
    stage 1  6 x conv 64->64 at 64x64
    down     conv 64->128 stride 2 (32x32)
    stage 2  8 x conv 128->128 at 32x32
    decoder  x2 nearest + conv 128->64 (64x64), x2 + conv 64->32 (128x128),
             x2 + conv 32->1 (256x256); ReLU after every conv but the last

Cost, counting a multiply-add as 2 FLOPs and convolutions only: 5.80 GFLOPs
per frame (`flops()` counts it; the number is also stored in the model's
metadata as `flops_per_frame`). MiDaS v2.1 small is of the same order, and the
output is a smooth map with real structure, so normalising and encoding it
costs what a real map costs.

`--quick` uses the same graph at 64x64 with an eighth of the channels and one
block per stage (a few MFLOPs) so the smoke test runs in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass(frozen=True)
class Shape:
    """What to build: input side, base channel count and blocks per stage."""

    side: int = 256
    width: int = 32
    stage1: int = 6
    stage2: int = 8


DEFAULT = Shape()
QUICK = Shape(side=64, width=4, stage1=1, stage2=1)


def _layers(shape: Shape) -> list[tuple[int, int, int, bool]]:
    """(in channels, out channels, stride, upsample x2 first) for every conv, in order."""
    w = shape.width
    layers = [(3, w, 2, False), (w, 2 * w, 2, False)]
    layers += [(2 * w, 2 * w, 1, False)] * shape.stage1
    layers += [(2 * w, 4 * w, 2, False)]
    layers += [(4 * w, 4 * w, 1, False)] * shape.stage2
    layers += [(4 * w, 2 * w, 1, True), (2 * w, w, 1, True), (w, 1, 1, True)]
    return layers


def flops(shape: Shape = DEFAULT) -> int:
    """FLOPs per frame of the convolutions (2 per multiply-add)."""
    total, side = 0, shape.side
    for cin, cout, stride, up in _layers(shape):
        side = side * 2 if up else side // stride
        total += 2 * cin * cout * 9 * side * side
    return total


def build(path: Path, shape: Shape = DEFAULT, seed: int = 0) -> Path:
    """Write the stand-in model to `path` and return it."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "image"
    layers = _layers(shape)
    for i, (cin, cout, stride, up) in enumerate(layers):
        if up:
            nodes.append(helper.make_node("Resize", [current, "", "up_scales"], [f"up{i}"], mode="nearest"))
            current = f"up{i}"
        # He initialisation keeps activations in range through the stack.
        weight = rng.normal(0.0, np.sqrt(2.0 / (cin * 9)), (cout, cin, 3, 3)).astype(np.float32)
        bias = rng.normal(0.0, 0.01, cout).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        conv = helper.make_node(
            "Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]
        )
        nodes.append(conv)
        current = f"c{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"r{i}"]))
            current = f"r{i}"
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "squeeze_axes"))
    nodes.append(helper.make_node("Squeeze", [current, "squeeze_axes"], ["depth"]))
    s = shape.side
    graph = helper.make_graph(
        nodes,
        "midas_small_standin",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, s, s])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, s, s])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    helper.set_model_props(model, {"flops_per_frame": str(flops(shape)), "about": "depthwatch benchmark stand-in"})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
