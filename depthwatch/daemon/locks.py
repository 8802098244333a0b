"""One daemon per watch folder, and no two daemons on folders inside one another.

Two daemons on one folder would race for every frame and redo most of them; so
would one watching a parent folder recursively beside one on its child. Each
folder has a lock file, named by a hash of its real path (so `tmp`, `./tmp` and
a symlink to it are one folder), in one per-user folder whatever the
environment: `/tmp/depthwatch-<uid>` (not $XDG_RUNTIME_DIR or $TMPDIR, which
differ between a service and a terminal), or the user's runtime folder on
macOS. A daemon holds, with `flock`, from start-up until the process ends:

- an exclusive lock on each watch folder's "watch" file, which records its pid
  for the message a second daemon gives;
- with `watch.recursive`, an exclusive lock on each watch folder's "tree" file
  too: the folder and everything inside it are this daemon's;
- a shared lock on the "tree" file of each of their parent folders, so a
  recursive daemon on a parent and any daemon on a folder inside it collide
  whichever starts first, while daemons on sibling folders, or on a folder and
  its child without `recursive`, watch different files and share the parents'
  locks.

The kernel drops the locks when the process dies, however it dies, so a crash or
SIGKILL leaves nothing stale behind and the next start simply takes them. Held
files are touched hourly, so a cleaner of old files in /tmp leaves them alone.
The locks live outside the watched folders: nothing appears among the user's
frames and no open file keeps a volume from being ejected. They guard against a
second daemon of the same user on the same machine, not one of another user or
on another machine sharing a network volume.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

import platformdirs

from depthwatch.errors import EX_TEMPFAIL, DepthwatchError
from depthwatch.logtext import shown


_FIX = "stop it first, or list both folders in one daemon's watch.folders"


class AlreadyRunning(DepthwatchError):
    """Another depthwatch process holds a watch folder's lock."""

    exit_code = EX_TEMPFAIL


def lock_folder() -> Path:
    """Where the lock files live: the same folder for every daemon of this user."""
    if sys.platform == "darwin":
        candidate = Path(platformdirs.user_runtime_dir("depthwatch", appauthor=False))
        try:
            candidate.mkdir(parents=True, exist_ok=True, mode=0o700)
            if os.access(candidate, os.W_OK):
                return candidate
        except OSError:
            pass
    base = Path("/tmp") / f"depthwatch-{os.getuid()}"
    try:
        base.mkdir(exist_ok=True, mode=0o700)
        st = os.lstat(base)
    except OSError as exc:
        raise DepthwatchError(f"cannot make the lock folder {base}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise DepthwatchError(f"{base} is not a folder of this user's; remove it so depthwatch can keep its locks there")
    return base


#: The two locks a folder has (see the module's docstring): a key is a kind and a real path.
WATCH, TREE = "watch", "tree"


def _key(kind: str, real: str) -> str:
    return f"{kind}:{real}"


def _real(key: str) -> str:
    return key.split(":", 1)[1]


def lock_path(key: str) -> Path:
    kind, real = key.split(":", 1)
    digest = hashlib.sha256(os.fsencode(os.path.realpath(real))).hexdigest()[:24]
    return lock_folder() / f"{kind}-{digest}.lock"


def _lock(key: str, mode: int) -> int:
    """An fd of `key`'s lock file holding a flock in `mode`; BlockingIOError if one conflicts."""
    path = lock_path(key)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise BlockingIOError(exc.errno, exc.strerror) from None
        raise DepthwatchError(f"cannot lock {shown(path)}: {exc.strerror or exc}") from None
    if mode == fcntl.LOCK_EX:
        _record(fd, key)
    return fd


def _record(fd: int, key: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n{_real(key)}\n".encode(errors="surrogateescape"), 0)


def _owner(key: str) -> str | None:
    """The pid recorded in `key`'s lock file by the daemon that holds it exclusively."""
    try:
        with open(lock_path(key), "rb") as f:
            first = f.read(64).split(b"\n", 1)[0].strip()
    except (OSError, DepthwatchError):
        return None
    return first.decode() if first.isdigit() else None


def _flocks(path: Path) -> list[tuple[str, str]] | None:
    """(READ or WRITE, pid) of each flock held on `path` now, ours included, from /proc/locks; None off Linux."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    held = []
    for line in lines:
        fields = line.split()  # "1: FLOCK ADVISORY READ 1234 08:01:5678 0 EOF"; a waiter has "->"
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, ino = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(ino))
        except ValueError:
            continue
        if found == where:
            held.append((fields[3], fields[4]))
    return held


def _readers(key: str) -> list[str]:
    """The pids holding a shared lock on `key`'s lock file (from /proc/locks: Linux only)."""
    try:
        held = _flocks(lock_path(key)) or []
    except DepthwatchError:
        return []
    return sorted({pid for kind, pid in held if kind == "READ" and pid != str(os.getpid())}, key=int)


def _flocks_on(path: Path) -> int | None:
    """How many flocks are held on `path` now, ours included (from /proc/locks); None: unknown (not Linux)."""
    held = _flocks(path)
    return len(held) if held else None  # not even ours found: the device is named otherwise there, so unknown


class LockLost(AlreadyRunning):
    """A lock this daemon held is gone: flock(2) let go of it to change it, and another process took it."""


def _change(fd: int, key: str, old: int, mode: int) -> None:
    """Change the flock `fd` holds on `key`'s file from `old` to `mode`; BlockingIOError, still holding `old`, if one conflicts.

    flock(2) changes a lock by letting go of it and then taking the new one,
    on Linux and BSD alike: an upgrade to exclusive that fails leaves nothing
    held, and another daemon could take the lock before it is taken back. So
    an upgrade is not tried while /proc/locks shows another holder; where it
    cannot tell (macOS), or one came meanwhile, the old lock is taken back, and
    LockLost says so if even that fails.
    """
    if mode == fcntl.LOCK_EX:
        held = _flocks_on(lock_path(key))
        if held is not None and held > 1:  # another holder: the upgrade would fail, letting go of ours
            raise BlockingIOError(errno.EWOULDBLOCK, "held by another process")
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        _restore(fd, key, old)
        raise


def _restore(fd: int, key: str, mode: int) -> None:
    """Take `mode` back on `fd` after a change that let go of it; LockLost (naming the holder) if another has it now."""
    try:
        if mode == fcntl.LOCK_EX and (_flocks_on(lock_path(key)) or 1) > 1:
            raise BlockingIOError(errno.EWOULDBLOCK, "held by another process")  # trying would let go of ours too
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError:
        holder = _owner(key) if mode == fcntl.LOCK_SH else None
        by = f"another depthwatch (pid {holder})" if holder else "another process"
        raise LockLost(
            f"lost the lock on {shown(_real(key))} while changing it: {by} took it meanwhile, so nothing keeps "
            f"the two daemons off each other's folders now; {_FIX}, then restart this one"
        ) from None


def _pids(pids: list[str]) -> str:
    return f"pid {', '.join(pids)}" if pids else "pid unknown"


def _refusal(folder: Path, taken: str, mode: int) -> AlreadyRunning:
    """Why `taken`'s lock (of watch folder `folder` itself, or of a parent of it) could not be had."""
    real = _real(taken)
    if mode == fcntl.LOCK_SH:  # a parent folder another daemon watches recursively
        return AlreadyRunning(
            f"another depthwatch ({_pids([p for p in [_owner(taken)] if p])}) is watching {shown(real)} "
            f"with its subfolders, which holds {shown(folder)}; {_FIX}"
        )
    if taken.startswith(WATCH):  # a daemon on this very folder
        return AlreadyRunning(
            f"another depthwatch (pid {_owner(taken) or 'unknown'}) is already watching {shown(folder)}; "
            "stop it first, or watch another folder"
        )
    return AlreadyRunning(f"another depthwatch ({_pids(_readers(taken))}) is watching a folder inside {shown(folder)}; {_FIX}")


def _wanted(folders: Iterable[Path], recursive: bool) -> dict[str, int]:
    """Lock key -> flock mode: exclusive for each watch folder (and its tree when recursive),
    shared for the tree of each of their parents."""
    reals = {os.path.realpath(f) for f in folders}
    wanted = {_key(WATCH, real): fcntl.LOCK_EX for real in reals}
    if recursive:
        wanted.update({_key(TREE, real): fcntl.LOCK_EX for real in reals})
    for real in reals:
        child, parent = real, os.path.dirname(real)
        while parent != child:
            wanted.setdefault(_key(TREE, parent), fcntl.LOCK_SH)
            child, parent = parent, os.path.dirname(parent)
    return wanted


class FolderLocks:
    """The locks this process holds: real path -> (fd, mode)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, int]] = {}

    def hold(self, folders: Iterable[Path], *, recursive: bool = False) -> None:
        """Hold exactly the locks of `folders`; AlreadyRunning (holding none new) if one is taken.

        A lock held in the other mode (a watch folder that was a parent before a
        reload, or the reverse) is changed in place, and changed back on failure.
        """
        folders = [Path(f) for f in folders]
        wanted = _wanted(folders, recursive)
        new: dict[str, tuple[int, int]] = {}
        changed: dict[str, int] = {}
        try:
            # The watch locks first: a second daemon on the very folder is told so, not of a tree.
            for real, mode in sorted(wanted.items(), key=lambda item: (item[1] == fcntl.LOCK_SH, not item[0].startswith(WATCH), item[0])):
                held = self._held.get(real)
                if held is not None and held[1] == mode:
                    continue
                try:
                    if held is None:
                        new[real] = (_lock(real, mode), mode)
                    else:
                        try:
                            _change(held[0], real, held[1], mode)
                        except LockLost:
                            os.close(self._held.pop(real)[0])  # it holds nothing now: forget it
                            raise
                        changed[real] = held[1]
                        if mode == fcntl.LOCK_EX:
                            _record(held[0], real)
                except BlockingIOError:
                    folder = next(f for f in folders if os.path.commonpath([_real(real), os.path.realpath(f)]) == _real(real))
                    raise _refusal(folder, real, mode) from None
        except BaseException as exc:
            try:
                self._undo(new, changed)
            except LockLost as lost:
                raise LockLost(f"{exc}; and {lost}") from None
            raise
        for real, mode in changed.items():
            self._held[real] = (self._held[real][0], wanted[real])
        for real in [r for r in self._held if r not in wanted]:
            os.close(self._held.pop(real)[0])
        self._held.update(new)

    def _undo(self, new: dict[str, tuple[int, int]], changed: dict[str, int]) -> None:
        """Back to the locks held before a `hold` that failed: the new ones closed, the changed ones changed back.

        A lock that cannot be changed back is forgotten (its descriptor closed)
        and raised as LockLost once the others are back: the daemon must not
        believe it holds what it does not.
        """
        for fd, _ in new.values():
            os.close(fd)
        lost: list[LockLost] = []
        for real, mode in changed.items():
            try:
                _restore(self._held[real][0], real, mode)
            except LockLost as exc:
                os.close(self._held.pop(real)[0])
                lost.append(exc)
        if lost:
            raise lost[0]

    def refresh(self) -> None:
        """Touch the held lock files, so that cleaners of old files in /tmp leave them be."""
        for fd, _ in self._held.values():
            try:
                os.utime(fd)
            except OSError:
                pass

    def release(self) -> None:
        for fd, _ in self._held.values():
            os.close(fd)
        self._held.clear()
