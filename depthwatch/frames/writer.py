"""Writing into folders other programs control: maps, sidecars and records, atomically, and only inside the allowed folders.

The replacement itself is `files.replace_in` (a hidden temporary file beside
the target, fsynced, renamed over it, the folder fsynced; on any failure the
temporary file is removed and the old target is untouched). This module adds
what a watched folder needs: the folder opened and checked to lie inside the
allowed ones (`folders.open_inside`), a check of whatever holds the name right
before the rename (`replacing`), one-line OutputErrors, the output folder made
(`ensure_folder`), and the sweep of dead writers' leftovers (temporary names
are `files.temp_name_for`'s, carrying the writer's pid).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from depthwatch.errors import OutputError
from depthwatch.files import (
    is_temp_name,
    rename_noreplace,
    replace_in,
    temp_name_for,
    temp_owner,
    temp_target_name,
    temp_target_part,
)
from depthwatch.frames import ownership
from depthwatch.frames.folders import LeadsOutside, Unchecked, inside, open_inside
from depthwatch.frames.replacing import ReplaceCheck
from depthwatch.logtext import shown
from depthwatch.media.cliprecord import SEQUENCE_MARKER, is_whole, marked_frames
from depthwatch.processes import left_behind

log = logging.getLogger("depthwatch.frames")

def open_folder(folder: Path, roots: tuple[Path, ...] = ()) -> int:
    """A descriptor of the real folder `folder` names now, checked to lie inside `roots` (see `folders.open_inside`).

    Writing relative to this descriptor means a folder swapped for a symlink
    after the job was made cannot carry the file elsewhere: what is checked is
    what is written into. No `roots`: no containment check (`once`).
    """
    try:
        return open_inside(folder, roots)
    except LeadsOutside:
        raise _outside(folder) from None
    except Unchecked as exc:
        raise OutputError(f"cannot check the output folder {shown(folder)}: {_reason(exc.cause)}") from None
    except OSError as exc:
        raise OutputError(f"cannot open the output folder {shown(folder)}: {_reason(exc)}") from None


def _outside(folder: Path) -> OutputError:
    """A folder for output that leads outside the allowed ones now: never retried."""
    return OutputError(
        f"the output folder {shown(folder)} now leads outside the configured folders (replaced by a link?); not writing",
        retryable=False,
    )


def ensure_folder(folder: Path, roots: tuple[Path, ...] = ()) -> None:
    """Outputs may go to a folder of their own (output.template 'depth/{stem}.png'): make it.

    Not created through a link that now leads outside `roots` (a folder outside
    is a write too), and not where the drive it was written on is gone: made
    with its parents, a cache drive's folder would come back on the system disk
    once the drive is ejected, its maps land there, said done, and the drive
    keep the last version's when it comes back (and where the mount point goes
    with the drive, the folder made takes its name, so the drive comes back
    under another). So the mount point each output folder lies on is noted when a
    map is first written there; while it is no longer mounted, a retryable
    OutputError: the frame waits until the drive is back. A folder never
    written to is made as configured, parents and all.
    """
    there = folder.is_dir()  # first: an automounted share is mounted by this look
    mount = _MOUNTS.get(folder)
    if mount is not None and not os.path.ismount(mount):
        raise OutputError(f"{shown(mount)} is no longer mounted (its drive ejected?); the map is made once it is back", retryable=True)
    if not there:
        if roots and not inside(folder, roots):
            raise _outside(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the output folder {shown(folder)}: {exc.strerror or exc}") from None
    if mount is None:
        if len(_MOUNTS) >= _MOST_FOLDERS:
            _MOUNTS.clear()  # a template with a folder per clip: noted again as maps are written
        _MOUNTS[folder] = _mount_point(folder)


#: The mount point each output folder was first written on (the nearest mount at or above it).
_MOUNTS: dict[Path, str] = {}
_MOST_FOLDERS = 4096


def _mount_point(folder: Path) -> str:
    path = os.path.abspath(folder)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def atomic_write(
    target: Path,
    data: bytes,
    roots: tuple[Path, ...] = (),
    *,
    folder_fd: int | None = None,
    may_replace: ReplaceCheck | None = None,
) -> None:
    """Replace `target` with `data` atomically; OutputError (one line) on failure.

    With `roots`, the target's folder must really be inside one of them when
    the file is written (see `open_folder`). `folder_fd`: an open descriptor
    of the folder to write into instead (the caller checked it and keeps it;
    `target.parent` is then only its name in messages). `may_replace`: asked
    about whatever holds the target's name, through the folder's descriptor,
    just before the rename; a reason refuses the write (not retried) and
    leaves that file as it is. Where the name was free when asked, the rename
    takes it only while it still is (`rename_noreplace`): a user's file saved
    there in between is asked about in turn, never replaced unasked.
    """
    own_folder = folder_fd is None
    folder = open_folder(target.parent, roots) if folder_fd is None else folder_fd
    try:
        _write_in(folder, target, data, may_replace)
    finally:
        if own_folder:
            os.close(folder)


def _write_in(folder: int, target: Path, data: bytes, may_replace: ReplaceCheck | None) -> None:
    put = None if may_replace is None else partial(_replace_if_allowed, folder, target=target, may_replace=may_replace)
    try:
        replace_in(folder, target.name, data, temp_name_for(target).name, put)
    except OSError as exc:
        retryable = exc.errno not in (errno.ENAMETOOLONG, errno.EINVAL, errno.EISDIR)
        raise OutputError(f"cannot write {shown(target.name)} in {shown(target.parent)}: {_reason(exc)}", retryable) from None


def _replace_if_allowed(folder: int, tmp: str, target: Path, may_replace: ReplaceCheck) -> None:
    for _ in range(3):  # a name that comes and goes under us: asked again, a few times
        refused = may_replace(folder, target.name)
        if refused:
            raise OutputError(
                f"{shown(target.name)} in {shown(target.parent)} {refused}: move it away or change output.template",
                retryable=False,
            )
        try:
            os.stat(target.name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            try:
                rename_noreplace(tmp, target.name, src_dir_fd=folder, dst_dir_fd=folder)
                return
            except FileExistsError:
                continue  # something came to the name since: is it ours?
        os.replace(tmp, target.name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    raise OutputError(f"{shown(target.name)} in {shown(target.parent)} keeps changing; not writing", retryable=True)


def sweep_temp_files(folder: Path) -> tuple[int, int]:
    """Remove temporary files that dead processes left in `folder`: (removed, could not remove).

    A file whose writer is still alive (this process in the middle of a write,
    or a `depthwatch once` beside it) is left alone. A temporary folder of
    frames loses only depthwatch's files (see `remove_own_folder`).
    """
    removed = failed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0, 0
    entries.sort(key=_newest_marker_first)
    for entry in entries:
        if not is_temp_name(entry.name) or temp_target_name(entry.name) is None:
            continue  # only depthwatch's own temporary naming
        folder_of_frames = entry.is_dir(follow_symlinks=False)  # an image sequence being written
        if not folder_of_frames and not entry.is_file(follow_symlinks=False):
            continue
        owner = temp_owner(entry.name)
        if owner is not None:
            try:
                modified = entry.stat(follow_symlinks=False).st_mtime_ns
            except OSError:
                continue  # gone meanwhile
            if not left_behind(*owner, modified):
                continue
        if folder_of_frames and _put_back(folder, entry.name):
            continue
        if folder_of_frames:
            gone = remove_own_folder(Path(entry.path))
        else:
            gone = _remove_quietly(entry.path)
        if gone:
            removed += 1
        else:
            failed += 1
    return removed, failed


def _newest_marker_first(entry: os.DirEntry[str]) -> int:
    if not is_temp_name(entry.name):
        return 0
    try:
        return -os.stat(os.path.join(entry.path, SEQUENCE_MARKER)).st_mtime_ns
    except OSError:
        return 0


def _put_back(folder: Path, name: str) -> bool:
    """A whole sequence a kill left at a temporary name while its own name is free: back into place.

    Three renames replace a sequence where an exchange cannot (see
    `files.exchange`); a kill between the first two leaves the name empty
    and the last good sequence (and the new one) aside. The newest whole one
    goes back; whatever then holds the name stays.
    """
    target = temp_target_name(name)
    if not target or not is_whole(folder / name) or os.path.lexists(folder / target):
        return False
    try:
        rename_noreplace(folder / name, folder / target)
    except OSError:
        return False
    log.warning("put back %s in %s: the whole sequence a stopped depthwatch left aside", shown(target), shown(folder))
    return True


def sweep_temp_files_below(folders: Iterable[Path], recursive: bool = False) -> tuple[int, int]:
    """`sweep_temp_files` in each folder (and, `recursive`, every folder below, links not followed)."""
    removed = failed = 0
    seen: set[str] = set()
    for top in folders:
        todo = [os.path.abspath(top)]
        while todo:
            here = todo.pop()
            if here in seen:
                continue
            seen.add(here)
            done, left = sweep_temp_files(Path(here))
            removed, failed = removed + done, failed + left
            if not recursive:
                continue
            try:
                todo.extend(
                    e.path for e in os.scandir(here) if e.is_dir(follow_symlinks=False) and not is_temp_name(e.name)
                )
            except OSError:
                continue
    return removed, failed


def remove_own_folder(folder: Path) -> bool:
    """Remove a folder of frames depthwatch was writing (or one it swapped out); whether it is gone.

    Only what is depthwatch's goes: the sequence marker, frames (by the names
    the marker gives, or the record they carry), its temporary files, and any
    file with another link (its data stays there: a user's file carried over
    to the new sequence by a hard link). A user's own file found there (moved
    across when a kill came mid-swap) keeps the folder, and itself.
    """
    frames = marked_frames(folder)
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                if is_temp_name(entry.name):
                    remove_own_folder(Path(entry.path))
                continue
            st = entry.stat(follow_symlinks=False)
            ours = (
                entry.name == SEQUENCE_MARKER
                or is_temp_name(entry.name)
                or st.st_nlink > 1
                or (stat.S_ISREG(st.st_mode) and frames is not None and frames.fullmatch(entry.name) is not None)
                or (stat.S_ISREG(st.st_mode) and ownership.is_depth_map(Path(entry.path)))
            )
        except OSError:
            continue
        if ours:
            _remove_quietly(entry.path)
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def sweep_temp_files_for(targets: Iterable[Path]) -> int:
    """Remove the temporary files of these targets that a killed writer left; returns how many.

    Only for targets nothing is writing any more (the farm client, once its job
    is over: a worker killed mid-write leaves its temporary file behind; a
    client killed mid-join its image sequence's temporary folder, of which
    only depthwatch's own files go: see `remove_own_folder`).
    """
    wanted: dict[Path, set[str]] = {}
    for target in targets:
        name = temp_target_part(target.name)
        wanted.setdefault(target.parent, set()).add(name)
    removed = 0
    for folder, names in wanted.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not is_temp_name(entry.name) or temp_target_name(entry.name) not in names:
                continue
            if entry.is_dir(follow_symlinks=False):
                gone = remove_own_folder(Path(entry.path))
            else:
                gone = _remove_quietly(entry.path)
            removed += gone
    return removed


def remove_own_in(folder: int, name: str) -> bool:
    """Remove depthwatch's own temporary file or folder of frames `name` from the folder held open as
    `folder`, wherever that folder is now; whether it is gone.

    A job holds its output folder's descriptor from the start: if the folder
    is moved away (and a link put in its place) while the job writes, its
    temporary file is in the moved folder, and a path would name the link's
    target instead. A folder of frames loses only depthwatch's files (see
    `remove_own_folder`).
    """
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return _remove_quietly(name, folder)
    where = _path_of(folder)
    if where is None:
        return False
    return remove_own_folder(Path(where) / name)


def _path_of(folder: int) -> str | None:
    """Where the folder held open as `folder` is now (Linux's /proc, macOS's F_GETPATH), or None."""
    try:
        if sys.platform == "darwin":
            raw = fcntl.fcntl(folder, getattr(fcntl, "F_GETPATH", 50), b"\0" * 1024)
            return os.fsdecode(raw.split(b"\0", 1)[0]) or None
        return os.readlink(f"/proc/self/fd/{folder}")
    except OSError:
        return None


def _remove_quietly(path: str, folder: int | None = None) -> bool:
    """Whether `path` is gone (removed now, or already)."""
    try:
        os.unlink(path, dir_fd=folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


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
