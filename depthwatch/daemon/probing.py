"""Format probing for the settle check: what a file's own bytes say about whether it is whole.

Read without blocking (a FIFO swapped in since the stat must not stall the
settle thread) and bounded: the magic bytes, an EXR's header and offset
table, a clip's boxes. Also why a symlink to a kernel file is not read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from depthwatch.errors import DepthwatchError
from depthwatch.frames.reading import open_checked
from depthwatch.imaging import formats
from depthwatch.media import wholeness

_T = TypeVar("_T")
#: Reads `n` bytes at `offset` (`os.pread` on the open file).
ReadAt = Callable[[int, int], bytes]

#: The "format" a clip is handed over with (its completeness judged by `wholeness.is_complete`).
CLIP = "clip"

#: Where the kernel's own files are (Linux): their size is no measure of what a read gives, so
#: a frame read from one would look as if it changed while being read, and go unreported.
_KERNEL_FOLDERS = ("/proc", "/sys")


def kernel_file(link: Path) -> str | None:
    """Why a symlink to a kernel file (`/proc/cpuinfo`, `/sys/...`) is not read, or None."""
    real = os.path.realpath(link)
    if any(real == top or real.startswith(top + "/") for top in _KERNEL_FOLDERS):
        return f"a symlink to {real!r}, a file of the kernel's, not an image file; not read"
    return None


def what_is_missing(fmt: str | None) -> str:
    """What an incomplete file of this format lacks, for the line that reports it."""
    if fmt == CLIP:
        return "a clip cut short, or without its index"
    if fmt == formats.EXR:
        return "not every chunk its offset table lists is there"
    if fmt == formats.DPX:
        return "less image data than its header lays out"
    if fmt == formats.TIFF:
        return "its header, or the data it points to, is not all there"
    return "no end marker"


def _reading(path: Path, read: Callable[[ReadAt], _T], unreadable: _T) -> _T:
    """`read(at)` with `at(offset, n)` reading the file at `path`; `unreadable` if it cannot be
    opened as a regular file, or a read fails (the job that reads it then reports why)."""
    try:
        # Without blocking: a FIFO swapped in since the stat must not stall this thread.
        fd, _ = open_checked(path, max_bytes=1 << 62)
    except DepthwatchError:
        return unreadable
    try:
        return read(lambda offset, n: os.pread(fd, n, offset))
    except OSError:
        return unreadable
    finally:
        os.close(fd)


def probe(path: Path, size: int) -> tuple[str | None, bool | None]:
    """The file's format by its magic bytes, and whether it carries the format's end marker
    (an EXR: every chunk its offset table lists).

    (None, None): not an image depthwatch reads (the pipeline says why); (None,
    True): unreadable, taken at once so the pipeline reports why. (fmt, None):
    the format has no end marker (TIFF): settled is all we know.
    """

    def read(at: ReadAt) -> tuple[str | None, bool | None]:
        fmt = formats.sniff(at(0, 16))
        if fmt is None:
            return None, None
        # An EXR's header and offset table are read too (bounded), to see every chunk is there.
        return fmt, formats.is_complete_at(fmt, at, size)

    return _reading(path, read, unreadable=(None, True))


def clip_state(path: Path, size: int) -> tuple[bool | None, bool]:
    """`wholeness.state_at` of a clip: whether its structure is whole, and whether its data still ends in zeros."""
    return _reading(path, lambda at: wholeness.state_at(at, size), unreadable=(True, False))
