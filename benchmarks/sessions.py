"""Sessions built exactly as depthwatch builds them (ONNX Runtime's or OpenVINO's), for every scenario.

`capture()` lets depthwatch's own Engine load the model (its SessionOptions,
its provider choice, its warm-up) through a session factory that keeps the
session it made and the options it was given, so the ceiling loop and the cost
measurements run the very session the daemon would, and nothing is copied.

`describe()` turns those options into plain JSON, and `open_plain()` rebuilds a
session from that JSON with onnxruntime alone: the bare-process memory
baseline and the classic Flask server import neither depthwatch nor OpenCV
through this module, and still run with the same thread settings.

When depthwatch's choice is OpenVINO, the captured session is an
`OpenVINOSession` made with the engine's own settings (its class holds them
all: precision, threads, hints), and `describe()` records the engine, the
precision and the threads, which `open_plain` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Session config entries depthwatch may set (onnxruntime cannot list them).
_CONFIG_KEYS = (
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.set_denormal_as_zero",
)


#: depthwatch's name for the OpenVINO runtime in provider lists (depthwatch.model.providers.OPENVINO).
OPENVINO = "OpenVINO"


@dataclass
class Captured:
    """A session as depthwatch's Engine made it, and what it was made with."""

    session: Any
    info: Any  # depthwatch.model.engine.ModelInfo
    settings: dict[str, Any]


def capture(spec: Any, timeout: float = 300.0) -> Captured:
    """Load `spec` (a depthwatch ModelSpec) through depthwatch's Engine and keep its session."""
    import onnxruntime

    from depthwatch.model.engine import Engine

    made: dict[str, Any] = {}

    def factory(path: str, sess_options: Any = None, providers: Any = None) -> Any:
        session = onnxruntime.InferenceSession(path, sess_options=sess_options, providers=providers)
        made.update(session=session, options=sess_options, providers=providers)
        return session

    engine = Engine(spec, session_factory=factory).start()
    try:
        info = engine.wait_ready(timeout)
    finally:
        engine.stop(timeout)
    if info.providers[0] == OPENVINO:
        settings = {"engine": "openvino", "precision": info.precision, "threads": max(0, spec.intra_op_threads)}
        return Captured(open_plain(str(info.file), settings), info, settings)  # the model's file, or its int8 one
    return Captured(made["session"], info, describe(made["options"], made["providers"]))


def describe(options: Any, providers: Any) -> dict[str, Any]:
    """SessionOptions and the provider chain as plain JSON."""
    config = {}
    for key in _CONFIG_KEYS:
        try:
            value = options.get_session_config_entry(key)
        except Exception:  # onnxruntime raises when an entry is not set
            continue
        if value:
            config[key] = value
    chain = []
    for entry in providers or ["CPUExecutionProvider"]:
        name, opts = entry if isinstance(entry, (tuple, list)) else (entry, {})
        chain.append([name, dict(opts)])
    return {
        "engine": "onnxruntime",
        "intra_op_num_threads": options.intra_op_num_threads,
        "inter_op_num_threads": options.inter_op_num_threads,
        "execution_mode": options.execution_mode.name,
        "graph_optimization_level": options.graph_optimization_level.name,
        "enable_mem_pattern": options.enable_mem_pattern,
        "enable_cpu_mem_arena": options.enable_cpu_mem_arena,
        "config": config,
        "providers": chain,
    }


def open_plain(model: str, settings: dict[str, Any]) -> Any:
    """A session for `model` with the settings `describe()` recorded (onnxruntime's, or OpenVINO's)."""
    if settings.get("engine") == "openvino":
        from depthwatch.model.sessions.openvino import OpenVINOSession

        return OpenVINOSession(model, settings["precision"], threads=settings["threads"])
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = settings["intra_op_num_threads"]
    options.inter_op_num_threads = settings["inter_op_num_threads"]
    options.execution_mode = getattr(onnxruntime.ExecutionMode, settings["execution_mode"])
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, settings["graph_optimization_level"])
    options.enable_mem_pattern = settings.get("enable_mem_pattern", True)
    options.enable_cpu_mem_arena = settings.get("enable_cpu_mem_arena", True)
    options.log_severity_level = 3
    for key, value in settings["config"].items():
        options.add_session_config_entry(key, value)
    chain = [(name, opts) for name, opts in settings["providers"]]
    return onnxruntime.InferenceSession(model, sess_options=options, providers=chain)
