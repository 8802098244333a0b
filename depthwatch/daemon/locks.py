"""One daemon per watch folder: a lock held for the process's life.

Two daemons on one folder would race for every frame and redo most of them.
Each watch folder gets a lock file in the user's runtime folder, named by a
hash of the folder's real path (so `tmp`, `./tmp` and a symlink to it are one
folder), held with `flock` from start-up until the process ends. The kernel
drops the lock when the process dies, however it dies, so a crash or SIGKILL
leaves nothing stale behind and the next start simply takes it. The lock lives
outside the watched folder so nothing appears among the user's frames; it
therefore guards against a second daemon of the same user on the same machine,
not against one on another machine sharing a network volume.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import platformdirs

from depthwatch.errors import DepthwatchError
from depthwatch.logtext import shown

#: sysexits.h EX_TEMPFAIL: the condition clears by itself once the other daemon
#: stops, so a service manager retrying later is right (78, EX_CONFIG, would tell
#: systemd never to retry, though nothing in the config is wrong).
EX_TEMPFAIL = 75


class AlreadyRunning(DepthwatchError):
    """Another depthwatch process holds a watch folder's lock."""

    exit_code = EX_TEMPFAIL


def lock_folder() -> Path:
    """Where the lock files live: the user's runtime folder, else a per-user temp folder."""
    if sys.platform == "darwin":
        candidate: str | None = platformdirs.user_runtime_dir("depthwatch", appauthor=False)
    else:  # $XDG_RUNTIME_DIR only where the session set it (platformdirs warns otherwise)
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        candidate = os.path.join(runtime, "depthwatch") if runtime else None
    if candidate:
        try:
            Path(candidate).mkdir(parents=True, exist_ok=True, mode=0o700)
            if os.access(candidate, os.W_OK):
                return Path(candidate)
        except OSError:
            pass
    base = Path(tempfile.gettempdir()) / f"depthwatch-{os.getuid()}"
    try:
        base.mkdir(exist_ok=True, mode=0o700)
        st = os.lstat(base)
    except OSError as exc:
        raise DepthwatchError(f"cannot make the lock folder {base}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise DepthwatchError(f"{base} is not a folder of this user's; remove it so depthwatch can keep its locks there")
    return base


def lock_path(folder: Path) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.realpath(folder))).hexdigest()[:24]
    return lock_folder() / f"watch-{key}.lock"


def _acquire(folder: Path) -> int:
    path = lock_path(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = _owner(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise AlreadyRunning(
                f"another depthwatch (pid {owner or 'unknown'}) is already watching {shown(folder)}; "
                "stop it first, or watch another folder"
            ) from None
        raise DepthwatchError(f"cannot lock {shown(path)}: {exc.strerror or exc}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n{os.path.realpath(folder)}\n".encode(errors="surrogateescape"))
    return fd


def _owner(fd: int) -> str | None:
    try:
        first = os.pread(fd, 64, 0).split(b"\n", 1)[0].strip()
    except OSError:
        return None
    return first.decode() if first.isdigit() else None


class FolderLocks:
    """The locks this process holds, one per watch folder."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def hold(self, folders: Iterable[Path]) -> None:
        """Hold exactly the locks of `folders`; AlreadyRunning (holding none new) if one is taken."""
        wanted = {os.path.realpath(f): Path(f) for f in folders}
        new: dict[str, int] = {}
        try:
            for key, folder in wanted.items():
                if key not in self._held:
                    new[key] = _acquire(folder)
        except BaseException:
            for fd in new.values():
                os.close(fd)
            raise
        for key in [k for k in self._held if k not in wanted]:
            os.close(self._held.pop(key))
        self._held.update(new)

    def release(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()
