"""The runtimes depthwatch can serve a model from, one module each, behind one Session interface.

`ort` is ONNX Runtime (every execution provider it has: CPU, CoreML, CUDA);
`openvino` is Intel's OpenVINO runtime, an optional extra
(`depthwatch[openvino]`). The engine talks to either through `Session`, so
adding a runtime touches this package and the provider list only.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Session(Protocol):
    """What depthwatch needs of an inference session (onnxruntime's, OpenVINO's, or a test's stand-in).

    `run_options` is onnxruntime's RunOptions; a runtime that is not
    onnxruntime reads its `terminate` flag, which another thread sets to stop
    a running inference.
    """

    def run(self, output_names: list[str], input_feed: dict[str, np.ndarray], run_options: Any = None) -> list[Any]: ...

    def get_inputs(self) -> list[Any]: ...

    def get_outputs(self) -> list[Any]: ...

    def get_providers(self) -> list[str]: ...
