"""What any layer needs to know about a path before trusting it.

Frames, model files and config files all come from folders other programs
control: these say, in words for a one-line message, what is at a path when it
is not a regular file (a folder, a FIFO, a dangling link), without opening it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def kind_of(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def link_problem(path: Path) -> str | None:
    """Why a symlink cannot be followed at all (dangling, a loop), or None."""
    try:
        os.stat(path)
    except FileNotFoundError:
        try:
            target = os.readlink(path)
        except OSError:
            return None  # not a link: it just vanished
        return f"a symlink to {target!r}, which does not exist"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop; not followed"
        return None
    return None


def why_not_a_file(path: Path) -> str:
    """Why `path` is not a regular file, for messages: "is a folder", "does not exist", ..."""
    problem = link_problem(path) if os.path.islink(path) else None
    if problem:
        return f"is {problem}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    kind = kind_of(st.st_mode)
    return f"is {kind}, not a file" if kind else "is a file"
