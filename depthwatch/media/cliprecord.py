"""What marks a depth clip as depthwatch's own: its container's comment, and an image sequence's marker file.

A depth clip's comment carries the mark, a digest of its first picture (a
matte graded from a depth clip keeps the comment FFmpeg copies, but not the
picture), the version of the clip it was made from, and that clip's path (two
clips in two folders may name one depth clip: the one named keeps it). An
image sequence's folder holds a hidden marker file: the mark, the frames'
names, and `whole` once every frame is on disk. `frames.ownership` asks these
questions for every caller; the writer (`clipwrite`) writes the answers.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

from depthwatch.media.video import require_av

#: The container comment every depth clip carries (and a sequence folder's marker file holds).
MARK = "depthwatch depth clip"
#: An image sequence's folder holds this hidden file: the folder is depthwatch's to replace.
SEQUENCE_MARKER = ".depthwatch"


#: The marker's last line once every frame is on disk: a whole sequence, fit to be put back.
WHOLE = "whole"


def marker_text(frame_name: str, whole: bool = False) -> str:
    """What the sequence marker holds: the mark, the frames' names (`{frame:04d}.png`), and whether all are there."""
    return f"{MARK}\n{frame_name}\n" + (f"{WHOLE}\n" if whole else "")


def is_whole(folder: Path) -> bool:
    """Whether the sequence in `folder` was finished (its marker says so): one a kill must not cost."""
    try:
        with open(folder / SEQUENCE_MARKER, "rb") as f:
            lines = f.read(4096).decode(errors="replace").splitlines()
    except OSError:
        return False
    return len(lines) >= 3 and lines[0] == MARK and lines[2] == WHOLE


def frames_pattern(frame_name: str) -> re.Pattern[str]:
    """The names a sequence's frames have, from their template (`{frame:04d}.png`: `0000.png`, `1001.png`)."""
    parts = re.split(r"\{frame[^}]*\}", frame_name)
    return re.compile(r"-?\d+".join(re.escape(p) for p in parts))


def marked_frames(folder: Path) -> re.Pattern[str] | None:
    """The frame names the marker in `folder` gives (None: no marker, or one from before it said)."""
    try:
        with open(folder / SEQUENCE_MARKER, "rb") as f:
            lines = f.read(4096).decode(errors="replace").splitlines()
    except OSError:
        return None
    if len(lines) < 2 or lines[0] != MARK or "{frame" not in lines[1]:
        return None
    return frames_pattern(lines[1])


def made_here(path: Path, comment: str | None = None) -> bool:
    """Whether the clip at `path` (links followed) is a depth clip depthwatch wrote, whatever its name.

    The container's comment carries the mark and a digest of the clip's first
    video packet (`_first_frame_mark`). FFmpeg copies a comment into whatever it
    makes of a file, so a matte graded from a depth clip, or a composite over
    one, carries the mark too; its first packet is its own, so the digest
    tells it from depthwatch's (and it is neither replaced nor refused as
    input). A comment with the mark alone is a depth clip from before the
    digest; after the digest, the version of the clip it was made from (see
    `made_from`). `comment`: the container's, where the caller has read it already.
    """
    if comment is not None and not comment.startswith(MARK):
        return False
    av = require_av()
    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            if comment is None:
                comment = _comment(container)
            said = _COMMENT.fullmatch(comment)
            if said is None:
                return False
            return said["digest"] is None or said["digest"] == first_frame_mark(_first_packet(container))
    except (av.FFmpegError, OSError, IndexError):
        return False


#: A depth clip's comment: the mark, its first packet's digest, the version of the clip it was made from, and that clip's path.
_COMMENT = re.compile(
    re.escape(MARK)
    + r"(?: (?P<digest>\(first frame [0-9a-f]{16}\)))?(?: \(source (?P<size>\d+):(?P<mtime>\d+):(?P<inode>\d+)\))?"
    + r"(?: \(clip (?P<clip>[!-~]+)\))?"
)


def quoted(path: Path) -> str:
    """`path` as printable ASCII with no space or parenthesis (percent-encoded bytes): any name fits a comment."""
    return urllib.parse.quote(os.fsencode(os.path.abspath(path)), safe="/")


def made_for(path: Path) -> Path | None:
    """The path of the clip the depth clip at `path` was made from, as its comment says; None: not said
    (a depth clip from before it was, or not one of depthwatch's).

    Two clips in two folders may have one depth clip (`/out/{stem}_depth.mov`
    from `day1/A001.mp4` and `day2/A001.mp4`): the clip named here keeps it,
    and the other is refused, at every start alike.
    """
    said = _said(path)
    if said is None or said["clip"] is None:
        return None
    return Path(os.fsdecode(urllib.parse.unquote_to_bytes(said["clip"])))


def _said(path: Path) -> re.Match[str] | None:
    av = require_av()
    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            return _COMMENT.fullmatch(_comment(container))
    except (av.FFmpegError, OSError, IndexError):
        return None


def made_from(path: Path) -> tuple[int, int, int] | None:
    """The version (size, mtime_ns, inode) of the clip a depth clip was made from, as its comment says; None:
    not said (a depth clip from before it was, or not one of depthwatch's)."""
    said = _said(path)
    if said is None or said["size"] is None:
        return None
    return int(said["size"]), int(said["mtime"]), int(said["inode"])


def _comment(container: Any) -> str:
    tags = {str(k).lower(): str(v) for k, v in container.metadata.items()}  # Matroska says COMMENT
    return tags.get("comment", "")


def _first_packet(container: Any) -> bytes:
    stream = container.streams.video[0]
    for packet in container.demux(stream):
        if packet.size:
            return picture_of(bytes(packet), stream.codec_context.name)
    return b""


def first_frame_mark(data: bytes) -> str:
    """What follows MARK in a depth clip's comment: a digest of its first video packet's picture."""
    return f"(first frame {hashlib.blake2b(data, digest_size=8).hexdigest()})"


def picture_of(data: bytes, codec: str) -> bytes:
    """The part of a packet every container keeps as it is: ProRes and FFV1 packets whole; of an
    H.264 packet, its slices (the MP4 muxer turns the encoder's start codes into lengths and moves
    the parameter sets into the header)."""
    if codec != "h264":
        return data
    if data.startswith((b"\0\0\1", b"\0\0\0\1")):
        units = data.split(b"\0\0\1")
    else:  # four-byte lengths, as MP4 stores them
        units, at = [], 0
        while at + 4 <= len(data):
            size = int.from_bytes(data[at : at + 4], "big")
            units.append(data[at + 4 : at + 4 + size])
            at += 4 + size
    # A unit's own bytes never start or end with a zero byte: the zeros about it belong to a four-byte
    # start code or to trailing padding, which the MP4 muxer drops.
    units = [u.strip(b"\0") for u in units]
    return b"".join(u for u in units if u and 1 <= (u[0] & 0x1F) <= 5)
