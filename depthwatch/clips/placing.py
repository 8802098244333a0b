"""The temporary name and the rename: a depth clip is put in place only once whole, and only over one of depthwatch's.

The clip is written under a temporary name beside its final one (the
writer's pid in it, so a start-up sweep removes only a dead writer's) and
renamed into place once whole: an editor never sees a partial clip. Only a
depth clip depthwatch made is ever replaced. An image sequence is a folder
of frames, swapped for the last one in one step, keeping the files a user
saved in it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from depthwatch.clips import timeline
from depthwatch.errors import FrameError, OutputError
from depthwatch.files import exchange, is_temp_name, rename_noreplace, sync_folder, temp_name_for, write_new
from depthwatch.frames import ownership
from depthwatch.frames.folders import inside
from depthwatch.frames.rules import clips_sharing
from depthwatch.frames.writer import remove_own_folder, remove_own_in
from depthwatch.logtext import shown
from depthwatch.media import cliprecord

log = logging.getLogger("depthwatch.clips")


def refuse_outside(folder: Path, roots: tuple[Path, ...]) -> None:
    """A depth clip's folder must lie inside `roots` (empty: anywhere), also one that is there already.

    Asked before `writer.ensure_folder` makes it: a clip is long work, so a
    folder that leads outside is refused before the first frame, where a
    frame's map learns it only when its folder is opened to write.
    """
    if roots and not inside(folder if folder.exists() else folder.parent, roots):
        raise OutputError(f"the output folder {shown(folder)} leads outside the configured folders; not writing", retryable=False)


def rename_into_place(
    temp: Path, final: Path, roots: tuple[Path, ...], frame_name: str | None = None, swap: bool = True
) -> None:
    """The whole clip (file or folder of frames) replaces the last one in one rename.

    Only a depth clip depthwatch made is replaced: anything else at the name
    (an editor's own clip called A001_depth.mov, a folder of their frames) stays,
    and a name that was free is taken only while it still is. A sequence
    folder is swapped for the last one in one step (`files.exchange`), and
    replaces only its own frames: a user's file saved in it stays (see
    `_swap_sequence`). `frame_name`: the sequence's frame names (`{frame:04d}.png`);
    `swap` False: three renames instead of the exchange (see `Settings.swap_folders`).
    """
    refuse_replacing(final)
    if roots and not inside(final.parent, roots):
        raise OutputError(f"the output folder {shown(final.parent)} now leads outside the configured folders; not writing", retryable=False)
    try:
        if not temp.is_dir():
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            assert frame_name is not None
            _mark_whole(temp, frame_name)
            sync_folder(temp)
        if temp.is_dir() and final.is_dir() and not final.is_symlink():
            assert frame_name is not None
            _swap_sequence(temp, final, frame_name, swap)
        elif os.path.lexists(final):
            os.replace(temp, final)
        else:
            rename_noreplace(temp, final)
    except FileExistsError:
        raise OutputError(
            f"{shown(final)} appeared while the clip was being mapped, and depthwatch did not make it; not replacing it",
            retryable=False,
        ) from None
    except OSError as exc:
        raise OutputError(f"cannot put {shown(final.name)} in place in {shown(final.parent)}: {exc.strerror or exc}") from None
    sync_folder(final.parent)


def _mark_whole(folder: Path, frame_name: str) -> None:
    """Every frame is on disk: the marker says so (replaced in one rename), before the swap."""
    marker = folder / cliprecord.SEQUENCE_MARKER
    step = temp_name_for(marker)
    write_new(step, cliprecord.marker_text(frame_name, whole=True).encode())
    os.replace(step, marker)


def _own_frame(folder: Path, name: str, frames: re.Pattern[str]) -> bool:
    """Whether `name` in a sequence folder is depthwatch's: the marker, or a frame carrying its record."""
    if name == cliprecord.SEQUENCE_MARKER or is_temp_name(name):
        return True
    return bool(frames.fullmatch(name)) and ownership.is_depth_map(folder / name)


def _swap_sequence(new: Path, final: Path, frame_name: str, atomic: bool = True) -> None:
    """Swap the new sequence folder for the last one at `final`, keeping the user's files that were in it.

    Before the swap, each user file in the old folder gets a hard link in the
    new one, so it is in `final` at every moment (files that cannot be linked,
    folders, are moved across right after). A user's file under a frame's name
    refuses the swap. After it, a file the user saved in the old folder in
    between wins over the link of its older version; the old folder, now at
    the temporary name, loses only depthwatch's files.
    """
    frames = cliprecord.frames_pattern(frame_name)
    theirs = [e for e in os.scandir(final) if not _own_frame(final, e.name, frames)]
    for entry in theirs:
        if os.path.lexists(new / entry.name):
            raise OutputError(
                f"{shown(entry.name)} in {shown(final)} is not a frame depthwatch made; not replacing it: move it away",
                retryable=False,
            )
    linked: dict[str, int] = {}
    for entry in theirs:
        try:
            os.link(entry.path, new / entry.name, follow_symlinks=False)
            linked[entry.name] = entry.stat(follow_symlinks=False).st_ino
        except OSError:
            pass  # a folder, or no hard links here: moved across after the swap
    try:
        exchange(new, final, atomic)
    except OSError:
        _unlink_all(new, linked)
        raise
    old = new  # the last sequence, now under the temporary name
    if not (old / cliprecord.SEQUENCE_MARKER).is_file():  # not ours after all (swapped in since the check): back
        exchange(old, final, atomic)
        _unlink_all(new, linked)
        raise OutputError(f"{shown(final)} is not a depth clip depthwatch made; not replacing it", retryable=False)
    kept = 0
    try:
        entries = list(os.scandir(old))
    except OSError:
        entries = []
        kept += 1
    for entry in entries:
        name = entry.name
        if _own_frame(old, name, frames):
            continue
        try:
            ino = entry.stat(follow_symlinks=False).st_ino
            if name in linked and ino == linked[name]:
                os.unlink(entry.path)  # its link is in place
            elif name in linked and os.stat(final / name, follow_symlinks=False).st_ino == linked[name]:
                os.replace(entry.path, final / name)  # saved again before the swap: the newer one
            else:
                rename_noreplace(entry.path, final / name)
        except OSError:
            kept += 1
    if not remove_own_folder(old) or kept:
        log.warning(
            "%s: some of the files saved in the last sequence's folder could not be carried over; they are in %s",
            shown(final), shown(old),
        )


def _unlink_all(folder: Path, names: dict[str, int]) -> None:
    for name in names:
        try:
            os.unlink(folder / name)
        except OSError:
            pass


def refuse_replacing(final: Path, timelines: bool = False, source: Path | None = None) -> None:
    """OutputError if what is at `final` is not a depth clip (or sequence folder) depthwatch made,
    or (`timelines`) a file at a timeline's name beside it is not a timeline depthwatch made;
    FrameError if (`source`) the depth clip there is another clip's, still there (see `_owner`)."""
    if os.path.lexists(final) and not ownership.is_depth_clip(final):
        raise OutputError(
            f"{shown(final)} is not a depth clip depthwatch made; not replacing it: move it away or change output.clip_template",
            retryable=False,
        )
    owner = _owner(final, source) if source is not None else None
    if owner is not None:
        raise FrameError(clips_sharing(owner, final))
    why = timeline.refusal(final) if timelines else None
    if why:
        raise OutputError(f"{why}: move it away, change output.clip_template or leave out the timeline", retryable=False)


def _owner(final: Path, source: Path) -> Path | None:
    """Another clip, still there, whose depth clip `final` is: it keeps it (`day1/A001.mp4` and
    `day2/A001.mp4` under `/out/{stem}_depth.mov`), whichever of the two is found first at a start.

    A depth clip that lies in this clip's folder (or below it) and not in the
    other's is this clip's to replace: a folder of clips copied elsewhere
    with their depth clips names the clips it was copied from.
    """
    if not final.is_file() or final.is_symlink():
        return None
    owner = cliprecord.made_for(final)
    source = Path(os.path.abspath(source))
    if owner is None or owner == source:
        return None
    if final.is_relative_to(source.parent) and not final.is_relative_to(owner.parent):
        return None  # beside this clip, not that one: a folder copied with its depth clips (its clips' own)
    try:
        return None if os.path.samefile(owner, source) else owner
    except OSError:
        return None  # gone (moved, deleted): nothing left to replace it for


def remove(path: Path, folder: int | None = None) -> None:
    """The temporary clip (file or folder of frames), gone; quietly.

    `folder`: the output folder's descriptor, held since the job began: the
    temporary file goes from wherever that folder is now (moved away, a link
    put in its place), not from what the path names. A folder of frames loses
    only depthwatch's files: after a swap it is the last sequence's, and a
    user's file that could not be carried over stays in it, as the log says.
    """
    if folder is not None:
        remove_own_in(folder, path.name)
        return
    try:
        if path.is_dir() and not path.is_symlink():
            remove_own_folder(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
