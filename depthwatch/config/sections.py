"""The schema: the config's sections, each setting with its default and its check.

One frozen dataclass per section; each field's metadata names the check its
value goes through (see `checks`). The defaults here and in the repository's
config.yaml are kept in step by a test (`dump_defaults`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthwatch import paths
from depthwatch.config import checks
from depthwatch.config.checks import setting
from depthwatch.imaging.exr import CHANNEL_SETS as EXR_CHANNEL_SETS
from depthwatch.imaging.exr import COMPRESSIONS as EXR_COMPRESSIONS
from depthwatch.imaging.view import DISPLAY, LINEAR
from depthwatch.model.profiles import DEPTH, INVERSE_DEPTH, PROFILES
from depthwatch.pathmap import PathMap


@dataclass(frozen=True)
class ModelConfig:
    path: str = field(default="midas-v21-small", metadata=setting(checks.model_path, "catalogue name or path to an .onnx file"))
    profile: str = field(default="auto", metadata=setting(checks.one_of("auto", *PROFILES)))
    providers: str | tuple[str, ...] = field(default="auto", metadata=setting(checks.providers))
    intra_op_threads: int = field(default=0, metadata=setting(checks.whole(0, 256)))
    precision: str = field(default="auto", metadata=setting(checks.one_of("auto", "fp32", "bf16", "fp16", "int8")))
    coreml_cache: Path | None = field(default=None, metadata=setting(checks.optional(checks.path)))
    folder: Path | None = field(default=None, metadata=setting(checks.optional(checks.path)))
    input_size: int | None = field(default=None, metadata=setting(checks.optional(checks.whole(14, 4096))))
    multiple_of: int | None = field(default=None, metadata=setting(checks.optional(checks.whole(1, 256))))
    mean: tuple[float, float, float] | None = field(default=None, metadata=setting(checks.optional(checks.triple)))
    std: tuple[float, float, float] | None = field(default=None, metadata=setting(checks.optional(checks.triple)))
    output: str | None = field(default=None, metadata=setting(checks.optional(checks.one_of(INVERSE_DEPTH, DEPTH))))

    def models_folder(self) -> Path:
        return self.folder if self.folder is not None else paths.models_dir()


@dataclass(frozen=True)
class WatchConfig:
    folders: tuple[Path, ...] = field(default=(Path("tmp"),), metadata=setting(checks.list_of(checks.folder)))
    patterns: tuple[str, ...] = field(default=("frame.jpg",), metadata=setting(checks.list_of(checks.text)))
    recursive: bool = field(default=False, metadata=setting(checks.boolean))
    observer: str = field(default="native", metadata=setting(checks.one_of("native", "polling")))
    poll_interval_ms: int = field(default=500, metadata=setting(checks.whole(50, 60_000)))
    settle_ms: int = field(default=100, metadata=setting(checks.whole(0, 10_000)))
    incomplete_timeout_s: float = field(default=10.0, metadata=setting(checks.number(0.1, 3600)))
    follow_symlinks: bool = field(default=False, metadata=setting(checks.boolean))


@dataclass(frozen=True)
class OutputConfig:
    template: str = field(default="depth.jpg", metadata=setting(checks.map_template))
    # A clip's depth clip (see depthwatch/media/clipwrite.py): .mov, .mkv, .mp4 or an image sequence.
    clip_template: str = field(default="{stem}_depth.mov", metadata=setting(checks.clip_template))
    # The number of a clip's first frame in an image sequence ({frame}): 0, or 1001 as VFX pipelines count.
    first_frame: int = field(default=0, metadata=setting(checks.whole(0, 99_999_999)))
    # Beside each depth clip, a timeline to open: the source on V1, the depth clip on V2 (.otio, .fcpxml).
    timeline: bool = field(default=False, metadata=setting(checks.boolean))
    jpeg_quality: int = field(default=95, metadata=setting(checks.whole(1, 100)))
    png_bits: int = field(default=16, metadata=setting(checks.one_of(8, 16, 32)))
    png_compression: int = field(default=1, metadata=setting(checks.whole(0, 9)))
    invert: bool = field(default=False, metadata=setting(checks.boolean))
    # The depth range each map is stretched over: these percentiles of the prediction, or None: min to max.
    range_percentile: tuple[float, float] | None = field(default=None, metadata=setting(checks.optional(checks.percent_pair)))
    sidecar: bool = field(default=False, metadata=setting(checks.boolean))
    error_sidecar: bool = field(default=False, metadata=setting(checks.boolean))
    # Shot-stable maps (see docs/stable.md and depthwatch/imaging/stabilise/) or each map on its own.
    normalise: str = field(default="stable", metadata=setting(checks.one_of("stable", "frame")))
    # Editor-grade maps: edges taken from the frame (refine), and levels as in a grading tool (near, far, gamma).
    refine: str = field(default="edges", metadata=setting(checks.one_of("edges", "none")))
    near: float | str = field(default=1.0, metadata=setting(checks.level))
    far: float | str = field(default=0.0, metadata=setting(checks.level))
    gamma: float = field(default=1.0, metadata=setting(checks.number(0.1, 10)))
    # EXR maps: channel Z as float32, or half; and how the file is compressed.
    exr_half: bool = field(default=False, metadata=setting(checks.boolean))
    exr_compression: str = field(default="zip", metadata=setting(checks.one_of(*EXR_COMPRESSIONS)))
    # Depth in Z and, so that viewers show a picture, in R, G, B (or Y) too; or Z alone.
    exr_channels: str = field(default="z+rgb", metadata=setting(checks.one_of(*EXR_CHANNEL_SETS)))


@dataclass(frozen=True)
class InputConfig:
    """How frames are read (EXR frames: scene-linear or already display-referred)."""

    exr_colour: str = field(default=LINEAR, metadata=setting(checks.one_of(LINEAR, DISPLAY)))


@dataclass(frozen=True)
class DaemonConfig:
    workers: int = field(default=2, metadata=setting(checks.whole(1, 64)))
    worker_niceness: int = field(default=10, metadata=setting(checks.whole(0, 19)))
    queue_size: int = field(default=4096, metadata=setting(checks.whole(1, 1_000_000)))
    max_megapixels: float = field(default=100.0, metadata=setting(checks.number(0.01, 10_000)))
    #: Files larger than this are refused before a byte is read (a sparse or endless file).
    max_file_mb: float = field(default=512.0, metadata=setting(checks.number(0.001, 65_536)))
    retries: int = field(default=3, metadata=setting(checks.whole(0, 100)))
    shutdown_timeout_s: float = field(default=10.0, metadata=setting(checks.number(0.5, 19)))
    #: The least time a model run may take before it is given up (the bound is this, or 20 times
    #: the median run, whichever is longer): a model that hangs on a frame is reported, not served for ever.
    stall_timeout_s: float = field(default=60.0, metadata=setting(checks.number(0.5, 3600)))
    status_file: Path | None = field(default=None, metadata=setting(checks.optional(checks.file_in_folder)))
    log_level: str = field(default="info", metadata=setting(checks.one_of("debug", "info", "warning", "error")))


@dataclass(frozen=True)
class ApiConfig:
    enabled: bool = field(default=False, metadata=setting(checks.boolean))
    host: str = field(default="127.0.0.1", metadata=setting(checks.host))
    port: int = field(default=5000, metadata=setting(checks.whole(0, 65535)))
    max_body_mb: float = field(default=64.0, metadata=setting(checks.number(0.01, 4096)))
    timeout_s: float = field(default=30.0, metadata=setting(checks.number(0.1, 3600)))
    request_timeout_s: float = field(default=30.0, metadata=setting(checks.number(0.1, 3600)))
    token: str | None = field(default=None, metadata=setting(checks.optional(checks.text)))


@dataclass(frozen=True)
class FarmConfig:
    """`depthwatch worker` and `depthwatch once --farm` (the render farm)."""

    path_map: PathMap = field(default=PathMap(), metadata=setting(checks.path_map))
    frames_per_task: int = field(default=4, metadata=setting(checks.whole(1, 10_000)))


@dataclass(frozen=True)
class Config:
    model: ModelConfig = ModelConfig()
    watch: WatchConfig = WatchConfig()
    input: InputConfig = InputConfig()
    output: OutputConfig = OutputConfig()
    daemon: DaemonConfig = DaemonConfig()
    api: ApiConfig = ApiConfig()
    farm: FarmConfig = FarmConfig()
    #: The file this came from (None: built-in defaults); relative paths resolve against its folder.
    source: Path | None = field(default=None, compare=False)

    @property
    def base(self) -> Path:
        """The folder relative paths are taken from: the config file's, else the working directory."""
        # The real file's folder: a config reached through a symlink keeps its relative paths.
        return Path(os.path.realpath(self.source)).parent if self.source is not None else Path.cwd()

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with some settings of one section changed (command-line overrides)."""
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **changes)})


#: Settings read under an old name, section by section: {old: new}. Each is read as the new one,
#: with one warning that says what to write instead (see `reading`).
RENAMED: dict[str, dict[str, str]] = {
    # Percentile clipping of the depth range: `clip_percent` reads like output.clip_template's (video clips).
    "output": {"clip_percent": "range_percentile"},
}

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "watch": WatchConfig,
    "input": InputConfig,
    "output": OutputConfig,
    "daemon": DaemonConfig,
    "api": ApiConfig,
    "farm": FarmConfig,
}


def defaults(base: Path | None = None) -> Config:
    """Built-in defaults, with relative folders taken from `base` (the working directory)."""
    base = base or Path.cwd()
    config = Config()
    return config.replace("watch", folders=tuple(base / f for f in config.watch.folders))


def dump_defaults() -> dict[str, dict[str, Any]]:
    """The built-in defaults as plain values, section by section (for the config.yaml test)."""
    out: dict[str, dict[str, Any]] = {}
    for name, cls in SECTIONS.items():
        out[name] = {}
        for f in dataclasses.fields(cls):
            value = getattr(cls(), f.name)
            if isinstance(value, tuple):
                value = [str(v) if isinstance(v, Path) else v for v in value]
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, PathMap):
                value = value.as_dict()
            out[name][f.name] = value
    return out
