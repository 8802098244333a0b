"""Which folders of a recursive watch inotify really watches: the kernel's list, not watchdog's word.

inotify watches one folder at a time, so a recursive watch folder is one
watch per folder under it, and every program of a user shares one limit on
them (`fs.inotify.max_user_watches`; 8192 on many distributions, and an
editor or a sync client may hold most of it). watchdog skips a folder it
cannot watch without a word, so frames written into it are never seen. The
kernel lists every watch an inotify descriptor holds in /proc/self/fdinfo: a
folder missing from that list is not watched, whatever watchdog believes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: One watch in an inotify descriptor's fdinfo: the inode (hex) and the kernel's device number (hex).
_WATCH = re.compile(r"^inotify wd:[0-9a-f]+ ino:(?P<ino>[0-9a-f]+) sdev:(?P<sdev>[0-9a-f]+)", re.M)

#: The limits that bind a user's inotify watches: the system's, and its user namespace's (Linux >= 5.11).
_LIMITS = (
    ("fs.inotify.max_user_watches", "/proc/sys/fs/inotify/max_user_watches"),
    ("user.max_inotify_watches", "/proc/sys/user/max_inotify_watches"),
)


def watched_folders() -> set[tuple[int, int]] | None:
    """(kernel device, inode) of every folder this process's inotify descriptors watch; None where /proc cannot say.

    The device is the kernel's own number for the filesystem (`sdev`), which is
    not always what stat() says (btrfs gives each subvolume a number of its
    own): `unwatched` learns how the two match from the watch folder itself.
    """
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return None
    watched: set[tuple[int, int]] = set()
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
                text = info.read()
        except (OSError, ValueError):  # closed meanwhile
            continue
        watched.update((int(m["sdev"], 16), int(m["ino"], 16)) for m in _WATCH.finditer(text))
    return watched


def unwatched(root: Path, watched: set[tuple[int, int]]) -> list[Path]:
    """The folders under `root` (itself watched) that no watch in `watched` covers; [] if it cannot tell.

    The watch folder is watched (its watch was made), so its own entry says
    which kernel device its filesystem is: the one stat() names, in the
    kernel's encoding, where that is among the entries with its inode (two
    drives' roots share inode numbers: 2 on ext4, 1 on tmpfs), else the one
    entry with its inode (btrfs, whose stat() numbers are not the kernel's).
    A folder on another filesystem below it (a mount, a btrfs subvolume) is
    matched by its own device, else by its inode alone. Links to folders are
    not followed (nor are they watched); a folder that cannot be listed is
    left out, as it cannot be watched or scanned either.
    """
    try:
        top = os.stat(root)
    except OSError:
        return []
    devices = {device for device, inode in watched if inode == top.st_ino}
    device = _kernel_device(top.st_dev)
    if device not in devices:
        if len(devices) != 1:  # not in the list (a watch being made again), or not one answer: say nothing
            return []
        device = devices.pop()
    inodes = {inode for _, inode in watched}
    missing = []
    for folder, _, _ in os.walk(root):
        try:
            st = os.stat(folder)
        except OSError:  # gone meanwhile
            continue
        if st.st_dev == top.st_dev:
            seen = (device, st.st_ino) in watched
        else:
            seen = (_kernel_device(st.st_dev), st.st_ino) in watched or st.st_ino in inodes
        if not seen:
            missing.append(Path(folder))
    return missing


def _kernel_device(st_dev: int) -> int:
    """A device number as the kernel prints it in fdinfo (`sdev`: major << 20 | minor), from stat()'s."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def topmost(folders: list[Path]) -> list[Path]:
    """`folders` without those under another of them (a scan of a folder covers its subfolders)."""
    kept: list[Path] = []
    for folder in sorted(folders, key=lambda f: len(f.parts)):
        if not any(folder.is_relative_to(top) for top in kept):
            kept.append(folder)
    return kept


def watch_limit() -> tuple[str, int] | None:
    """The limit on inotify watches that binds this process, and its sysctl's name; None where none is readable."""
    limits = []
    for name, path in _LIMITS:
        try:
            limits.append((int(Path(path).read_text()), name))
        except (OSError, ValueError):
            continue
    if not limits:
        return None
    value, name = min(limits)
    return name, value
