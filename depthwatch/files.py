"""What any layer needs of a file: what is at a path, its sha256, and writing one atomically.

Frames, model files and config files all come from folders other programs
control: `kind_of`, `link_problem` and `why_not_a_file` say, in words for a
one-line message, what is at a path when it is not a regular file (a folder, a
FIFO, a dangling link), without opening it. `sha256_of` is the one file hash
(model checksums, recognition, cache keys). `atomic_write` replaces one of
depthwatch's own files (caches, recorded checksums); maps and status files go
through `frames.writer.atomic_write`, which shares `write_all` and adds the
folder checks a watched folder needs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path

_CHUNK = 1 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


def sha256_of(path: Path) -> str:
    """The file's sha256 (hex), read in 1 MiB blocks; OSError if it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`, then fsync: what lands is whole, and survives a power cut."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def fsync_folder(fd: int) -> None:
    """Make a rename in the folder open as `fd` durable (where the filesystem allows it)."""
    try:
        os.fsync(fd)
    except OSError:
        pass


def atomic_write(target: Path, data: bytes) -> None:
    """Replace `target` with `data`: a reader sees the old file or the new one, never half.

    Written to a hidden temporary file beside it, fsynced, renamed over it, and
    the folder fsynced. OSError on failure, with the temporary file removed and
    the old file untouched.
    """
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(target.parent, os.O_RDONLY | _CLOEXEC)
    try:
        fsync_folder(folder)
    finally:
        os.close(folder)
