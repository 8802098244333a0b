"""Tiny ONNX models whose output is a known function of their input.

Each returns the mean of the three colour channels at every pixel, so a frame's
brightness becomes its "inverse depth": bright = near = white in the depth map.
That makes orientation, size and normalisation checkable to the pixel.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from depthwatch.model.profiles import profile_for
from depthwatch.model.spec import ModelSpec

OPSET = 17


def spec_for(path: Path, profile: str = "midas-v21-small", **kw: object) -> ModelSpec:
    """A CPU ModelSpec for a tiny test model, at a 64-pixel input, at fp32 (`precision: auto` would
    measure int8 beside it first; the tests of that pass `precision="auto"`)."""
    kw.setdefault("precision", "fp32")
    return ModelSpec(path=path, profile=profile_for(profile).with_overrides(input_size=64), providers=("cpu",), **kw)  # type: ignore[arg-type]


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def brightness_model(
    path: Path,
    *,
    layout: str = "NCHW",
    dtype: int = TensorProto.FLOAT,
    size: tuple[int, int] | None = (32, 32),
    output: str = "1HW",
    scale: float = 1.0,
) -> Path:
    """A model whose depth output is scale * mean(R, G, B).

    layout NCHW or NHWC; dtype FLOAT or UINT8; size (h, w) fixed or None for
    dynamic; output "1HW", "11HW" or "1HW1".
    """
    h, w = size if size else ("height", "width")
    in_shape = [1, 3, h, w] if layout == "NCHW" else [1, h, w, 3]
    channel_axis = 1 if layout == "NCHW" else 3
    nodes = []
    current = "image"
    if dtype != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [current], ["as_float"], to=TensorProto.FLOAT))
        current = "as_float"
    keep = 0 if output == "1HW" else 1
    nodes.append(helper.make_node("ReduceMean", [current], ["mean"], axes=[channel_axis], keepdims=keep))
    current = "mean"
    if output == "11HW" and layout == "NHWC":
        nodes.append(helper.make_node("Transpose", [current], ["nchw"], perm=[0, 3, 1, 2]))
        current = "nchw"
    if output == "1HW1" and layout == "NCHW":
        nodes.append(helper.make_node("Transpose", [current], ["nhwc"], perm=[0, 2, 3, 1]))
        current = "nhwc"
    scale_init = helper.make_tensor("scale", TensorProto.FLOAT, [], [scale])
    nodes.append(helper.make_node("Mul", [current, "scale"], ["depth"]))
    out_shape = {"1HW": [1, h, w], "11HW": [1, 1, h, w], "1HW1": [1, h, w, 1]}[output]
    graph = helper.make_graph(
        nodes,
        "brightness",
        [helper.make_tensor_value_info("image", dtype, in_shape)],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, out_shape)],
        initializer=[scale_init],
    )
    return _save(graph, path)


def failing_model(path: Path, size: int = 16) -> Path:
    """A model that loads and warms up, then fails on any frame holding a white pixel.

    A Gather whose index is computed from the pixels makes the failure
    data-dependent (no optimiser can remove it): the all-zero warm-up input
    reads index 0, a frame with a white pixel reads index 1000 and raises.
    """
    nodes = [
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("ReduceMax", ["image"], ["peak"], keepdims=0),
        helper.make_node("Cast", ["peak"], ["peak_int"], to=TensorProto.INT64),
        helper.make_node("Mul", ["peak_int", "far"], ["index"]),
        helper.make_node("Gather", ["mean", "index"], ["row"], axis=0),
        helper.make_node("Mul", ["row", "zero"], ["nothing"]),
        helper.make_node("Add", ["mean", "nothing"], ["depth"]),
    ]
    inits = [
        helper.make_tensor("far", TensorProto.INT64, [], [1000]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
    ]
    return _save(_square_float_graph(nodes, "failing", size, inits), path)


def _conv_stack(layers: int, channels: int, scale: float, bias: float = 0.0) -> tuple[list, list, str]:
    """Nodes and weights of `layers` 3x3 convolutions with ReLU on "image"; the last output's name.

    `bias`: added by every convolution (none: the stack's values shrink layer by layer).
    """
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    current, in_ch = "image", 3
    if bias:
        inits.append(numpy_helper.from_array(np.full(channels, bias, np.float32), "bias"))
    for i in range(layers):
        weights = (rng.standard_normal((channels, in_ch, 3, 3)) * scale).astype(np.float32)
        if bias:  # raw bytes: the same weights, written in a fraction of the time for a stack of hundreds
            inits.append(numpy_helper.from_array(weights, f"w{i}"))
        else:
            inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, list(weights.shape), weights.ravel().tolist()))
        nodes.append(helper.make_node("Conv", [current, f"w{i}", *(["bias"] if bias else [])], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        current, in_ch = f"r{i}", channels
    return nodes, inits, current


def _square_float_graph(nodes: list, name: str, size: int, inits: list) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, size, size])],
        initializer=inits,
    )


def slow_model(
    path: Path, layers: int | None = None, size: int = 64, channels: int = 32, *, seconds: float | None = None
) -> Path:
    """A float NCHW model that takes a while (many convolutions), to catch a run in progress.

    `seconds`: about that long a run on onnxruntime's CPU provider on this
    machine, as loaded as it is now (`layers_for`). A fixed layer count takes
    three times longer on an AVX2 machine than on one with AVX-512, and a test
    that needs "a second in the model" wants a second on both, not a minute
    of the suite's time on one. `layers`: exactly that many convolutions, for
    a test about what the model computes rather than how long it takes.

    Its output is the convolutions' mean plus the frame's brightness, so a
    frame that is not one flat colour gets a map that is not flat either.

    A model made for `seconds` keeps its convolutions' values clear of
    subnormal numbers (`steady`), so that its time grows with its layers as
    the count assumes: without, each layer shrinks them (by about 0.6), and
    past 150 layers or so every one runs on subnormals, 15 times slower:
    the "one second" model at 256x256 (250 layers on an AVX-512 machine) took
    17 s a run, and a test that wanted three frames in flight spent a minute
    and 30 s of CPU on them.
    """
    if layers is None:
        return _slow(path, layers_for(seconds if seconds is not None else 0.1, size, channels), size, channels, steady=True)
    return _slow(path, layers, size, channels, steady=False)


#: What each convolution of a `steady` stack adds: its values settle about there, never subnormal.
_STEADY_BIAS = 0.01
#: What a `steady` stack's mean is scaled by before it is added to the brightness: to as little as
#: the mean of a plain stack of as many layers comes to (0.6 ** 70, about 3e-16, and less the deeper).
_STEADY_SHARE = 1e-16


def _slow(path: Path, layers: int, size: int, channels: int, *, steady: bool) -> Path:
    """`slow_model`'s graph: `steady`, the stack's values kept clear of subnormals (see there)."""
    nodes, inits, last = _conv_stack(layers, channels, 0.05, _STEADY_BIAS if steady else 0.0)
    if steady:
        inits.append(helper.make_tensor("share", TensorProto.FLOAT, [], [_STEADY_SHARE]))
        nodes += [
            helper.make_node("ReduceMean", [last], ["settled"], axes=[1], keepdims=0),
            helper.make_node("Mul", ["settled", "share"], ["busy"]),
        ]
    else:
        nodes.append(helper.make_node("ReduceMean", [last], ["busy"], axes=[1], keepdims=0))
    nodes += [
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Add", ["busy", "mean"], ["depth"]),
    ]
    return _save(_square_float_graph(nodes, "slow", size, inits), path)


#: Seconds a run of one convolution layer takes here, per (size, channels): measured once per process,
#: or once per run where `SHARED_CALIBRATION` names a file the run's test processes share.
_LAYER_SECONDS: dict[tuple[int, int], float] = {}
#: A JSON file of the figures above that every test process of one run reads and adds to (under a
#: lock), so that each (size, channels) is measured once, not once in each process: the probe
#: at 64x64 builds and loads a 256-convolution model, 6 s of a test's time and 12 s of CPU.
#: Set by tests/conftest.py under pytest-xdist; None: this process measures for itself.
SHARED_CALIBRATION: Path | None = None
#: What the calibration probe's run lasts at least: well above the timer's and the call's overheads.
_PROBE_S = 0.05


def layers_for(seconds: float, size: int, channels: int = 32) -> int:
    """How many convolution layers make `slow_model` take about `seconds` a run here.

    Measured, not assumed: a probe model (grown until a run lasts 50 ms) is
    timed on onnxruntime's CPU provider with its default threads (as the
    daemon's `intra_op_threads: 0`), the fastest of five runs after a warm-up:
    what this CPU does when it is let, so that the count follows the CPU (its
    vector units, its clock) and not the moment's load. On a loaded machine
    the model then takes longer than `seconds`, as any work does, and the
    tests that use it wait on conditions, never on a time.
    """
    key = (size, channels)
    if key not in _LAYER_SECONDS and SHARED_CALIBRATION is not None:
        import fcntl
        import json

        with open(SHARED_CALIBRATION.with_name(SHARED_CALIBRATION.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process measures a key; the others wait and read its figure
            shared = json.loads(SHARED_CALIBRATION.read_text()) if SHARED_CALIBRATION.is_file() else {}
            name = f"{size}x{channels}"
            if name not in shared:
                shared[name] = _layer_seconds(size, channels)
                SHARED_CALIBRATION.write_text(json.dumps(shared))
            _LAYER_SECONDS[key] = shared[name]
    if key not in _LAYER_SECONDS:
        _LAYER_SECONDS[key] = _layer_seconds(size, channels)
    return max(1, min(2000, round(seconds / _LAYER_SECONDS[key])))


def _layer_seconds(size: int, channels: int) -> float:
    """Seconds a run of one convolution layer takes on this CPU when it is let (see `layers_for`)."""
    import tempfile
    import time

    import numpy as np
    import onnxruntime

    feed = {"image": np.random.default_rng(0).random((1, 3, size, size), np.float32)}
    layers = 4
    with tempfile.TemporaryDirectory() as folder:
        while True:
            probe = _slow(Path(folder) / f"probe{layers}.onnx", layers, size, channels, steady=True)
            session = onnxruntime.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
            session.run(None, feed)
            runs = []
            for _ in range(5):
                start = time.perf_counter()
                session.run(None, feed)
                runs.append(time.perf_counter() - start)
            run = min(runs)
            if run >= _PROBE_S or layers >= 256:
                break
            layers = min(256, layers * max(2, int(_PROBE_S / max(run, 1e-4)) + 1))
    return max(run / layers, 1e-6)


def busy_brightness_model(path: Path, size: int = 64, layers: int = 6, channels: int = 16) -> Path:
    """Depth = mean(R, G, B), exactly, after some real work (a stack of convolutions times zero).

    The output is as checkable as the tiny brightness model's; the convolutions
    make each inference take a few milliseconds, so a job lasts long enough to
    kill a worker in the middle of it.
    """
    nodes, inits, last = _conv_stack(layers, channels, 0.1)
    inits.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    nodes += [
        helper.make_node("ReduceMean", [last], ["busy"], axes=[1], keepdims=0),
        helper.make_node("Mul", ["busy", "zero"], ["nothing"]),
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Add", ["mean", "nothing"], ["depth"]),
    ]
    return _save(_square_float_graph(nodes, "busy_brightness", size, inits), path)


def cancelling_model(path: Path, size: int = 32, offset: float = 1e5) -> Path:
    """Brightness again, computed as a small difference of large numbers: what bf16 cannot keep.

    A 1x1 convolution adds `offset` to 1000 x the brightness, a ReLU keeps the
    two apart, a second one takes `offset` away again. In fp32 (24-bit
    mantissa) the brightness survives; bf16 (8 bits) spaces values near 1e5
    by 512, so the map collapses to a few levels.
    """
    import numpy as np
    from onnx import numpy_helper

    inits = [
        numpy_helper.from_array(np.full((1, 3, 1, 1), 1000 / 3, np.float32), "w1"),
        numpy_helper.from_array(np.array([offset], np.float32), "b1"),
        numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w2"),
        numpy_helper.from_array(np.array([-offset], np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["large"]),
        helper.make_node("Relu", ["large"], ["kept"]),
        helper.make_node("Conv", ["kept", "w2", "b2"], ["small"]),
        helper.make_node("Squeeze", ["small", "axes"], ["depth"]),
    ]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    graph = helper.make_graph(
        nodes,
        "cancelling",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, size, size])],
        inits,
    )
    return _save(graph, path)


def sqrt_model(path: Path, size: int = 16) -> Path:
    """Depth = sqrt(mean(R, G, B) - 0.5) of the model's input: NaN wherever a pixel is dark.

    A frame with any dark pixel gets NaN there (as an fp16 overflow on a GPU
    gives), while a bright frame gets a good map: the same model shows both.
    """
    nodes = [
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Sub", ["mean", "half"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["depth"]),
    ]
    return _save(_square_float_graph(nodes, "sqrt", size, [helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]), path)


def constant_model(path: Path, size: int = 16, value: float = 0.5) -> Path:
    """Depth = `value` at every pixel, whatever the frame (a broken export)."""
    inits = [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("value", TensorProto.FLOAT, [], [value])]
    nodes = [
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
        helper.make_node("Add", ["nothing", "value"], ["depth"]),
    ]
    return _save(_square_float_graph(nodes, "constant", size, inits), path)


def unused_weight_model(path: Path) -> Path:
    """`brightness_model` with a weight no node uses: onnxruntime warns of it on its own logger
    ("Removing initializer ...") in every session made with its default log settings."""
    brightness_model(path)
    model = onnx.load(str(path))
    model.graph.initializer.append(helper.make_tensor("unused_weight", TensorProto.FLOAT, [2], [1.0, 2.0]))
    onnx.save(model, str(path))
    return path


def hanging_model(path: Path, size: int = 16, per_unit: float = 1e9) -> Path:
    """Brightness, after a `Loop` whose trip count is reduce_max(input) x `per_unit`: a model that hangs on a white frame.

    A black frame (and the all-zero warm-up) runs the loop no time at all; a
    frame with a white pixel runs it about a billion times, each iteration
    one operator: onnxruntime looks at RunOptions.terminate between them, so
    the run can be given up (as a provider stuck in a loop of its own can be).
    """
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "one"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [])],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    nodes = [
        helper.make_node("ReduceMax", ["image"], ["peak"], keepdims=0),
        helper.make_node("Mul", ["peak", "per_unit"], ["trips_f"]),
        helper.make_node("Cast", ["trips_f"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips", "true", "zero"], ["spun"], body=body),
        helper.make_node("Mul", ["spun", "zero"], ["nothing"]),
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Add", ["mean", "nothing"], ["depth"]),
    ]
    inits = [
        helper.make_tensor("per_unit", TensorProto.FLOAT, [], [per_unit]),
        helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
    ]
    return _save(_square_float_graph(nodes, "hanging", size, inits), path)


def stuck_model(path: Path, size: int = 16, boxes_per_unit: float = 1e6) -> Path:
    """Brightness, after one operator that runs for many minutes on a white frame and cannot be given up.

    A NonMaxSuppression over reduce_max(input) x `boxes_per_unit` boxes that
    never overlap: its work grows with the square of the boxes (a million:
    a quarter of an hour here), all inside the one operator, where
    onnxruntime never looks at RunOptions.terminate (as a driver call that
    does not come back). A black frame has no boxes and runs at once.
    """
    nodes = [
        helper.make_node("ReduceMax", ["image"], ["peak"], keepdims=0),
        helper.make_node("Mul", ["peak", "per_unit"], ["count"]),
        helper.make_node("Range", ["zero", "count", "one"], ["index"]),
        helper.make_node("Mul", ["index", "two"], ["x0"]),
        helper.make_node("Add", ["x0", "one"], ["x1"]),
        helper.make_node("Unsqueeze", ["x0", "axis1"], ["x0c"]),
        helper.make_node("Unsqueeze", ["x1", "axis1"], ["x1c"]),
        helper.make_node("Mul", ["x0c", "zero"], ["y0c"]),
        helper.make_node("Add", ["y0c", "one"], ["y1c"]),
        helper.make_node("Concat", ["y0c", "x0c", "y1c", "x1c"], ["corners"], axis=1),
        helper.make_node("Unsqueeze", ["corners", "axis0"], ["boxes"]),
        helper.make_node("Add", ["index", "one"], ["score"]),
        helper.make_node("Unsqueeze", ["score", "axes01"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou"], ["kept"]),
        helper.make_node("ReduceSum", ["kept"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["total_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["total_f", "zero"], ["nothing"]),
        helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Add", ["mean", "nothing"], ["depth"]),
    ]
    inits = [
        helper.make_tensor("per_unit", TensorProto.FLOAT, [], [boxes_per_unit]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axes01", TensorProto.INT64, [2], [0, 1]),
        helper.make_tensor("most", TensorProto.INT64, [1], [10**12]),
        helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5]),
    ]
    return _save(_square_float_graph(nodes, "stuck", size, inits), path)
