"""OpenVINO's runtime behind depthwatch's Session interface (the `openvino` extra).

Why the runtime itself and not onnxruntime-openvino's execution provider: that
provider comes in a wheel that replaces `onnxruntime` (same module, so it
cannot sit beside the official one, which carries CoreML on macOS), it trails
onnxruntime's releases, and when it cannot start it falls back to the CPU
provider with only a warning. The runtime installs beside onnxruntime, takes
the precision as a documented property (`INFERENCE_PRECISION_HINT`) and fails
loudly. Measured on one model both ways run at the same speed (see
pyproject.toml).

One compiled model and one infer request per session. The request runs
asynchronously only so that the inference thread can wait on it in short
slices and cancel it when the frame is superseded, as onnxruntime's
RunOptions.terminate does; the caller still makes every call from its own
thread, one at a time. OpenVINO's CPU plugin keeps a pool of its own threads;
it starts no process.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The engine's name for this runtime in provider lists (config: `openvino`).
NAME = "OpenVINO"

#: depthwatch's precision names and OpenVINO's INFERENCE_PRECISION_HINT values. int8 is a quantized
#: file (`quantize`): its quantized nodes run on the plugin's int8 kernels, the rest in f32.
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "f32"}
#: The CPU plugin's OPTIMIZATION_CAPABILITIES that mean a precision runs natively.
CAPABILITY = {"bf16": "BF16", "fp16": "FP16"}
#: How long the inference thread waits on the request before looking at `terminate` again.
#: Shorter than a run: at 20 ms a bf16 model of 5-20 ms is never cut short, so a scrub's last
#: frame waits behind a superseded run; at 2 ms its map comes 37.8 ms after the last write, not
#: 44.9 (medians of 15, AVX-512 BF16 EPYC), with the burst no slower (the wait itself releases
#: the GIL; 500 wake-ups a second cost nothing measurable).
WAIT_SLICE_MS = 2

_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "u8": "tensor(uint8)"}


class Cancelled(RuntimeError):
    """The running inference was cancelled through its run options."""


def runtime() -> Any:
    """The `openvino` module, imported without its model-conversion tools.

    `import openvino` also imports `openvino.tools.ovc` (convert_model, which
    depthwatch does not use: the runtime reads ONNX itself), and that sends a
    telemetry event on import: from a thread pool, through a
    `multiprocessing.Process` (a fork) on Linux, writing a client id under
    ~/intel unless the user has opted out. A daemon that never forks and
    never phones home cannot have that, so the tools are kept out: openvino's
    __init__ imports them inside `try/except ImportError`, and a None in
    sys.modules makes that import fail.
    """
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino.tools.ovc", None)  # type: ignore[arg-type]
    import openvino

    return openvino


def installed() -> bool:
    """Whether the `openvino` package is there (looked up, not imported: importing it costs ~60 MiB)."""
    return importlib.util.find_spec("openvino") is not None


def version() -> str:
    """The installed runtime's version, read from its package metadata (importing it costs ~15 MiB)."""
    from importlib import metadata

    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:  # an install without metadata (a source build)
        return str(runtime().get_version()).split("-")[0]


def capabilities() -> set[str]:
    """What the CPU plugin runs natively on this machine (FP32, BF16, FP16, INT8, ...)."""
    return set(runtime().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def reduced_precisions() -> list[str]:
    """The reduced precisions this CPU runs natively, best first: what `precision: auto` tries."""
    have = capabilities()
    return [p for p in ("bf16", "fp16") if CAPABILITY[p] in have]


@dataclass(frozen=True)
class Port:
    """An input or output as onnxruntime describes one (name, shape with None for dynamic, type)."""

    name: str
    shape: list[Any]
    type: str


def _port(port: Any) -> Port:
    shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
    kind = port.get_element_type().get_type_name()
    return Port(port.get_any_name(), shape, _TYPES.get(kind, f"tensor({kind})"))


class OpenVINOSession:
    """A model compiled for OpenVINO's CPU plugin at one precision, with one infer request."""

    def __init__(self, path: Path | str, precision: str = "fp32", threads: int = 0) -> None:
        """`threads` 0 lets OpenVINO decide (one per core), as intra_op_threads 0 does for onnxruntime."""
        openvino = runtime()

        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": HINTS[precision],
            # One frame at a time: one stream, every core on it.
            "PERFORMANCE_HINT": "LATENCY",
            # Unpinned, like onnxruntime's threads: the decode and encode workers share the cores.
            "ENABLE_CPU_PINNING": False,
        }
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        core = openvino.Core()
        self._compiled = core.compile_model(str(path), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._inputs = [_port(p) for p in self._compiled.inputs]
        self._outputs = [_port(p) for p in self._compiled.outputs]
        # Every name of each output: OpenVINO keeps a tensor's aliases (an ONNX export's and the
        # graph's own) and names a port by any one of them, so two compilations of one graph (the
        # model and its int8 file) may each report another.
        self._index = {name: i for i, port in enumerate(self._compiled.outputs) for name in port.get_names()}
        self._index.update({p.name: i for i, p in enumerate(self._outputs)})
        self.precision = precision
        #: What the plugin actually runs at (it may keep f32 where a precision is not supported).
        self.applied_precision = str(self._compiled.get_property("INFERENCE_PRECISION_HINT"))

    def get_inputs(self) -> list[Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[Port]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [NAME]

    def end_profiling(self) -> str:
        """No onnxruntime profile: OpenVINO takes the whole graph as one compiled model."""
        return ""

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        request = self._request
        request.start_async(input_feed)
        while not request.wait_for(WAIT_SLICE_MS):
            if getattr(run_options, "terminate", False):
                request.cancel()
                try:
                    request.wait()  # settles the request, so the next run can start
                except RuntimeError:
                    pass  # "Infer Request was canceled": what was asked for
                raise Cancelled("the inference was cancelled")
        names = output_names or [p.name for p in self._outputs]
        # Copied: the request reuses its output buffers at the next run, and the
        # prediction lives on in another thread.
        return [np.array(request.get_output_tensor(self._index[n]).data, copy=True) for n in names]
