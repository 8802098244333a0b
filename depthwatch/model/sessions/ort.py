"""ONNX Runtime sessions as depthwatch makes them: the session options and the provider chain.

The engine makes every session on its inference thread through a factory that
is called as onnxruntime.InferenceSession is; this module holds what goes into
that call. The choices are deliberate: one inter-op thread and sequential
execution (one frame at a time, the cores shared with the image work), no
spinning threads, no memory pattern (see `session_options`), and for CoreML a
compiled-model cache keyed by the model's contents.

onnxruntime writes its own log lines straight to the process's stderr (the
daemon's log), colour codes and unescaped file names included, from sessions
depthwatch does not make too (the int8 quantizer's calibration). Every error
it has also comes back as an exception, which depthwatch says in one line of
its own, so its logger is set to fatal alone, once, before anything else of
onnxruntime runs (`runtime`).
"""

from __future__ import annotations

import logging
from typing import Any

from depthwatch.model import caches, graph_inputs, providers
from depthwatch.model.profiles import Profile
from depthwatch.model.spec import ModelSpec

log = logging.getLogger("depthwatch.model.engine")

#: One provider and its options, as onnxruntime.InferenceSession takes them.
Chain = list[tuple[str, dict[str, Any]]]


#: onnxruntime's own severity for its log: fatal only (0 verbose, 1 info, 2 warning, 3 error, 4 fatal).
QUIET = 4


def runtime() -> Any:
    """The `onnxruntime` module, its own logger quieted (see above): the one way depthwatch imports it."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(QUIET)
    return onnxruntime


def factory() -> Any:
    """onnxruntime.InferenceSession (imported here, so nothing imports onnxruntime before it is needed)."""
    return runtime().InferenceSession


def run_options() -> Any:
    """A RunOptions whose `terminate` another thread sets to stop the run between operators."""
    options = runtime().RunOptions()
    options.log_severity_level = QUIET  # a run stopped by `terminate` is not an error to print
    return options


def session_options(spec: ModelSpec, trace_prefix: str | None = None, pins: dict[str, int] | None = None) -> Any:
    onnxruntime = runtime()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(0, spec.intra_op_threads)
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = QUIET  # errors reach the log as our own one-line messages
    # Idle operator threads spinning would steal the cores that decode and encode frames.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The memory pattern is planned at the second run and allocated as one block beside
    # the first run's chunks, which the arena keeps: about 20 MiB more resident for a
    # 256x256 MiDaS-sized model, for no measurable speed (A/B interleaved: 0.97-1.00x).
    options.enable_mem_pattern = False
    for name, value in (pins or {}).items():
        options.add_free_dimension_override_by_name(name, value)
    if trace_prefix is not None:  # ORT profiling: a trace of which provider ran each node
        options.enable_profiling = True
        options.profile_file_prefix = trace_prefix
    return options


def _square_side(profile: Profile) -> int | None:
    """The side of the one square input depthwatch feeds a dynamic model, or None if it follows the frame's aspect."""
    if profile.keep_aspect or not profile.input_size:
        return None
    m = profile.multiple_of
    return max(m, int(round(profile.input_size / m)) * m)


def provider_chain(
    wanted: list[str], spec: ModelSpec, precision: str = "fp32"
) -> tuple[Chain, caches.CompiledFolder | None, dict[str, int]]:
    """(provider, options) pairs, CoreML's cache folder, and the input dimensions to pin.

    With CoreML in the chain the image input's symbolic batch (and height
    and width, where depthwatch feeds one square size) are pinned, so that
    CoreML, taking only nodes of static shape, can take the graph; the
    cache folder is keyed by the model's contents, the runtime, the options
    and those pins. OpenVINO is not an onnxruntime provider: first in the
    list it is passed on for the engine to open its own session, elsewhere it
    is left out.
    """
    entry = None
    pins: dict[str, int] = {}
    chain: Chain = []
    for index, name in enumerate(wanted):
        if name == providers.OPENVINO and index > 0:
            continue
        options = providers.options_for(name, precision=precision)
        if name == providers.COREML:
            pins = graph_inputs.fixed_dims(spec.path, _square_side(spec.profile))
            if providers.coreml_caches(providers.runtime_version()):
                keyed = {**options, "depthwatch.fixed_dims": pins}
                try:
                    digest = caches.model_digest(spec.path, spec.state_dir())
                    entry = caches.open_entry(spec.coreml_root(), spec.path, digest, providers.runtime_version(), keyed)
                except OSError as exc:
                    log.warning(
                        "cannot use the compiled-model cache in %s (%s); CoreML compiles at every load",
                        spec.coreml_root(),
                        exc.strerror or exc,
                    )
                else:
                    options = providers.options_for(name, entry.path, precision=precision)
        chain.append((name, options))
    return chain, entry, pins
