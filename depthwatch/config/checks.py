"""The value checks: one per kind of setting, each the converted value or ValueError(sentence).

Every setting of the schema (`sections`) names one of these in its field's
metadata (`setting`). The sentence says what the value must be and what it was,
with a "did you mean" where a close choice exists; the reader puts the file,
line, column and the setting's name in front (`reading`), so a check knows
nothing of YAML. Command-line overrides go through the same checks.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from depthwatch import paths
from depthwatch.config.hosts import is_ip
from depthwatch.imaging.formats import OUTPUT_FORMATS
from depthwatch.imaging.levels import parse_level
from depthwatch.model import providers as provider_names
from depthwatch.pathmap import PathMap

#: A check: (the value as YAML gave it, the folder relative paths are taken from) -> the value to keep.
Check = Callable[[Any, Path], Any]


def setting(check: Check, doc: str = "") -> dict[str, Any]:
    """A field's metadata: the check its value goes through."""
    return {"check": check, "doc": doc}


def whole(lo: int, hi: int) -> Callable[[Any, Path], int]:
    """A whole number in [lo, hi]; true is not 1, and a float is refused, not rounded."""

    def check(value: Any, base: Path) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number, not {show(value)}")
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, not {value}")
        return value

    return check


def number(lo: float, hi: float) -> Callable[[Any, Path], float]:
    """A number in [lo, hi], kept as a float."""

    def check(value: Any, base: Path) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, not {show(value)}")
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, not {value:g}")
        return float(value)

    return check


def boolean(value: Any, base: Path) -> bool:
    """true or false: any other value (a string, a number) is refused, not taken as truthy."""
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {show(value)}")
    return value


def one_of(*choices: Any) -> Check:
    """One of `choices`, with the closest named when it is not."""

    def check(value: Any, base: Path) -> Any:
        if isinstance(value, bool) or value not in choices:
            shown = ", ".join(str(c) for c in choices)
            raise ValueError(f"must be one of {shown}, not {show(value)}{did_you_mean(value, choices)}")
        return value

    return check


def text(value: Any, base: Path) -> str:
    """A string with something in it."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, not {show(value)}")
    return value


def optional(check: Check) -> Check:
    """`check`, or None where the file says null."""

    def wrapped(value: Any, base: Path) -> Any:
        return None if value is None else check(value, base)

    return wrapped


def path(value: Any, base: Path) -> Path:
    """A path with ~ and $VARS expanded, relative to `base` (the config file's folder).

    A path that names an unset variable but is there as written (a folder
    literally called `a$b`) is that folder: the user wrote the path itself.
    """
    written = text(value, base)
    if paths.unset_variables(written):
        literal = Path(os.path.abspath(base / Path(os.path.expanduser(written))))
        if literal.exists():
            return literal
    return paths.expand_path(with_variables_set(written), base)


def with_variables_set(value: str) -> str:
    """`value`, if every variable it names is set; else ValueError naming the first that is not."""
    unset = paths.unset_variables(value)
    if unset:
        raise ValueError(
            f"uses ${unset[0]}, which is not set here (a service starts without your shell's variables); "
            "set it, or write the path itself"
        )
    return value


def model_path(value: Any, base: Path) -> str:
    """A catalogue name or a path to an .onnx file (checked for unset variables; found when the model loads)."""
    return with_variables_set(text(value, base))


def list_of(check: Check) -> Callable[[Any, Path], tuple[Any, ...]]:
    """A list (or one value, as a list of one), each item through `check`; never empty."""

    def wrapped(value: Any, base: Path) -> tuple[Any, ...]:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError("must list at least one entry")
        return tuple(check(item, base) for item in items)

    return wrapped


def folder(value: Any, base: Path) -> Path:
    """A folder that exists, or could be made (its parent does)."""
    where = path(value, base)
    if where.exists() and not where.is_dir():
        raise ValueError(f"{where} is a file, not a folder")
    if not where.exists() and not where.parent.is_dir():
        raise ValueError(f"{where} does not exist, nor does its parent; create the folder or fix the path")
    return where


def file_in_folder(value: Any, base: Path) -> Path:
    """A file whose folder exists (a status file: written from the first moment, never made a folder for)."""
    where = path(value, base)
    if where.is_dir():
        raise ValueError(f"{where} is a folder; name a file in it")
    if not where.parent.is_dir():
        raise ValueError(f"{where}: its folder {where.parent} does not exist; create it or fix the path")
    return where


def providers(value: Any, base: Path) -> str | tuple[str, ...]:
    """`auto`, or execution providers by short or full name, as their full names."""
    if value == "auto":
        return "auto"
    names = list_of(text)(value, base)
    known = {*provider_names.ALIASES, *provider_names.ALIASES.values()}
    for name in names:
        if name not in known and not name.endswith("ExecutionProvider"):
            choices = ["auto", *provider_names.ALIASES]
            raise ValueError(f"{name!r} is not a provider; use auto or a list of coreml, cuda, openvino, cpu{did_you_mean(name, choices)}")
    return tuple(provider_names.full_name(n) for n in names)


def triple(value: Any, base: Path) -> tuple[float, float, float]:
    """Three numbers (R, G, B): a mean or std."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"must be a list of three numbers (R, G, B), not {show(value)}")
    return tuple(number(-1e6, 1e6)(v, base) for v in value)  # type: ignore[return-value]


def percent_pair(value: Any, base: Path) -> tuple[float, float]:
    """Two percentiles [low, high], low below high."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"must be a list [low, high] of two percentiles, not {show(value)}")
    lo, hi = (number(0, 100)(v, base) for v in value)
    if not lo < hi:
        raise ValueError(f"low ({lo:g}) must be below high ({hi:g})")
    return lo, hi


def level(value: Any, base: Path) -> float | str:
    """A level as `imaging.levels` reads it: a fraction, or a percentile like '80%'."""
    return parse_level(value).setting


def map_template(value: Any, base: Path) -> str:
    """The template, its folder part expanded (~, $VARS) now, once: a frame's own name
    ($HOME.jpg) is later put into it literally, never expanded."""
    template = text(value, base)
    try:
        rendered = template.format(stem="frame", name="frame.jpg", ext="jpg")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{template!r} uses an unknown field {exc}; use {{stem}}, {{name}} or {{ext}}") from None
    suffix = Path(rendered).suffix.lower()
    if "{ext}" not in template and suffix not in OUTPUT_FORMATS:
        raise ValueError(f"{template!r} must end in .jpg, .png, .tif or .exr (or {{ext}} for the frame's own)")
    return _contained(template, rendered)


def clip_template(value: Any, base: Path) -> str:
    """Like `map_template`, for the depth clip of a clip (see `media.clipwrite`)."""
    from depthwatch.media.cliptemplates import template_problem

    template = text(value, base)
    problem = template_problem(template)
    if problem:
        raise ValueError(problem)
    return _contained(template, template)


def _contained(template: str, rendered: str) -> str:
    """`template` with its folder part expanded (~, $VAR), once the example name it renders to
    is known not to climb out of the watch folder; the name part stays literal."""
    if ".." in Path(rendered).parts:
        raise ValueError(f"{template!r} climbs out of the watch folder with '..'; use an absolute folder instead")
    head, name = os.path.split(template)
    if head:
        template = os.path.join(os.path.expandvars(os.path.expanduser(with_variables_set(head))), name)
    return template


def path_map(value: Any, base: Path) -> PathMap:
    """Client prefix: worker prefix pairs (`farm.path_map`)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of client prefix: worker prefix, like {{/Volumes/Shots: /mnt/shots}}, not {show(value)}")
    return PathMap.from_mapping(value)


def host(value: Any, base: Path) -> str:
    """An IP address or a host name, nothing with a port or a path in it."""
    name = text(value, base).strip()
    if any(c in name for c in "/ :") and not is_ip(name):
        raise ValueError(f"must be an IP address or a host name, not {show(value)}")
    return name


def show(value: Any) -> str:
    """A value as a message shows it: strings quoted, None as "nothing", others with their type."""
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def did_you_mean(value: Any, choices: Any) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, or nothing."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
