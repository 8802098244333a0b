"""The folder a frame is read from, held open until its map is written.

A frame's path names a folder only for as long as nobody re-points a link in
it or swaps the folder for a link to elsewhere. So the folder is opened as
the frame is read, the frame is read through that descriptor, and the map
beside it is written through the same one; just before the write, the path
must still lead to that very folder (device and inode), or the map is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from depthwatch.errors import FrameError, OutputError, Superseded
from depthwatch.frames.writer import really_inside
from depthwatch.logtext import shown


def open_frame_folder(source: Path, roots: tuple[Path, ...] = ()) -> int:
    """A descriptor of the folder `source` is in, opened as the frame is read; FrameError if unusable.

    The frame is read through it and its map written through it (when the map
    goes beside the frame), so a link in the path re-pointed, or the folder
    swapped for a link to elsewhere, while the frame waits for the model can
    never carry its map into another folder. With `roots`, the folder must
    really lie inside one of them now (checked on the descriptor: device and inode).
    """
    folder = source.parent
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Superseded("its folder vanished before the frame could be read") from None
    except OSError as exc:
        raise FrameError(f"cannot open its folder {shown(folder)}: {exc.strerror or exc}") from None
    try:
        if roots:
            here, there = os.fstat(fd), os.stat(os.path.realpath(folder))
            if not really_inside(folder, roots) or (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
                raise FrameError(f"its folder {shown(folder)} now leads outside the watch folders (replaced by a link?); not read")
    except OSError as exc:
        os.close(fd)
        raise FrameError(f"cannot check its folder {shown(folder)}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_frame_folder(source: Path, folder_fd: int) -> None:
    """OutputError unless `source`'s folder path still leads to the folder open on `folder_fd`.

    A map is made for the frame that was read; if the folder's path now names
    another folder (a link re-pointed, the watch folder swapped), the map is
    refused rather than written beside frames it was not made from.
    """
    folder = source.parent
    try:
        now, then = os.stat(folder), os.fstat(folder_fd)
        same = (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)
    except OSError:
        same = False
    if not same:
        raise OutputError(
            f"its folder {shown(folder)} is no longer the folder the frame was read from "
            "(a link re-pointed, or the folder moved or replaced); its map is not written",
            retryable=False,
        )
