"""Atomic file replacement: a reader sees the old file or the new one, never half.

The bytes go to a hidden temporary file in the target's own folder (rename is
atomic only within one filesystem), are flushed and fsynced, then renamed over
the target; the folder is fsynced so the rename survives a power cut. On any
failure the temporary file is removed and the old target is untouched.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from depthwatch.errors import OutputError

#: Temporary names look like `.depth.jpg.3f9a1c.dwtmp`: hidden, and recognisable
#: so the watcher never takes them for input and a restart can sweep leftovers.
TEMP_SUFFIX = ".dwtmp"


#: Room the temporary name adds to the target's: "." + "." + 8 hex digits + TEMP_SUFFIX.
_TEMP_EXTRA = 2 + 8 + len(TEMP_SUFFIX)


def temp_name_for(target: Path) -> Path:
    # Shortened if needed so a target name near the 255-byte limit still gets a temp name.
    name = os.fsencode(target.name)[: 255 - _TEMP_EXTRA].decode(errors="ignore")
    return target.with_name(f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def atomic_write(target: Path, data: bytes) -> None:
    """Replace `target` with `data` atomically; OutputError (one line) on failure."""
    tmp = temp_name_for(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        _remove_quietly(tmp)
        retryable = exc.errno not in (errno.ENAMETOOLONG, errno.EINVAL, errno.EISDIR)
        raise OutputError(f"cannot write {target.name} in {target.parent}: {_reason(exc)}", retryable) from None
    except BaseException:
        _remove_quietly(tmp)
        raise
    _fsync_dir(target.parent)


def sweep_temp_files(folder: Path) -> int:
    """Remove temporary files a killed process left in `folder`; returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if is_temp_name(entry.name) and entry.is_file(follow_symlinks=False):
            _remove_quietly(Path(entry.path))
            removed += 1
    return removed


def sweep_temp_files_for(targets: Iterable[Path]) -> int:
    """Remove the temporary files of these targets that a killed writer left; returns how many.

    Only for targets nothing is writing any more (the farm client, once its job
    is over: a worker killed mid-write leaves its temporary file behind).
    """
    wanted: dict[Path, set[str]] = {}
    for target in targets:
        name = os.fsencode(target.name)[: 255 - _TEMP_EXTRA].decode(errors="ignore")
        wanted.setdefault(target.parent, set()).add(name)
    removed = 0
    for folder, names in wanted.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if is_temp_name(entry.name) and entry.name[1 : -(len(TEMP_SUFFIX) + 9)] in names:
                _remove_quietly(Path(entry.path))
                removed += 1
    return removed


def _remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (is the folder writable?)"
    if exc.errno == errno.EROFS:
        return "the volume is read-only"
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the filesystem; shorten the frame's name or output.template"
    if exc.errno == errno.ENOENT:
        return "the folder does not exist"
    return exc.strerror or str(exc)
