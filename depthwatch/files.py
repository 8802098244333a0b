"""What any layer needs of a file: what is at a path, its sha256, and writing one atomically.

Frames, model files and config files all come from folders other programs
control: `kind_of`, `link_problem` and `why_not_a_file` say, in words for a
one-line message, what is at a path when it is not a regular file (a folder, a
FIFO, a dangling link), without opening it. `sha256_of` is the one file hash
(model checksums, recognition, cache keys). `replace_in` is the one atomic
replacement (a temporary file beside the target, fsynced, renamed, the folder
fsynced): `atomic_write` uses it for depthwatch's own files (caches, recorded
checksums), and `frames.writer.atomic_write` for maps and status files, adding
the folder checks a watched folder needs. `rename_noreplace` and `exchange` are the
two renames a plain `rename` cannot do in one step: into a name only while it
is absent, and swapping two names (a folder of frames for the last one).
`temp_name_for` is the one shape of a temporary name, whoever writes it: hidden,
ending `.dwtmp`, and carrying its writer's tag, so a sweep removes only a dead
writer's leftovers.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from depthwatch.processes import own_tag

_CHUNK = 1 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


#: Temporary names look like `.depth.jpg.4242-3f9a1c0b.dwtmp`: hidden, recognisable so
#: the watcher never takes them for input, and carrying the writer's pid so only a
#: dead process's leftovers are ever swept (a reload must not remove files in flight).
TEMP_SUFFIX = ".dwtmp"

_TEMP_TAIL = re.compile(r"\.(\d+)(?:t(\d+))?(?:h([0-9a-f]{6}))?-[0-9a-f]{8}" + re.escape(TEMP_SUFFIX) + "$")

#: Room the temporary name adds to the target's: "." + "." + pid + "t" + start + "h" + host + "-" + 8 hex digits + TEMP_SUFFIX.
_TEMP_EXTRA = 2 + 10 + 1 + 20 + 1 + 6 + 1 + 8 + len(TEMP_SUFFIX)


def temp_target_part(name: str) -> str:
    """The part of a target's name its temporary name carries: shortened so a name near the 255-byte limit still gets one."""
    return os.fsencode(name)[: 255 - _TEMP_EXTRA].decode(errors="ignore")


def temp_name_for(target: Path) -> Path:
    """A hidden temporary name beside `target`: the one shape every temporary file of depthwatch's takes."""
    return target.with_name(f".{temp_target_part(target.name)}.{own_tag()}-{secrets.token_hex(4)}{TEMP_SUFFIX}")


def is_temp_name(name: str) -> bool:
    """Whether `name` is shaped like one of `temp_name_for`'s (the watcher never takes one for input)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def temp_target_name(name: str) -> str | None:
    """The (possibly shortened) name of the file a temporary file was written for."""
    match = re.fullmatch(r"\.(.*)\.(?:\d+(?:t\d+)?(?:h[0-9a-f]{6})?-)?[0-9a-f]{8}" + re.escape(TEMP_SUFFIX), name, re.S)
    return match.group(1) if match else None


def temp_owner(name: str) -> tuple[int, int | None, str | None] | None:
    """The process that made a temporary file: its pid, start and host (`processes.own_tag`); None: a name without them."""
    match = _TEMP_TAIL.search(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else None, match.group(3)


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


def write_new(path: str | Path, data: bytes, *, dir_fd: int | None = None) -> None:
    """A new file at `path` (never one already there, never through a link) holding `data`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC | _NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def replace_in(folder_fd: int, name: str, data: bytes, temp: str, put: Callable[[str], None] | None = None) -> None:
    """Replace the file `name` in the folder open as `folder_fd` with `data`, atomically: the one way it is done.

    Written to the new file `temp` beside it (rename is atomic only within
    one filesystem), fsynced, renamed over `name` (or handed to `put`, which
    renames it on its own terms), and the folder fsynced so the rename
    survives a power cut. On any failure `temp` is removed and `name` is as it was.
    """
    try:
        write_new(temp, data, dir_fd=folder_fd)
        if put is None:
            os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        else:
            put(temp)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=folder_fd)
        except OSError:
            pass
        raise
    fsync_folder(folder_fd)


def atomic_write(target: Path, data: bytes) -> None:
    """Replace `target` with `data`: a reader sees the old file or the new one, never half.

    `replace_in` through the target's folder, with a hidden temporary name.
    OSError on failure, with the temporary file removed and the old file untouched.
    """
    folder = os.open(target.parent, os.O_RDONLY | _CLOEXEC)
    try:
        replace_in(folder, target.name, data, temp_name_for(target).name)
    finally:
        os.close(folder)


def sync_folder(folder: Path) -> None:
    """`fsync_folder` by path; a folder that cannot be opened is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return
    try:
        fsync_folder(fd)
    finally:
        os.close(fd)


# -- renames a plain rename cannot do ----------------------------------------------------

#: Linux renameat2(2) flags, and macOS renameatx_np(2)'s (sys/stdio.h).
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
RENAME_SWAP, RENAME_EXCL = 0x2, 0x4

#: (dir_fd, path, dir_fd, path, flags) -> 0, or -1 with errno set: the C call, as ctypes gives it.
_RenameCall = Callable[[int, bytes, int, bytes, int], int]

#: errno values that say "this system or filesystem cannot": fall back, do not fail.
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.EOPNOTSUPP}


def choose_renamer(platform: str, libc: object) -> tuple[_RenameCall, int, int, int] | None:
    """The C call that renames with flags on `platform`, with its (no-replace, exchange) flags and AT_FDCWD.

    Linux: glibc's renameat2 (2.28 and later); macOS: renameatx_np (10.12 and
    later; renamex_np's dir-fd form). None where neither is there: the callers
    fall back to what plain calls can do.
    """
    if platform.startswith("linux"):
        call, flags, cwd = getattr(libc, "renameat2", None), (RENAME_NOREPLACE, RENAME_EXCHANGE), -100
    elif platform == "darwin":
        call, flags, cwd = getattr(libc, "renameatx_np", None), (RENAME_EXCL, RENAME_SWAP), -2
    else:
        return None
    if call is None:
        return None
    try:
        call.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
        call.restype = ctypes.c_int
    except (AttributeError, TypeError):
        pass  # not a ctypes function (a stand-in): called as it is
    return call, flags[0], flags[1], cwd


def _libc() -> object | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_RENAMER = choose_renamer(sys.platform, _libc())


def _flagged_rename(src: str | Path, dst: str | Path, exchange: bool, src_dir_fd: int | None, dst_dir_fd: int | None) -> bool:
    """One flagged rename; False where the system or the filesystem has no such rename (fall back)."""
    if _RENAMER is None:
        return False
    call, noreplace, swap, cwd = _RENAMER
    ok = call(
        cwd if src_dir_fd is None else src_dir_fd, os.fsencode(src),
        cwd if dst_dir_fd is None else dst_dir_fd, os.fsencode(dst),
        swap if exchange else noreplace,
    )
    if ok == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), os.fspath(dst))


def rename_noreplace(src: str | Path, dst: str | Path, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
    """Rename `src` to `dst` only if `dst` does not exist: FileExistsError if it does, whatever came there when.

    A check and then a rename leave a gap a user's file can fall into (and be
    replaced); this is one step: renameat2(RENAME_NOREPLACE) on Linux,
    renameatx_np(RENAME_EXCL) on macOS, else a hard link (which never
    replaces) and an unlink of the old name. Only where neither can be done
    (a folder, a filesystem without links) is it a check and a rename.
    """
    if _flagged_rename(src, dst, False, src_dir_fd, dst_dir_fd):
        return
    try:
        os.link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.EISDIR, errno.EACCES, *_UNSUPPORTED):
            raise
    else:
        os.unlink(src, dir_fd=src_dir_fd)
        return
    if _exists(dst, dst_dir_fd):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def _exists(name: str | Path, dir_fd: int | None) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def exchange(a: str | Path, b: str | Path, atomic: bool = True) -> bool:
    """Swap what the names `a` and `b` hold (both must exist); True if it was one atomic step.

    renameat2(RENAME_EXCHANGE) on Linux, renameatx_np(RENAME_SWAP) on macOS:
    there is no moment when `b` is missing. Elsewhere (or on a filesystem
    without it) three renames through a hidden name beside `b` give the same
    end; a failure on the way puts `b` back as it was. False then. `atomic`
    False: those three renames anyway (for a watcher that cannot follow a swap).
    """
    if atomic and _flagged_rename(a, b, True, None, None):
        return True
    b = Path(b)
    aside = temp_name_for(b)  # there only between two renames
    os.rename(b, aside)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(aside, b)
        raise
    os.rename(aside, a)
    return False
