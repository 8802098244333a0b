"""Which ONNX Runtime execution providers (or OpenVINO) to ask for, and with which options.

Pure functions of the config and of what the installed runtimes offer, so
the macOS choices (CoreML first, its compile cache) are testable on Linux.
OpenVINO is not an onnxruntime provider but a runtime of its own
(`depthwatch.model.sessions.openvino`); it takes a place in the same lists
under the name OPENVINO, so `auto` measures it beside the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

COREML = "CoreMLExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
OPENVINO = "OpenVINO"

#: Short names accepted in the config, and the full names onnxruntime uses.
ALIASES = {"coreml": COREML, "cuda": CUDA, "openvino": OPENVINO, "cpu": CPU}

#: `auto` takes the first of these that the installed onnxruntime has.
AUTO_ORDER = (COREML, CUDA, OPENVINO, CPU)


def available() -> list[str]:
    """What this installation offers: onnxruntime's providers, and OpenVINO where its extra is installed."""
    import onnxruntime

    from depthwatch.model.sessions import openvino

    offered = list(onnxruntime.get_available_providers())
    return [*offered, OPENVINO] if openvino.installed() else offered


def short(name: str) -> str:
    """CPU, CoreML, CUDA, OpenVINO: a provider's name without onnxruntime's suffix."""
    return name.replace("ExecutionProvider", "")


def full_name(name: str) -> str:
    """The onnxruntime name for a short alias; full names pass through."""
    return ALIASES.get(name.lower(), name)


def auto_candidates(available: Sequence[str]) -> list[str]:
    """What `auto` chooses between: the available accelerators it knows, then CPU."""
    return [p for p in AUTO_ORDER if p in available and p != CPU] + [CPU]


def choose(requested: str | Sequence[str], available: Sequence[str]) -> tuple[list[str], list[str]]:
    """The providers to try, best first, always ending with CPU; and why others were skipped.

    `auto` means the best available in the order CoreML, CUDA, CPU. An explicit
    list is honoured in its order; names this onnxruntime build lacks are
    skipped with a reason, so the caller can warn once instead of letting
    onnxruntime fall back silently.
    """
    if isinstance(requested, str):
        if requested != "auto":
            requested = [requested]
        else:
            chosen = [p for p in AUTO_ORDER if p in available]
            return (chosen if CPU in chosen else [*chosen, CPU]), []
    chosen: list[str] = []
    skipped: list[str] = []
    for name in (full_name(n) for n in requested):
        if name in chosen:
            continue
        if name in available:
            chosen.append(name)
        else:
            skipped.append(
                "OpenVINO is not installed (pip install 'depthwatch[openvino]')"
                if name == OPENVINO
                else f"{name} is not available in this onnxruntime build"
            )
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen, skipped


#: The first onnxruntime whose CoreML provider takes named options (ModelFormat,
#: MLComputeUnits, RequireStaticInputShapes) and a ModelCacheDirectory. 1.20 has
#: the named options but no cache folder and refuses keys it does not know;
#: 1.17 to 1.20 read only the legacy "flags" string and compile at every load.
COREML_NAMED_OPTIONS = (1, 21)


def runtime_version() -> str:
    """The installed onnxruntime's version (part of every compiled-model cache key)."""
    import onnxruntime

    return str(onnxruntime.__version__)


def runtimes_version(available: Sequence[str]) -> str:
    """Every runtime's version that a measured choice depends on: onnxruntime's, and OpenVINO's when offered."""
    text = f"onnxruntime {runtime_version()}"
    if OPENVINO in available:
        from depthwatch.model.sessions import openvino

        text += f", openvino {openvino.version()}"
    return text


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def coreml_caches(version: str) -> bool:
    """Whether this onnxruntime's CoreML provider can keep the compiled model in a folder."""
    return _version_tuple(version) >= COREML_NAMED_OPTIONS


def options_for(
    provider: str, cache_dir: Path | None = None, version: str | None = None, precision: str = "fp32"
) -> dict[str, Any]:
    """Provider options that make each provider fast and restart-friendly.

    CoreML compiles the model on first load; MLProgram with all compute units
    is the fast path on Apple Silicon. Static input shapes: depthwatch feeds
    the model one size, and a node with dynamic shapes fails at run time on
    CoreML (where the CPU fallback cannot catch it at load), so CoreML is told
    to take only nodes whose shapes are known. The cache folder (onnxruntime
    1.21 and later) lets the next start reuse the compiled model; the caller
    keys it by the model's contents (see compile_cache). Without `cache_dir`
    these are the options that go into that key. Precision fp16 lets CoreML
    accumulate in fp16 on the GPU too (MLProgram computes in fp16 on the GPU
    and Neural Engine already).
    """
    if provider == COREML:
        if not coreml_caches(version or runtime_version()):
            return {"flags": "COREML_FLAG_CREATE_MLPROGRAM|COREML_FLAG_ONLY_ALLOW_STATIC_INPUT_SHAPES"}
        options = {"ModelFormat": "MLProgram", "MLComputeUnits": "ALL", "RequireStaticInputShapes": "1"}
        if precision == "fp16":
            options["AllowLowPrecisionAccumulationOnGPU"] = "1"
        if cache_dir is not None:
            options["ModelCacheDirectory"] = str(cache_dir)
        return options
    if provider == CUDA:
        return {"device_id": 0, "cudnn_conv_algo_search": "HEURISTIC"}
    return {}
