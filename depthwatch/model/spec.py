"""What a model is to depthwatch: the file and how to run it (ModelSpec), and what got loaded (ModelInfo).

Kept apart from the engine so the catalogue, `fetch` and the pipeline can name
a model without importing the thread that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from depthwatch import paths
from depthwatch.model import providers
from depthwatch.model.contract import Contract
from depthwatch.model.profiles import Profile
from depthwatch.model.recognise import ProfileChoice

if TYPE_CHECKING:
    from depthwatch.model.caches import CompiledFolder
    from depthwatch.model.choosing.trials import Trial


@dataclass(frozen=True)
class ModelSpec:
    """What to load: a model file, its profile, and how to run it."""

    path: Path
    profile: Profile
    providers: str | tuple[str, ...] = "auto"
    #: Threads for the CPU provider's operators; 0 lets onnxruntime decide.
    intra_op_threads: int = 0
    #: The folder under which CoreML keeps compiled models between starts, one
    #: subfolder per model contents, runtime and options (None: the user cache dir).
    coreml_cache: Path | None = None
    #: With `profile: auto` and a file not known by its checksum: the engine picks the
    #: profile from the graph it reads (or refuses), and `profile` is a placeholder till then.
    choose_profile: ProfileChoice | None = None
    #: auto, fp32, bf16 or fp16 (see depthwatch.model.choosing.precision).
    precision: str = "auto"

    def coreml_root(self) -> Path:
        if self.coreml_cache is not None:
            return self.coreml_cache
        return paths.cache_dir() / "coreml"

    def state_dir(self) -> Path:
        """Where the model digests and the measured provider choices are kept."""
        return paths.cache_dir()


@dataclass(frozen=True)
class ModelInfo:
    """What is loaded now; `generation` goes up by one with every swap."""

    spec: ModelSpec
    contract: Contract
    providers: tuple[str, ...]
    generation: int
    load_seconds: float
    #: The fewest pixels (width, height) a frame may be decoded at and still fill the
    #: model's input: what lets a JPEG decode at 1/2..1/8 scale. Computed once per load.
    min_frame_size: tuple[int, int] = (0, 0)
    #: CoreML's compiled-model folder for this load, and whether it was there before (None: not CoreML).
    compiled: CompiledFolder | None = None
    #: How `auto` chose: "measured" now, "remembered" from an earlier measurement, or "" (nothing to choose).
    chosen_by: str = ""
    #: The figures of the measurement this load made (empty when it made none).
    trials: tuple[Trial, ...] = ()
    #: The precision the engine was chosen at (the variant): fp32 (the graph as it is), bf16, fp16 or int8
    #: (the int8 file `quantize` made). What the session computes in is `arithmetic`.
    precision: str = "fp32"
    #: The file the session runs: the model's own, or its int8 file (`quantize`).
    file: Path | None = None
    #: Why `precision: auto` kept fp32 although the hardware has a reduced precision
    #: (its maps were not faithful), one line each; empty when nothing was refused.
    refused: tuple[str, ...] = ()
    #: The model's own graph is quantized (`graph_ops`): run as it is, it computes in int8.
    quantized: bool = False

    @property
    def arithmetic(self) -> str:
        """What the session computes in, as the log, `check` and `describe` say it: a quantized
        graph run as it is computes in int8, though no precision was asked of the runtime."""
        return "int8" if self.quantized and self.precision == "fp32" else self.precision

    @property
    def profile(self) -> Profile:
        return self.spec.profile

    @property
    def runs_off_the_cpu(self) -> bool:
        """Whether the model runs on an accelerator (CoreML, CUDA...), leaving the CPU's cores to the rest.

        Why it matters: image work done beside a run on the CPU does not save
        time, it slows the run (measured on 2 cores: beside a run on both cores
        the run took 34.7-36.6 ms against 18.0-33.3 alone; beside a run on one
        thread the time after the run fell 2.2 ms and the run rose 1.3-2.2 ms,
        caches and memory being shared), so the pipeline works ahead of the map
        only beside an accelerator (docs/benchmarks.md).
        """
        return bool(self.providers) and self.providers[0] not in (providers.CPU, providers.OPENVINO)

    def describe(self) -> str:
        return (
            f"model {self.spec.path.name} (profile {self.profile.name}, "
            f"providers {', '.join(self.providers)}, {self.arithmetic}): {self.contract.describe()}"
        )
