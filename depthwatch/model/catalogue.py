"""From the config's `model` setting to a model file and the profile to run it with.

`model.path` is either a catalogue name (a known model living in the user's
model folder, fetched with `depthwatch models fetch NAME`) or a path to any
.onnx file. The daemon never downloads: a missing model is a one-line error
naming the command that fetches it.

The catalogue is `models/catalogue.yaml` in the repository. The package reads
it through the `depthwatch/catalogue.yaml` symlink, which a wheel build turns
into a real file, so an installed depthwatch has it too. `$DEPTHWATCH_CATALOGUE`
names a file in the same format whose entries are added to (or replace) the
built-in ones: a studio's own models on its own server, or a test's local one.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from depthwatch.errors import ConfigError, ModelError
from depthwatch.files import why_not_a_file
from depthwatch.model import recognise
from depthwatch.model.profiles import GENERIC, PROFILES, profile_for
from depthwatch.model.recognise import ProfileChoice
from depthwatch.model.spec import ModelSpec
from depthwatch.paths import expand_path

ENV_VAR = "DEPTHWATCH_CATALOGUE"


class ModelSettings(Protocol):
    """What `resolve` reads of a model section: the config's `ModelConfig` has these fields.

    Said here, in the model layer, so that the catalogue turns a section into a
    ModelSpec without importing the config, which sits above it.
    """

    @property
    def path(self) -> str: ...
    @property
    def profile(self) -> str: ...
    @property
    def providers(self) -> str | tuple[str, ...]: ...
    @property
    def intra_op_threads(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def coreml_cache(self) -> Path | None: ...
    @property
    def input_size(self) -> int | None: ...
    @property
    def multiple_of(self) -> int | None: ...
    @property
    def mean(self) -> tuple[float, float, float] | None: ...
    @property
    def std(self) -> tuple[float, float, float] | None: ...
    @property
    def output(self) -> str | None: ...
    def models_folder(self) -> Path: ...

log = logging.getLogger("depthwatch")

_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = ("title", "file", "url", "profile", "licence", "source", "size", "sha256", "approx_mb")
_REQUIRED = ("file", "url", "profile", "licence")


@dataclass(frozen=True)
class Entry:
    """One model the catalogue knows: where to get it, how to run it, how to check it."""

    name: str
    file: str
    url: str
    profile: str
    licence: str
    title: str = ""
    source: str = ""
    #: Exact size in bytes, where verified; None otherwise.
    size: int | None = None
    #: Published or verified checksum (lowercase hex); None: the first fetch records one.
    sha256: str | None = None
    #: Rough size for people deciding what to download; never checked.
    approx_mb: float | None = None


def is_catalogue_name(value: str) -> bool:
    return "/" not in value and "\\" not in value and not value.lower().endswith(".onnx") and not value.startswith(("~", "."))


def builtin_file() -> Path:
    """The catalogue shipped with depthwatch (models/catalogue.yaml in the repository)."""
    return Path(__file__).with_name("catalogue.yaml")


def load(extra: Path | None = None) -> dict[str, Entry]:
    """The built-in catalogue, with `extra` (default: $DEPTHWATCH_CATALOGUE) laid over it.

    Read on every call: the file is tiny, and a long-lived process should see
    the same catalogue as a `depthwatch models` run started next to it.
    """
    entries = parse_file(builtin_file())
    if extra is None and os.environ.get(ENV_VAR):
        extra = Path(os.path.expanduser(os.environ[ENV_VAR]))
        if not extra.is_file():
            raise ConfigError(f"${ENV_VAR} names {extra}, which does not exist; fix or unset it")
    if extra is not None:
        entries.update(parse_file(extra))
    return entries


def parse_file(path: Path) -> dict[str, Entry]:
    """Read and check a catalogue file; ConfigError naming the file and entry if it is wrong."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the model catalogue {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: the model catalogue is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or set(data) != {"models"}:
        raise ConfigError(f"{path}: a model catalogue is a mapping with one key, models; see models/README.md")
    return {str(name): _entry(path, str(name), fields) for name, fields in data["models"].items()}


def _entry(path: Path, name: str, fields: Any) -> Entry:
    where = f"{path}: model {name!r}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: names are lowercase letters, digits, dots and dashes")
    if not isinstance(fields, dict):
        raise ConfigError(f"{where} must be a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(_FIELDS)}")
    missing = [key for key in _REQUIRED if not fields.get(key)]
    if missing:
        raise ConfigError(f"{where}: {missing[0]} is missing")
    for key in ("title", "file", "url", "profile", "licence", "source"):
        if key in fields and fields[key] is not None and not isinstance(fields[key], str):
            raise ConfigError(f"{where}: {key} must be text")
    file = fields["file"]
    if "/" in file or "\\" in file or file.startswith(".") or not file.endswith(".onnx"):
        raise ConfigError(f"{where}: file must be a plain file name ending in .onnx, not {file!r}")
    if not fields["url"].startswith(("https://", "http://")):
        raise ConfigError(f"{where}: url must start with https:// or http://")
    if fields["profile"] not in PROFILES:
        raise ConfigError(f"{where}: unknown profile {fields['profile']!r}; use one of {', '.join(sorted(PROFILES))}")
    size = fields.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise ConfigError(f"{where}: size must be a number of bytes or null")
    sha256 = fields.get("sha256")
    if sha256 is not None:
        sha256 = str(sha256).lower()
        if not _SHA256.match(sha256):
            raise ConfigError(f"{where}: sha256 must be 64 hexadecimal digits or null")
    approx = fields.get("approx_mb")
    if approx is not None and (isinstance(approx, bool) or not isinstance(approx, (int, float))):
        raise ConfigError(f"{where}: approx_mb must be a number or null")
    return Entry(
        name=name,
        file=file,
        url=fields["url"],
        profile=fields["profile"],
        licence=fields["licence"],
        title=fields.get("title") or name,
        source=fields.get("source") or "",
        size=size,
        sha256=sha256,
        approx_mb=approx,
    )


def entry(name: str) -> Entry:
    """The catalogue entry `name`; ConfigError listing the known names if there is none."""
    entries = load()
    try:
        return entries[name]
    except KeyError:
        known = ", ".join(sorted(entries))
        raise ConfigError(
            f"unknown model {name!r}; the catalogue has {known} (see `depthwatch models list`), "
            "and model.path also takes a path to any .onnx file"
        ) from None


def model_file(name: str, models_dir: Path) -> Path:
    """Where the catalogue model `name` lives once fetched."""
    return models_dir / entry(name).file


def configured_file(model: ModelSettings, base: Path) -> Path:
    """The file a model section names, whether or not it is there (ConfigError: no such catalogue name)."""
    if is_catalogue_name(model.path):
        return model.models_folder() / entry(model.path).file
    return expand_path(model.path, base)


def resolve(model: ModelSettings, base: Path) -> ModelSpec:
    """The ModelSpec for a config's model section; ModelError if the file is not there.

    With `profile: auto` the profile comes from the file's contents (see
    `recognise`): its checksum here, else its graph once the engine has read it.
    """
    hint: str | None = None
    if is_catalogue_name(model.path):
        known = entry(model.path)
        path = model.models_folder() / known.file
        if not path.is_file():
            raise ModelError(
                f"model {model.path!r} is not installed ({path} is missing); "
                f"fetch it with `depthwatch models fetch {model.path}`, or run an .onnx depth model you have "
                "with `--model PATH` (or model.path)"
            )
        hint = known.profile
    else:
        path = expand_path(model.path, base)
        if not path.is_file():
            raise ModelError(f"model file {path} {why_not_a_file(path)}; check model.path (or --model)")
    overrides = dict(
        input_size=model.input_size,
        multiple_of=model.multiple_of,
        mean=model.mean,
        std=model.std,
        predicts=model.output,
    )
    choice: ProfileChoice | None = None
    if model.profile != "auto":
        profile = profile_for(model.profile, path)
    else:
        recognised = recognise.by_checksum(path, _checksum_candidates(path))
        if recognised is not None:
            profile = PROFILES[recognised]
            log.info("%s: profile %s, recognised by its checksum", path.name, recognised)
        else:
            hint = hint or profile_for("auto", path).name
            profile = PROFILES.get(hint, GENERIC)  # for the engine until it has read the graph
            choice = ProfileChoice(path.name, hint if hint in PROFILES else None, tuple(overrides.items()))
    return ModelSpec(
        path=path,
        profile=profile.with_overrides(**overrides),
        providers=model.providers,
        intra_op_threads=model.intra_op_threads,
        coreml_cache=model.coreml_cache,
        choose_profile=choice,
        precision=model.precision,
    )


def _checksum_candidates(path: Path) -> list[tuple[int | None, str | None, str]]:
    """The catalogue's (size, sha256, profile) for recognising `path` by its checksum.

    An entry with a checksum but no exact size is a candidate only for a file
    within a factor of two of its rough size, so a start does not hash every
    model file whatever it is.
    """
    try:
        size = path.stat().st_size
    except OSError:
        return []
    found: list[tuple[int | None, str | None, str]] = []
    for entry in load().values():
        if entry.size is None and entry.approx_mb:
            rough = entry.approx_mb * (1 << 20)
            if not rough / 2 <= size <= rough * 2:
                continue
        found.append((entry.size, entry.sha256, entry.profile))
    return found
