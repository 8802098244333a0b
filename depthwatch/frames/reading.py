"""Reading a frame from a folder other programs control, without trusting what is there.

Between the moment a frame is found and the moment it is read, anything can
take its place: a FIFO (an `open` that never returns), a link to
`/dev/urandom` (a read that never ends), a sparse file of many gigabytes.
So the file is opened without blocking and, where links are not to be
followed, without following one; what was opened is checked on its own
descriptor (a regular file, under the size limit) and only then read, and
never more than the limit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from depthwatch.errors import FrameError, Superseded, Vanished
from depthwatch.files import kind_of, link_problem
from depthwatch.frames.folders import inside
from depthwatch.frames.job import Signature, signature_from
from depthwatch.logtext import amount

#: Default for `daemon.max_file_mb`: far above any frame, far below a machine's memory.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _not_a_file(mode: int) -> FrameError:
    return FrameError(f"is {kind_of(mode)}, not an image file; not read")


def open_checked(
    path: Path, *, follow_links: bool = True, max_bytes: int = DEFAULT_MAX_BYTES, dir_fd: int | None = None
) -> tuple[int, os.stat_result]:
    """An open read-only descriptor of the regular file at `path`, and its fstat.

    FrameError (one line) for anything that is not a regular file of at most
    `max_bytes`; Superseded if it vanished. The caller closes the descriptor.
    `dir_fd`: `path` is a name inside the folder open on that descriptor
    (the file is looked for there, whatever the folder's path now leads to).
    """
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_links)
    except FileNotFoundError:
        if follow_links and dir_fd is None and os.path.islink(path):
            raise FrameError(link_problem(path) or "a dangling symlink") from None
        if follow_links and dir_fd is not None:
            try:
                target = os.readlink(path, dir_fd=dir_fd)
            except OSError:
                pass  # not a link: it just vanished
            else:
                raise FrameError(f"a symlink to {target!r}, which does not exist") from None
        raise Vanished("the file vanished before it could be read") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FrameError("a symlink loop; not followed") from None
        raise FrameError(f"cannot read the file: {exc.strerror or exc}") from None
    if stat.S_ISLNK(before.st_mode):
        raise FrameError("a symlink; not followed (set watch.follow_symlinks to allow it)")
    if not stat.S_ISREG(before.st_mode):
        raise _not_a_file(before.st_mode)  # refused before opening: opening a device can have effects
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow_links else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Vanished("the file vanished before it could be read") from None
    except PermissionError:
        raise FrameError("permission denied reading the file; check its permissions") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FrameError("a symlink; not followed (set watch.follow_symlinks to allow it)") from None
        raise FrameError(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the check and the open
            raise _not_a_file(st.st_mode)
        if st.st_size > max_bytes:
            raise FrameError(
                f"is {amount(st.st_size / 2**20)} MB, over the limit of {amount(max_bytes / 2**20)} MB; "
                "raise daemon.max_file_mb to accept it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(fd: int, size: int, max_bytes: int) -> bytes:
    """Up to `size` bytes (what fstat said), never more than `max_bytes` + 1."""
    limit = min(size, max_bytes) + 1  # one more than expected shows a file still growing
    chunks = []
    while limit > 0:
        try:
            chunk = os.read(fd, min(limit, 1 << 22))
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def read_file(
    path: Path, *, follow_links: bool = True, max_bytes: int = DEFAULT_MAX_BYTES, dir_fd: int | None = None
) -> tuple[bytes, os.stat_result]:
    """The whole regular file at `path` (a name in `dir_fd`'s folder, if given) and its fstat after reading."""
    fd, st = open_checked(path, follow_links=follow_links, max_bytes=max_bytes, dir_fd=dir_fd)
    try:
        data = read_bounded(fd, st.st_size, max_bytes)
        after = os.fstat(fd)
    except OSError as exc:
        raise FrameError(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FrameError(
            f"grew past the limit of {amount(max_bytes / 2**20)} MB while being read; raise daemon.max_file_mb to accept it"
        )
    return data, after


def read_head(path: Path, size: int = 65536) -> tuple[bytes, os.stat_result] | None:
    """The first bytes of a regular file (no FIFO, no device, no link followed), or None."""
    try:
        fd, st = open_checked(path, follow_links=False, max_bytes=1 << 62)
    except FrameError:
        return None
    try:
        return read_bounded(fd, min(size, st.st_size), size), st
    except OSError:
        return None
    finally:
        os.close(fd)


def read_source(
    path: Path,
    signature: Signature | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    link_root: Path | None = None,
    folder_fd: int | None = None,
) -> tuple[bytes, os.stat_result]:
    """A frame's bytes, read once; FrameError if it vanished or is unreadable.

    Whatever now sits at `path` is checked on its open descriptor before a byte
    is read: a regular file (not a FIFO, a device, a socket) of at most
    `max_bytes`. With `link_root`, a symlink is followed only to a file inside
    that folder, checked now, not when the frame was found. Superseded if it
    is no longer the version that was found complete (`signature`), or changed
    while being read: an editor rewriting a frame in place will have the newer
    version picked up by its own event. `folder_fd`: an open descriptor of
    `path`'s folder (see `folders.open_frame_folder`); the frame is looked for
    in that very folder, whatever its path leads to by now.
    """
    follow = True
    if folder_fd is not None and not (link_root is not None and os.path.islink(path)):
        try:
            before: os.stat_result | None = os.stat(path.name, dir_fd=folder_fd)
        except OSError:
            before = None
        data, after = read_file(Path(path.name), max_bytes=max_bytes, dir_fd=folder_fd)
        return _unchanged_while_read(before, data, after, signature)
    if link_root is not None and os.path.islink(path):
        problem = link_problem(path)
        if problem:
            raise FrameError(problem)
        real = os.path.realpath(path)
        if not inside(real, (link_root,), strictly=True):
            raise FrameError("a symlink to outside the watch folder; not followed (set watch.follow_symlinks to allow it)")
        path, follow = Path(real), False  # the target itself, without following another link
    before = os.stat(path) if os.path.exists(path) else None
    data, after = read_file(path, follow_links=follow, max_bytes=max_bytes)
    return _unchanged_while_read(before, data, after, signature)


def _unchanged_while_read(
    before: os.stat_result | None, data: bytes, after: os.stat_result, signature: Signature | None
) -> tuple[bytes, os.stat_result]:
    if before is None or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(data) != after.st_size:
        raise Superseded("the file changed while it was being read")
    if signature is not None and signature != signature_from(after):
        raise Superseded("the file changed after it was found complete")
    return data, after
