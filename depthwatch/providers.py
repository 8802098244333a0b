"""Which ONNX Runtime execution providers to ask for, and with which options.

Pure functions of the config and of what the installed onnxruntime offers, so
the macOS choices (CoreML first, its compile cache) are testable on Linux.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

COREML = "CoreMLExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

#: Short names accepted in the config, and the full names onnxruntime uses.
ALIASES = {"coreml": COREML, "cuda": CUDA, "cpu": CPU}

#: `auto` takes the first of these that the installed onnxruntime has.
AUTO_ORDER = (COREML, CUDA, CPU)


def full_name(name: str) -> str:
    """The onnxruntime name for a short alias; full names pass through."""
    return ALIASES.get(name.lower(), name)


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
            skipped.append(f"{name} is not available in this onnxruntime build")
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen, skipped


def options_for(provider: str, cache_dir: Path) -> dict[str, Any]:
    """Provider options that make each provider fast and restart-friendly.

    CoreML compiles the model on first load; MLProgram with all compute units
    is the fast path on Apple Silicon, and the cache directory lets the next
    start (after a launchd restart, say) reuse the compiled model.
    """
    if provider == COREML:
        return {
            "ModelFormat": "MLProgram",
            "MLComputeUnits": "ALL",
            "ModelCacheDirectory": str(cache_dir),
        }
    if provider == CUDA:
        return {"device_id": 0, "cudnn_conv_algo_search": "HEURISTIC"}
    return {}
