"""The folders a frame's reads and writes must stay in: inside the allowed roots, and the very folder that was checked.

A path names a folder only for as long as nobody re-points a link in it or
swaps the folder for a link to elsewhere. So containment is judged on real
paths (`inside`, the one test of "this path is inside that root": the rules,
the reader, the writer, the clips and the API all ask it), and a folder is
opened once and checked on its descriptor (`open_inside`): what is checked is
what is read from and written into. The frame's folder is opened as the frame
is read and held until its map is written beside it; just before the write,
the path must still lead to that very folder (device and inode), or the map
is refused (`check_frame_folder`).
"""

from __future__ import annotations

import os
from pathlib import Path

from depthwatch.errors import FrameError, OutputError, Vanished
from depthwatch.logtext import shown

_OPEN_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def inside(path: str | Path, roots: tuple[Path, ...] | list[Path], *, strictly: bool = False) -> bool:
    """Whether `path`, every link in it resolved, lies inside one of `roots` (resolved too).

    `strictly`: below a root, never the root itself (a file a link leads to).
    """
    real = os.path.realpath(path)
    for root in roots:
        top = os.path.realpath(root)
        if (real == top and not strictly) or real.startswith(top.rstrip(os.sep) + os.sep):
            return True
    return False


def opened_as(path: str | Path, fd: int) -> bool:
    """Whether `path` leads now to the very file or folder open as `fd` (device and inode); OSError if it cannot be looked at."""
    now, then = os.stat(path), os.fstat(fd)
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)


class LeadsOutside(Exception):
    """The folder opened lies outside the roots now (a link re-pointed, the folder swapped for one)."""


class Unchecked(Exception):
    """The folder was opened but could not be checked; `cause` says why."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def open_inside(folder: Path, roots: tuple[Path, ...] = ()) -> int:
    """A descriptor of the real folder `folder` names now, checked to lie inside `roots`.

    OSError if it cannot be opened, `Unchecked` if it cannot be checked,
    `LeadsOutside` if it is not inside `roots` (or the path moved on while it
    was opened); each caller says so in its own words. No `roots`: no check.
    """
    fd = os.open(folder, _OPEN_FOLDER)
    if not roots:
        return fd
    try:
        if not inside(folder, roots) or not opened_as(os.path.realpath(folder), fd):
            raise LeadsOutside()
    except OSError as exc:
        os.close(fd)
        raise Unchecked(exc) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        return open_inside(folder, roots)
    except LeadsOutside:
        raise FrameError(f"its folder {shown(folder)} now leads outside the watch folders (replaced by a link?); not read") from None
    except Unchecked as exc:
        raise FrameError(f"cannot check its folder {shown(folder)}: {exc.cause.strerror or exc.cause}") from None
    except FileNotFoundError:
        raise Vanished("its folder vanished before the frame could be read") from None
    except OSError as exc:
        raise FrameError(f"cannot open its folder {shown(folder)}: {exc.strerror or exc}") from None


def check_frame_folder(source: Path, folder_fd: int) -> None:
    """OutputError unless `source`'s folder path still leads to the folder open on `folder_fd`.

    A map is made for the frame that was read; if the folder's path now names
    another folder (a link re-pointed, the watch folder swapped), the map is
    refused rather than written beside frames it was not made from.
    """
    folder = source.parent
    try:
        same = opened_as(folder, folder_fd)
    except OSError:
        same = False
    if not same:
        raise OutputError(
            f"its folder {shown(folder)} is no longer the folder the frame was read from "
            "(a link re-pointed, or the folder moved or replaced); its map is not written",
            retryable=False,
        )
