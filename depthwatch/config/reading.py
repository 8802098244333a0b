"""Reading a config: YAML text to a checked Config, every mistake named by file, line and column.

People edit the file by hand, often while the daemon runs, so every mistake is
reported as `file:line:column: what is wrong; what to do`: the YAML is read
as nodes (safe loader only, so nothing but plain YAML), each key keeps its
node for its place, a key set twice is refused (YAML would keep the last one
silently), unknown keys get a "did you mean", and each value goes through its
setting's check (`checks`). A setting under its old name (`sections.RENAMED`)
is read as the new one, with one warning that says what to write instead.
Command-line overrides (`override`) go through the same checks.

The file is read like a frame, without trusting what sits at its path: a
FIFO put there would block the read (and the daemon's main loop with it, so
SIGTERM waits too), a link to `/dev/zero` would be read until memory runs
out. So it is opened without blocking, checked on its descriptor (a regular
file of at most `MAX_BYTES`) and never read past that.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from depthwatch.config.checks import did_you_mean, show
from depthwatch.config.combinations import check_combinations
from depthwatch.config.sections import RENAMED, SECTIONS, Config, defaults
from depthwatch.errors import ConfigError
from depthwatch.files import kind_of
from depthwatch.logtext import amount, shown

log = logging.getLogger("depthwatch.config")

#: The most a config file may hold: a hand-written one is a few KB, so anything near this
#: is no config (a log or a frame saved under its name), and is refused rather than parsed.
MAX_BYTES = 1 << 20

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def load(path: Path | None, *, running: bool = False) -> Config:
    """Load and check a config file (None: the built-in defaults); ConfigError if unusable.

    An empty file (or comments only) is the built-in defaults, said in a warning.
    `running`: read again by a running daemon, where an empty file is much more
    likely a save cut short than a wish for the defaults (which would watch
    another folder): refused, so the last good config stays.
    """
    if path is None:
        return defaults()
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _line_and_column(data, exc.start)
        raise ConfigError(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
    if all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()):
        if running:
            raise ConfigError(f"{path} is empty (or only comments); write its settings, or `{{}}` for the built-in defaults")
        log.warning("%s is empty (or only comments): the built-in defaults are used", shown(path))
    return parse(text, path)


def _read_bounded(path: Path) -> bytes:
    """The config file's bytes: a regular file of at most `MAX_BYTES`, opened without blocking.

    ConfigError, one line, for anything else at the path (a FIFO, a device, a
    folder) or a file over the limit. What is there is looked at before it is
    opened (opening a device can have effects) and again on the descriptor
    (it may have been swapped between the two).
    """
    try:
        kind = kind_of(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    if kind is not None:
        raise _not_a_config(path, kind)
    try:
        st = os.fstat(fd)
        kind = kind_of(st.st_mode)
        if kind is not None:
            raise _not_a_config(path, kind)
        data = b""
        if st.st_size <= MAX_BYTES:
            chunks = []
            left = MAX_BYTES + 1  # one byte more shows a file grown past the limit since fstat
            while left > 0 and (chunk := os.read(fd, left)):
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    finally:
        os.close(fd)
    if st.st_size > MAX_BYTES or len(data) > MAX_BYTES:
        size = f"is {amount(st.st_size / 2**20)} MB" if st.st_size > MAX_BYTES else "grew while it was read"
        raise ConfigError(
            f"{path} {size}, over the {amount(MAX_BYTES / 2**20)} MB a config file may be; "
            "put the config file itself there (a few KB of settings)"
        )
    return data


def _not_a_config(path: Path, kind: str) -> ConfigError:
    return ConfigError(f"{path} is {kind}, not a config file; put the config file itself there")


def _line_and_column(text: str | bytes, position: int) -> tuple[int, int]:
    """1-based line and column of `position` in `text`."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    before = text[:position]
    return before.count(newline) + 1, position - (before.rfind(newline) + 1) + 1  # type: ignore[arg-type]


def parse(text: str, path: Path) -> Config:
    """Check YAML text as a config from `path`; every error names file, line and column."""
    loader = None
    try:
        # The reader checks the characters as it is made: a NUL left by a save cut short, or a
        # pasted control character, fails here, and must be the one line every mistake is.
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and exc.problem.startswith("but "):  # "expected a single document ... but found another"
            problem = f"{exc.context} {exc.problem}"
        problem = " ".join(problem.split())
        raise ConfigError(f"{where}: not valid YAML: {problem}; fix the indentation, quoting or tags there") from None
    except yaml.reader.ReaderError as exc:
        line, column = _line_and_column(text, exc.position)
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise ConfigError(
            f"{path}:{line}:{column}: a control character ({what}) YAML does not allow; remove it "
            "(a save cut short leaves NUL bytes)"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None:
        data, node = {}, None
    base = Path(os.path.realpath(path)).parent
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path, node)}: the config must be a mapping of sections ({', '.join(SECTIONS)})")
    sections: dict[str, Any] = {}
    renamed: list[str] = []

    def unknown_section(key: Any) -> str:
        return f"unknown section {key!r}{did_you_mean(key, SECTIONS)}; sections are {', '.join(SECTIONS)}"

    for key, _, value, value_node in _items(data, node, path, SECTIONS, unknown_section):
        sections[key] = _section(SECTIONS[key], key, value, value_node, path, base, renamed)
    config = Config(**sections, source=path)
    # The default folder (tmp) is relative too: to the file, like every other path in it.
    config = config.replace("watch", folders=tuple(Path(os.path.abspath(base / f)) for f in config.watch.folders))
    check_combinations(config, _where(path, node))
    for line in renamed:  # only for a config that is used: an error stays the one line it is
        log.warning("%s", line)
    return config


def _where(path: Path, node: yaml.Node | None) -> str:
    if node is None:
        return f"{path}:1:1"
    return f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _items(
    data: Mapping[Any, Any], node: yaml.Node | None, path: Path, known: Collection[str], unknown: Callable[[Any], str]
) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(key, key node, value, value node) for each entry of a mapping, in the file's order.

    A key set twice is refused before any entry is given; a key not in `known`
    is refused as it comes, with `unknown(key)`: what it is and what to do.
    """
    pairs = node.value if isinstance(node, yaml.MappingNode) else []
    nodes = {}
    for key_node, value_node in pairs:
        if key_node.value in nodes:
            raise ConfigError(
                f"{_where(path, key_node)}: {key_node.value!r} is set twice; YAML would silently keep the last one, so remove one"
            )
        nodes[key_node.value] = (key_node, value_node)
    for key, value in data.items():
        key_node, value_node = nodes.get(str(key), (node, node))
        if key not in known:
            raise ConfigError(f"{_where(path, key_node)}: {unknown(key)}")
        yield key, key_node, value, value_node


def _section(cls: type, name: str, data: Any, node: yaml.Node, path: Path, base: Path, renamed: list[str]) -> Any:
    """One section's settings, checked; a setting under its old name is added to `renamed` as its warning."""
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path, node)}: section {name!r} must be a mapping of settings, not {show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    old_names = RENAMED.get(name, {})

    def unknown_setting(key: Any) -> str:
        return f"unknown setting {name}.{key}{did_you_mean(str(key), fields)}; see config.yaml for the settings of {name!r}"

    values: dict[str, Any] = {}
    for key, key_node, value, value_node in _items(data, node, path, {*fields, *old_names}, unknown_setting):
        setting = old_names.get(key, key)
        if setting != key:
            if setting in data:
                raise ConfigError(
                    f"{_where(path, key_node)}: {name}.{key} is the old name of {name}.{setting}, which is set too; remove {key}"
                )
            renamed.append(
                f"{_where(path, key_node)}: {name}.{key} is now called {name}.{setting}; "
                f"write {setting} instead (the old name still works, for now)"
            )
        what = f"{_where(path, value_node)}: {name}.{key}"
        written = value_node.value if isinstance(value_node, yaml.ScalarNode) and value_node.style is None else None
        _refuse_surprising_number(value, written, what)
        values[setting] = _checked(fields[setting], value, base, what, written)
    return cls(**values)


def _refuse_surprising_number(value: Any, written: str | None, what: str) -> None:
    """A plain number YAML 1.1 reads as another: 01001 in octal (513), 2:30 in base 60 (150).

    A frame number padded as VFX writes it (`first_frame: 01001`) would become 513 without a word.
    """
    if written is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    digits = written.lstrip("+-")
    if ":" in digits:
        raise ConfigError(f"{what} is written {written}, which YAML reads as {value} (base 60); write the number itself")
    if isinstance(value, int) and len(digits) > 1 and digits[0] == "0" and digits[1] in "0123456789_":  # 05.5 is 5.5
        raise ConfigError(
            f"{what} is written {written}, which YAML reads as {value} (octal); write it without the leading zeros"
        )


def _checked(setting: dataclasses.Field[Any], value: Any, base: Path, what: str, written: str | None = None) -> Any:
    """`value` through the setting's check; ConfigError "`what` <why>" if it fails.

    `written`: the plain text in the file; a word YAML took for true or false (no, off, yes)
    is said as such, with the quotes that keep it a word.
    """
    try:
        return setting.metadata["check"](value, base)
    except ValueError as exc:
        hint = ""
        if isinstance(value, bool) and written is not None and written.lower() not in ("true", "false"):
            hint = f' (YAML reads {written} as {str(value).lower()}: write "{written}" in quotes for the word)'
        raise ConfigError(f"{what} {exc}{hint}") from None


def override(config: Config, flag: str, section: str, base: Path | None = None, **raw: Any) -> Config:
    """A copy with settings given on the command line (`--flag`), checked exactly as the file's are.

    Relative paths are taken from `base` (the shell's folder), not the config file's.
    """
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    values = {key: _checked(fields[key], value, base or Path.cwd(), f"{flag}: {section}.{key}") for key, value in raw.items()}
    return config.replace(section, **values)
