"""Whether a file is one of depthwatch's own: each form of the question asked in one place.

A file is depthwatch's by what it carries, not by its name: a user may name
their own file as a template names outputs. Each question here has its own
answer, because each is asked for its own reason:

- `is_depth_map`: a frame's map (or a sequence's frame) carrying depthwatch's
  record (`provenance`), whatever its name: never taken as a frame, the only
  file a map replaces.
- `is_depth_clip`: what is at a clip's output name, the entry itself (a link is
  not followed): a depth clip file carrying the container's mark, or a
  sequence folder holding its marker. The only thing a depth clip replaces.
- `made_as_depth_clip`: a clip read as input (links followed), from the mark
  in its container: a depth clip, or a copy of one, is never mapped again.
- `is_temporary`: a temporary file (`files.temp_name_for`'s shape) or one inside
  a temporary folder (a sequence being written, or the last one swapped out).
- `in_depth_sequence`: a finished sequence's folder, or a file inside one.

`Rules.is_own_file` asks a different question, by name as the config's
templates and sidecars name outputs, and uses the last two of these; the
record inside a map read for what it says (its source, its version) is
`provenance.read`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from depthwatch.files import is_temp_name
from depthwatch.frames import provenance
from depthwatch.media import cliprecord


def is_depth_map(path: Path, dir_fd: int | None = None) -> bool:
    """Whether the file at `path` carries depthwatch's record: a map it made, or an image saved from one.

    Not through a link, and only a regular file (see `provenance.read`). `dir_fd`:
    `path` is a name in the folder open on that descriptor.
    """
    return provenance.read(path, dir_fd=dir_fd) is not None


def is_depth_clip(path: Path) -> bool:
    """Whether the depth clip (or sequence folder) at `path` is one depthwatch made: its to replace.

    The entry itself: a link at the name is not depthwatch's, whatever it leads to.
    FrameError where PyAV is missing and a clip file is there to read.
    """
    if path.is_dir() and not path.is_symlink():
        return (path / cliprecord.SEQUENCE_MARKER).is_file()
    if not path.is_file() or path.is_symlink():
        return False
    return cliprecord.made_here(path)


def made_as_depth_clip(path: Path, comment: str | None = None) -> bool:
    """Whether the clip read at `path` (links followed) is a depth clip depthwatch wrote, whatever its name.

    `comment`: the container's, where the caller has read it already (see `cliprecord.made_here`).
    """
    return cliprecord.made_here(path, comment)


def is_temporary(path: Path) -> bool:
    """Whether `path` is a temporary file, or lies inside a temporary folder, of depthwatch's."""
    return is_temp_name(path.name) or any(is_temp_name(part) for part in path.parent.parts)


def in_depth_sequence(path: Path) -> bool:
    """Whether `path` lies in a finished sequence's folder (beside its marker) or is that folder itself."""
    return os.path.isfile(path.parent / cliprecord.SEQUENCE_MARKER) or os.path.isfile(path / cliprecord.SEQUENCE_MARKER)
