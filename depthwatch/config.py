"""The one Config object, loaded from a hand-edited YAML file and checked strictly.

People edit this file by hand, often while the daemon runs, so every mistake
is reported as `file:line:column: what is wrong; what to do`, unknown keys get
a "did you mean", and nothing but plain YAML is accepted (safe loader only).
The defaults here and in the repository's config.yaml are kept in step by a test.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import shlex
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from depthwatch import paths
from depthwatch.errors import ConfigError
from depthwatch.files import kind_of
from depthwatch.imaging.exr import CHANNEL_SETS as EXR_CHANNEL_SETS
from depthwatch.imaging.exr import COMPRESSIONS as EXR_COMPRESSIONS
from depthwatch.imaging.formats import OUTPUT_FORMATS
from depthwatch.imaging.levels import parse_level
from depthwatch.imaging.view import DISPLAY, LINEAR
from depthwatch.model import providers
from depthwatch.model.profiles import DEPTH, INVERSE_DEPTH, PROFILES
from depthwatch.pathmap import PathMap

ENV_VAR = "DEPTHWATCH_CONFIG"


def _spec(check: Callable[[Any, Path], Any], doc: str = "") -> dict[str, Any]:
    return {"check": check, "doc": doc}


# -- value checks: each returns the converted value or raises ValueError(sentence) --


def _int(lo: int, hi: int) -> Callable[[Any, Path], int]:
    def check(value: Any, base: Path) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number, not {_show(value)}")
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, not {value}")
        return value

    return check


def _number(lo: float, hi: float) -> Callable[[Any, Path], float]:
    def check(value: Any, base: Path) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, not {_show(value)}")
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, not {value:g}")
        return float(value)

    return check


def _bool(value: Any, base: Path) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {_show(value)}")
    return value


def _choice(*choices: Any) -> Callable[[Any, Path], Any]:
    def check(value: Any, base: Path) -> Any:
        if isinstance(value, bool) or value not in choices:
            shown = ", ".join(str(c) for c in choices)
            raise ValueError(f"must be one of {shown}, not {_show(value)}{_did_you_mean(value, choices)}")
        return value

    return check


def _text(value: Any, base: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, not {_show(value)}")
    return value


def _optional(check: Callable[[Any, Path], Any]) -> Callable[[Any, Path], Any]:
    def wrapped(value: Any, base: Path) -> Any:
        return None if value is None else check(value, base)

    return wrapped


def _path(value: Any, base: Path) -> Path:
    return paths.expand_path(_text(value, base), base)


def _list_of(check: Callable[[Any, Path], Any]) -> Callable[[Any, Path], tuple[Any, ...]]:
    def wrapped(value: Any, base: Path) -> tuple[Any, ...]:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError("must list at least one entry")
        return tuple(check(item, base) for item in items)

    return wrapped


def _folder(value: Any, base: Path) -> Path:
    path = _path(value, base)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file, not a folder")
    if not path.exists() and not path.parent.is_dir():
        raise ValueError(f"{path} does not exist, nor does its parent; create the folder or fix the path")
    return path


def _providers(value: Any, base: Path) -> str | tuple[str, ...]:
    if value == "auto":
        return "auto"
    names = _list_of(_text)(value, base)
    known = {*providers.ALIASES, *providers.ALIASES.values()}
    for name in names:
        if name not in known and not name.endswith("ExecutionProvider"):
            choices = ["auto", *providers.ALIASES]
            raise ValueError(f"{name!r} is not a provider; use auto or a list of coreml, cuda, openvino, cpu{_did_you_mean(name, choices)}")
    return tuple(providers.full_name(n) for n in names)


def _triple(value: Any, base: Path) -> tuple[float, float, float]:
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"must be a list of three numbers (R, G, B), not {_show(value)}")
    return tuple(_number(-1e6, 1e6)(v, base) for v in value)  # type: ignore[return-value]


def _percent_pair(value: Any, base: Path) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"must be a list [low, high] of two percentiles, not {_show(value)}")
    lo, hi = (_number(0, 100)(v, base) for v in value)
    if not lo < hi:
        raise ValueError(f"low ({lo:g}) must be below high ({hi:g})")
    return lo, hi


def _level(value: Any, base: Path) -> float | str:
    return parse_level(value).setting


def _template(value: Any, base: Path) -> str:
    """The template, its folder part expanded (~, $VARS) now, once: a frame's own name
    ($HOME.jpg) is later put into it literally, never expanded."""
    text = _text(value, base)
    try:
        rendered = text.format(stem="frame", name="frame.jpg", ext="jpg")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{text!r} uses an unknown field {exc}; use {{stem}}, {{name}} or {{ext}}") from None
    suffix = Path(rendered).suffix.lower()
    if "{ext}" not in text and suffix not in OUTPUT_FORMATS:
        raise ValueError(f"{text!r} must end in .jpg, .png, .tif or .exr (or {{ext}} for the frame's own)")
    return _contained_template(text, rendered)


def _contained_template(text: str, rendered: str) -> str:
    """`text` with its folder part expanded (~, $VAR), once the example name it renders to
    is known not to climb out of the watch folder; the name part stays literal."""
    if ".." in Path(rendered).parts:
        raise ValueError(f"{text!r} climbs out of the watch folder with '..'; use an absolute folder instead")
    folder, name = os.path.split(text)
    if folder:
        text = os.path.join(os.path.expandvars(os.path.expanduser(folder)), name)
    return text


def _clip_template(value: Any, base: Path) -> str:
    """Like `_template`, for the depth clip of a clip (see `imaging.clipwrite`)."""
    from depthwatch.imaging.clipwrite import template_problem

    text = _text(value, base)
    problem = template_problem(text)
    if problem:
        raise ValueError(problem)
    return _contained_template(text, text)


def _path_map(value: Any, base: Path) -> PathMap:
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of client prefix: worker prefix, like {{/Volumes/Shots: /mnt/shots}}, not {_show(value)}")
    return PathMap.from_mapping(value)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def _did_you_mean(value: Any, choices: Any) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- the schema -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    path: str = field(default="midas-v21-small", metadata=_spec(_text, "catalogue name or path to an .onnx file"))
    profile: str = field(default="auto", metadata=_spec(_choice("auto", *PROFILES)))
    providers: str | tuple[str, ...] = field(default="auto", metadata=_spec(_providers))
    intra_op_threads: int = field(default=0, metadata=_spec(_int(0, 256)))
    precision: str = field(default="auto", metadata=_spec(_choice("auto", "fp32", "bf16", "fp16", "int8")))
    coreml_cache: Path | None = field(default=None, metadata=_spec(_optional(_path)))
    folder: Path | None = field(default=None, metadata=_spec(_optional(_path)))
    input_size: int | None = field(default=None, metadata=_spec(_optional(_int(14, 4096))))
    multiple_of: int | None = field(default=None, metadata=_spec(_optional(_int(1, 256))))
    mean: tuple[float, float, float] | None = field(default=None, metadata=_spec(_optional(_triple)))
    std: tuple[float, float, float] | None = field(default=None, metadata=_spec(_optional(_triple)))
    output: str | None = field(default=None, metadata=_spec(_optional(_choice(INVERSE_DEPTH, DEPTH))))

    def models_folder(self) -> Path:
        return self.folder if self.folder is not None else paths.models_dir()


@dataclass(frozen=True)
class WatchConfig:
    folders: tuple[Path, ...] = field(default=(Path("tmp"),), metadata=_spec(_list_of(_folder)))
    patterns: tuple[str, ...] = field(default=("frame.jpg",), metadata=_spec(_list_of(_text)))
    recursive: bool = field(default=False, metadata=_spec(_bool))
    observer: str = field(default="native", metadata=_spec(_choice("native", "polling")))
    poll_interval_ms: int = field(default=500, metadata=_spec(_int(50, 60_000)))
    settle_ms: int = field(default=100, metadata=_spec(_int(0, 10_000)))
    incomplete_timeout_s: float = field(default=10.0, metadata=_spec(_number(0.1, 3600)))
    follow_symlinks: bool = field(default=False, metadata=_spec(_bool))


@dataclass(frozen=True)
class OutputConfig:
    template: str = field(default="depth.jpg", metadata=_spec(_template))
    # A clip's depth clip (see depthwatch/imaging/clipwrite.py): .mov, .mkv, .mp4 or an image sequence.
    clip_template: str = field(default="{stem}_depth.mov", metadata=_spec(_clip_template))
    # The number of a clip's first frame in an image sequence ({frame}): 0, or 1001 as VFX pipelines count.
    first_frame: int = field(default=0, metadata=_spec(_int(0, 99_999_999)))
    # Beside each depth clip, a timeline to open: the source on V1, the depth clip on V2 (.otio, .fcpxml).
    timeline: bool = field(default=False, metadata=_spec(_bool))
    jpeg_quality: int = field(default=95, metadata=_spec(_int(1, 100)))
    png_bits: int = field(default=16, metadata=_spec(_choice(8, 16, 32)))
    png_compression: int = field(default=1, metadata=_spec(_int(0, 9)))
    invert: bool = field(default=False, metadata=_spec(_bool))
    clip_percent: tuple[float, float] | None = field(default=None, metadata=_spec(_optional(_percent_pair)))
    sidecar: bool = field(default=False, metadata=_spec(_bool))
    error_sidecar: bool = field(default=False, metadata=_spec(_bool))
    # Shot-stable maps (see depthwatch/imaging/stabilise.py) or each map on its own.
    normalise: str = field(default="stable", metadata=_spec(_choice("stable", "frame")))
    # Editor-grade maps (issue 15): edges from the frame, and levels as in a grading tool.
    refine: str = field(default="edges", metadata=_spec(_choice("edges", "none")))
    near: float | str = field(default=1.0, metadata=_spec(_level))
    far: float | str = field(default=0.0, metadata=_spec(_level))
    gamma: float = field(default=1.0, metadata=_spec(_number(0.1, 10)))
    # EXR maps (issue 25): channel Z as float32, or half; and how the file is compressed.
    exr_half: bool = field(default=False, metadata=_spec(_bool))
    exr_compression: str = field(default="zip", metadata=_spec(_choice(*EXR_COMPRESSIONS)))
    # Depth in Z and, so that viewers show a picture, in R, G, B (or Y) too; or Z alone.
    exr_channels: str = field(default="z+rgb", metadata=_spec(_choice(*EXR_CHANNEL_SETS)))


@dataclass(frozen=True)
class InputConfig:
    """How frames are read (EXR frames: scene-linear or already display-referred)."""

    exr_colour: str = field(default=LINEAR, metadata=_spec(_choice(LINEAR, DISPLAY)))


@dataclass(frozen=True)
class DaemonConfig:
    workers: int = field(default=2, metadata=_spec(_int(1, 64)))
    worker_niceness: int = field(default=10, metadata=_spec(_int(0, 19)))
    queue_size: int = field(default=4096, metadata=_spec(_int(1, 1_000_000)))
    max_megapixels: float = field(default=100.0, metadata=_spec(_number(0.01, 10_000)))
    #: Files larger than this are refused before a byte is read (a sparse or endless file).
    max_file_mb: float = field(default=512.0, metadata=_spec(_number(0.001, 65_536)))
    retries: int = field(default=3, metadata=_spec(_int(0, 100)))
    shutdown_timeout_s: float = field(default=10.0, metadata=_spec(_number(0.5, 19)))
    status_file: Path | None = field(default=None, metadata=_spec(_optional(_path)))
    log_level: str = field(default="info", metadata=_spec(_choice("debug", "info", "warning", "error")))


def _host(value: Any, base: Path) -> str:
    text = _text(value, base).strip()
    if any(c in text for c in "/ :") and not _is_ip(text):
        raise ValueError(f"must be an IP address or a host name, not {_show(value)}")
    return text


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether `host` only ever listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another host name may resolve to any address


@dataclass(frozen=True)
class ApiConfig:
    enabled: bool = field(default=False, metadata=_spec(_bool))
    host: str = field(default="127.0.0.1", metadata=_spec(_host))
    port: int = field(default=5000, metadata=_spec(_int(0, 65535)))
    max_body_mb: float = field(default=64.0, metadata=_spec(_number(0.01, 4096)))
    timeout_s: float = field(default=30.0, metadata=_spec(_number(0.1, 3600)))
    request_timeout_s: float = field(default=30.0, metadata=_spec(_number(0.1, 3600)))
    token: str | None = field(default=None, metadata=_spec(_optional(_text)))


@dataclass(frozen=True)
class FarmConfig:
    """`depthwatch worker` and `depthwatch once --farm` (the render farm)."""

    path_map: PathMap = field(default=PathMap(), metadata=_spec(_path_map))
    frames_per_task: int = field(default=4, metadata=_spec(_int(1, 10_000)))


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
        # The real file's folder, as before: a config reached through a symlink keeps its relative paths.
        return Path(os.path.realpath(self.source)).parent if self.source is not None else Path.cwd()

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with some settings of one section changed (command-line overrides)."""
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **changes)})


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


# -- finding and loading ----------------------------------------------------------------


#: The config file `find(here=True)` takes from the current folder.
LOCAL_FILE = "config.yaml"


def _why_not_a_file(path: Path) -> str:
    """Why `path` is no config file: missing, or a FIFO, folder or device in its place."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "does not exist"
    return f"is {kind_of(mode)}, not a file"


def find(explicit: str | os.PathLike[str] | None = None, platform: str | None = None, *, here: bool = False) -> Path | None:
    """The config file to use: -c PATH, then $DEPTHWATCH_CONFIG, then the user's folder,
    then (with `here`) `config.yaml` in the current folder; None: built-in defaults.

    `here` is for commands run by hand (run, once, check, status, models): started
    from a checkout, they use the documented config.yaml there, and the start-up
    line says which file it was. A service always gets an absolute -c.
    """
    if explicit:
        path = Path(os.path.expanduser(str(explicit)))
        if not _is_file(path, "-c CONFIG"):
            raise ConfigError(f"config file {path} {_why_not_a_file(path)}; check the -c path")
        return Path(os.path.abspath(path))  # the path given: a symlink relinked is seen
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(os.path.expanduser(env))
        if not _is_file(path, f"${ENV_VAR}"):
            raise ConfigError(f"${ENV_VAR} names {path}, which {_why_not_a_file(path)}; fix or unset it")
        return Path(os.path.abspath(path))  # the path given: a symlink relinked is seen
    user = paths.default_config_file(platform)
    if _is_file(user, "-c CONFIG"):
        return user
    local = Path.cwd() / LOCAL_FILE
    return local.resolve() if here and _is_file(local, "-c CONFIG") else None


def _is_file(path: Path, instead: str) -> bool:
    """Whether `path` is a file; ConfigError (exit 78) when a folder on its way cannot be searched.

    Such a folder may hide the user's config: going on with the next place, or
    the built-in defaults, would run another config than the one they wrote.
    """
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except PermissionError:
        folder = _unsearchable(path)
        raise ConfigError(
            f"cannot look for the config file {path}: permission denied on the folder {folder}; "
            f"give yourself access to it (chmod u+rx {shlex.quote(str(folder))}) or name a config with {instead}"
        ) from None
    except (OSError, ValueError):
        return False


def _unsearchable(path: Path) -> Path:
    """The folder on the way to `path` that this user cannot search (the deepest one that can be looked at)."""
    folder = Path(os.path.abspath(path)).parent
    for above in (*reversed(folder.parents), folder):
        try:
            os.stat(above)
        except PermissionError:
            return above.parent
        except OSError:
            break
    return folder


def load(path: Path | None) -> Config:
    """Load and check a config file (None: the built-in defaults); ConfigError if unusable."""
    if path is None:
        return defaults()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    return parse(text, path)


def parse(text: str, path: Path) -> Config:
    """Check YAML text as a config from `path`; every error names file, line and column."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        raise ConfigError(f"{where}: not valid YAML: {problem}; fix the indentation, quoting or tags there") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None
    finally:
        loader.dispose()
    if data is None:
        data, node = {}, None
    base = Path(os.path.realpath(path)).parent
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path, node)}: the config must be a mapping of sections ({', '.join(SECTIONS)})")
    sections: dict[str, Any] = {}
    for key, key_node, value, value_node in _items(data, node, path):
        if key not in SECTIONS:
            raise ConfigError(
                f"{_where(path, key_node)}: unknown section {key!r}{_did_you_mean(key, SECTIONS)}; "
                f"sections are {', '.join(SECTIONS)}"
            )
        sections[key] = _section(SECTIONS[key], key, value, value_node, path, base)
    config = Config(**sections, source=path)
    # The default folder (tmp) is relative too: to the file, like every other path in it.
    config = config.replace("watch", folders=tuple(Path(os.path.abspath(base / f)) for f in config.watch.folders))
    check_combinations(config, _where(path, node))
    return config


def _where(path: Path, node: yaml.Node | None) -> str:
    if node is None:
        return f"{path}:1:1"
    return f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _items(data: Mapping[str, Any], node: yaml.Node | None, path: Path) -> list[tuple[Any, Any, Any, Any]]:
    """(key, key node, value, value node) for each entry of a mapping; duplicate keys refused."""
    pairs = node.value if isinstance(node, yaml.MappingNode) else []
    nodes = {}
    for key_node, value_node in pairs:
        if key_node.value in nodes:
            raise ConfigError(
                f"{_where(path, key_node)}: {key_node.value!r} is set twice; YAML would silently keep the last one, so remove one"
            )
        nodes[key_node.value] = (key_node, value_node)
    out = []
    for key, value in data.items():
        key_node, value_node = nodes.get(str(key), (node, node))
        out.append((key, key_node, value, value_node))
    return out


def _section(cls: type, name: str, data: Any, node: yaml.Node, path: Path, base: Path) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path, node)}: section {name!r} must be a mapping of settings, not {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, key_node, value, value_node in _items(data, node, path):
        if key not in fields:
            raise ConfigError(
                f"{_where(path, key_node)}: unknown setting {name}.{key}{_did_you_mean(str(key), fields)}; "
                f"see config.yaml for the settings of {name!r}"
            )
        try:
            values[key] = fields[key].metadata["check"](value, base)
        except ValueError as exc:
            raise ConfigError(f"{_where(path, value_node)}: {name}.{key} {exc}") from None
    return cls(**values)


def map_format_problem(template: str, frame_ext: str, png_bits: int, frame: str = "the frame") -> str | None:
    """Why the map `template` names for a frame ending in `frame_ext` cannot be written as configured.

    None when it can. Matters for templates that take the frame's own extension
    (`{ext}`, `{name}`): a WebP frame would get a .webp map, which no encoder
    here writes, and a PNG frame a PNG map, which cannot hold png_bits 32.
    `frame` names the frame in the message ("a *.webp frame", "the frame").
    """
    if "{ext}" not in template and "{name}" not in template:
        return None  # a fixed extension, checked as the template is read
    ext = frame_ext.lower()
    suffix = Path(template.format(stem="frame", name=f"frame{ext}", ext=ext.lstrip("."))).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        return (
            f"output.template {template!r} names the map after {frame}'s extension, and depth maps cannot be "
            f"written as {suffix or 'a file without one'}; give the template its own: .jpg, .png, .tif or .exr "
            "(e.g. '{stem}_depth.png')"
        )
    if png_bits == 32 and OUTPUT_FORMATS[suffix] == ".png":
        return (
            f"output.png_bits 32 (float) needs .tif or .exr maps, and output.template {template!r} makes {frame}'s "
            "map a PNG, which holds at most 16 bits; use a .tif or .exr template, or png_bits 16"
        )
    return None


def _pattern_ext(pattern: str) -> str | None:
    """The extension every file `pattern` matches ends in, or None where the pattern leaves it open."""
    ext = os.path.splitext(pattern)[1]
    return ext if ext and not set(ext) & set("*?[") else None


def check_combinations(config: Config, where: str = "command line") -> None:
    """Settings that are fine alone but impossible together (also after command-line overrides)."""
    if (config.model.mean is None) != (config.model.std is None):
        raise ConfigError(f"{where}: model.mean and model.std go together; set both or neither")
    out = config.output
    near, far = str(out.near), str(out.far)
    if near.endswith("%") == far.endswith("%") and float(near.rstrip("%")) <= float(far.rstrip("%")):
        raise ConfigError(
            f"{where}: output.near ({out.near}) must be above output.far ({out.far}); "
            "to make near black, set output.invert: true instead"
        )
    if out.png_bits == 32 and Path(out.template).suffix.lower() == ".png":
        raise ConfigError(
            f"{where}: output.png_bits 32 (float) needs a .tif or .exr template, not {out.template!r}; "
            "PNG holds at most 16 bits"
        )
    for pattern in config.watch.patterns:  # patterns that leave the extension open: each frame's job checks
        ext = _pattern_ext(pattern)
        problem = ext and map_format_problem(out.template, ext, out.png_bits, f"a {pattern} frame")
        if problem:
            raise ConfigError(f"{where}: {problem}")
    if config.output.template in config.watch.patterns:
        raise ConfigError(
            f"{where}: output.template {config.output.template!r} is also a watch pattern; "
            "outputs would be processed as frames, so choose a different output name"
        )
    if config.output.clip_template in config.watch.patterns:
        raise ConfigError(
            f"{where}: output.clip_template {config.output.clip_template!r} is also a watch pattern; "
            "depth clips would be processed as clips, so choose a different output name"
        )
    if config.api.enabled and not is_loopback(config.api.host) and config.api.token is None:
        raise ConfigError(
            f"{where}: api.host {config.api.host} is reachable from other machines, and api.token is not set; "
            "set api.token, or listen on 127.0.0.1"
        )


def override(config: Config, flag: str, section: str, base: Path | None = None, **raw: Any) -> Config:
    """A copy with settings given on the command line (`--flag`), checked exactly as the file's are.

    Relative paths are taken from `base` (the shell's folder), not the config file's.
    """
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            values[key] = fields[key].metadata["check"](value, base or Path.cwd())
        except ValueError as exc:
            raise ConfigError(f"{flag}: {section}.{key} {exc}") from None
    return config.replace(section, **values)


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
