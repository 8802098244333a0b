"""File names as they go into log lines and messages: one line, whatever the name holds.

A frame's name is chosen by whoever writes into the watch folder. A newline in
it must not start a forged log line, and bytes that are not UTF-8 must not
break the log stream, and a bidirectional control must not make a name read
backwards; so control characters, bidi controls, backslashes and undecodable bytes
are written as Python escapes (`\\n`, `\\x1b`, `\\udcff`). Ordinary names,
spaces and non-ASCII letters included, are shown as they are.
"""

from __future__ import annotations

import os
import re

#: Control characters, backslashes, line and paragraph separators, undecodable bytes, and
#: the bidirectional controls (U+202E turns "gpj.exe" into "exe.jpg" on screen).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\\\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    return char.encode("unicode_escape", "backslashreplace").decode("ascii") if ord(char) < 0xD800 else f"\\u{ord(char):04x}"


def shown(name: str | os.PathLike[str]) -> str:
    """`name` (a path or a plain name) safe to put in one log line."""
    return _UNSAFE.sub(_escape, os.fspath(name))


#: What `shown` escapes, but a backslash: text already shown (a status file's last error) stays as the log has it.
_UNSAFE_BUT_ESCAPES = re.compile(_UNSAFE.pattern.replace("\\\\", ""))


def one_line(text: str) -> str:
    """`text` on one line and safe to print, escaped as `shown` escapes names, except that backslashes stay.

    For text that is shown already, in part or whole (a status's last error names
    its frame as the log does): `shown` again would double every backslash, and
    the name on screen would match neither the file nor the log.
    """
    return _UNSAFE_BUT_ESCAPES.sub(_escape, text)


def amount(value: float) -> str:
    """Enough figures to tell a size from its limit: 2.07 over 2, 0.23 over 0.1, 0.344 over 0.3 (never "0 over 0")."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
