"""A depth clip made on the farm, in pieces: the workers' segments, named for what they hold, and their join.

Each range of a clip becomes one intra-only segment (ProRes for a `.mov`
depth clip, FFV1 for the rest), written by a worker into a hidden folder
beside the depth clip (`.A001_depth.mov.farm/`). Its name carries a key of
everything its pixels depend on: the source's version (size and mtime), the
range (its first frame and every presentation time), the render settings and
the output kind, and the model (file digest, providers, precision, as the
worker that ran the first pass reports them). A run interrupted and run again
finds the segments that are still right by name and renders only the rest;
a segment of another version of anything is not found, and is removed with
the folder when the job ends.

Joining copies packets: ProRes codes every frame on its own, and FFV1's
frames need nothing of another's pixels (its coder state restarts at each
keyframe, and every segment starts with one), so the segments' packets laid
end to end, each re-stamped with its frame's time in the whole clip (k at
1/rate, or a variable-rate source's own frame times), decode to the frames of
the depth clip local `once` writes, without decoding or encoding a frame
here. (A joined FFV1 clip has a keyframe at each range's start besides
FFV1's own every few frames: the same frames, not the same bytes.)
The container gets the source's timecode (a tmcd track in .mov, a tag in
.mkv), pixel aspect, display matrix and depthwatch's mark. H.264 cannot be
joined so (its frames refer to each other, across a range's edges unless each
range is closed), so for a `.mp4` depth clip the client decodes the lossless
FFV1 segments and encodes the whole clip once: the same encoder, the same
frames, so the same file local `once` writes; it costs one H.264 encode at the
client (a few hundred frames a second at 1080p on one core with `preset
fast`, against the model's tens on a worker).

An image sequence's segment is a folder of its range's frames, each written
as local `once` writes a sequence's frame (`clips.sequence`: the same name,
bits, record); the join links them into one new sequence folder, which is
marked whole and swapped in as local `once`'s is (`clips.placing`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path

from depthwatch.clips import sequence
from depthwatch.errors import FrameError, OutputError
from depthwatch.frames import ownership
from depthwatch.frames.settings import Settings
from depthwatch.logtext import shown
from depthwatch.media import clipwrite
from depthwatch.media.sourcemeta import SourceMeta
from depthwatch.media.video import ClipInfo, require_av

#: The intra-only kind each output kind's segments are written in.
SEGMENT_KINDS = {".mov": ".mov", ".mkv": ".mkv", ".mp4": ".mkv"}
#: A segment being written: `.NAME.PID.part` (a killed worker's is removed when the job ends).
PART_SUFFIX = ".part"
#: An image sequence's segment: a folder of the range's frames, named and recorded as local `once` names them.
SEQUENCE_SUFFIX = ".seq"


def folder_for(final: Path) -> Path:
    """The hidden folder of a depth clip's segments, beside it."""
    return final.with_name(f".{final.name}.farm")


def is_sequence(output: Path) -> bool:
    """Whether `output` names an image sequence's frames (`{frame:04d}.png`) rather than a depth clip."""
    return "{frame" in output.name


def segment_kind(output: Path) -> clipwrite.Kind | None:
    """The kind a depth clip's segments are written in (None: an image sequence's, a folder of its frames);
    FrameError for an output the farm does not join."""
    if is_sequence(output):
        return None
    ext = SEGMENT_KINDS.get(output.suffix.lower())
    if ext is None:
        raise FrameError(
            f"the farm writes depth clips as .mov, .mkv, .mp4 or an image sequence, not {output.suffix or 'a file without an extension'}; "
            "give -o NAME.mov"
        )
    kind = clipwrite.kind_for(ext)
    assert kind is not None
    return kind


def key(version: tuple[int, int], first: int, times: tuple[int, ...], settings: Settings, output: Path, model: str) -> str:
    """What a segment's pixels depend on, as a short digest."""
    what = {
        "source": list(version),
        "first": first,
        "times": hashlib.sha256(json.dumps(times).encode()).hexdigest(),
        "render": repr(settings.render),
        "normalise": settings.normalise,
        "kind": repr(segment_kind(output)),
        "model": model,
    }
    if is_sequence(output):  # its frames' names, format and numbering
        what["frames"] = [output.name, settings.first_frame, settings.png_bits, settings.png_compression, settings.jpeg_quality, repr(settings.exr)]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def name(first: int, count: int, digest: str, output: Path) -> str:
    """A segment's name: its range and key; an image sequence's segment is a folder of its frames (`.seq`)."""
    ext = SEQUENCE_SUFFIX if is_sequence(output) else SEGMENT_KINDS[output.suffix.lower()]
    return f"{first:08d}-{count:06d}-{digest}{ext}"


_NAME = re.compile(r"(\d{8})-(\d{6})-([0-9a-f]{20})\.(mov|mkv|seq)")


def parse(segment: str) -> tuple[int, int, str] | None:
    """(first frame, frame count, key) of a segment's name (`name`'s), None for any other name."""
    match = _NAME.fullmatch(segment)
    return (int(match[1]), int(match[2]), match[3]) if match else None


def part_for(target: Path) -> Path:
    """The temporary name a segment is written under, beside it (`.NAME.PID-RANDOM.part`: pids repeat across machines)."""
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}{PART_SUFFIX}")


def join(
    segments: list[Path],
    final: Path,
    temp: Path,
    meta: ClipInfo,
    source: SourceMeta,
    made_from: tuple[int, int, int] | None = None,
    clip: Path | None = None,
) -> int:
    """The segments, in order, as one depth clip at `temp`; the frames written.

    Packets are copied where the segments' codec is the depth clip's; H.264, a
    long-GOP codec, cannot be joined by copy, and is decoded and encoded once more.
    `made_from`: the source clip's version, said in the clip (`cliprecord.made_from`); `clip`: its path (`cliprecord.made_for`).
    """
    kind = clipwrite.kind_for(final.suffix)
    assert kind is not None
    return _rewrite(segments, temp, kind, meta, source, copy=segment_kind(final).codec == kind.codec, made_from=made_from, clip=clip)


def _rewrite(
    segments: list[Path], temp: Path, kind: clipwrite.Kind, meta: ClipInfo, source: SourceMeta, *, copy: bool,
    made_from: tuple[int, int, int] | None,
    clip: Path | None = None,
) -> int:
    av = require_av()
    writer = clipwrite.ClipWriter(temp, kind, meta, source, made_from=made_from, clip=clip)
    try:
        for path in segments:
            with av.open(str(path), "r") as segment:
                if copy:
                    for packet in segment.demux(video=0):
                        if packet.size:
                            writer.copy(packet)
                else:
                    for frame in segment.decode(video=0):
                        writer.write(frame.to_ndarray(format="gray16le"))
        writer.close()
    except av.FFmpegError as exc:
        writer.abort()
        raise FrameError(f"cannot {'join the segments' if copy else 'read a segment back'}: {exc}") from None
    except BaseException:
        writer.abort()
        raise
    return writer.frames


def join_sequence(segments: list[Path], temp: Path, frame_name: str) -> int:
    """The segments' frames, in one new sequence folder at `temp` (hard links: no frame copied; a copy where
    the storage has none); the frames there.

    The folder is begun as local `once` begins one (`clips.sequence.begin`), and
    `clips.placing.rename_into_place` marks it whole and swaps it in.
    """
    sequence.begin(temp, frame_name)
    frames = 0
    for folder in segments:
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            raise FrameError(f"cannot read the segment {shown(folder.name)}: {exc.strerror or exc}") from None
        for entry in names:
            try:
                try:
                    os.link(folder / entry, temp / entry)
                except OSError:
                    shutil.copyfile(folder / entry, temp / entry)
            except OSError as exc:
                raise OutputError(f"cannot put frame {shown(entry)} in {shown(temp.parent)}: {exc.strerror or exc}") from None
            frames += 1
    return frames


def put_in_place(temp: Path, final: Path) -> None:
    """The whole depth clip under its name, replacing only a depth clip depthwatch made."""
    from depthwatch.files import rename_noreplace

    if os.path.lexists(final) and not ownership.is_depth_clip(final):
        raise OutputError(f"{shown(final)} is not a depth clip depthwatch made; not replacing it: move it away", retryable=False)
    try:
        if os.path.lexists(final):
            os.replace(temp, final)
        else:
            rename_noreplace(temp, final)
    except OSError as exc:
        raise OutputError(f"cannot put {shown(final.name)} in place in {shown(final.parent)}: {exc.strerror or exc}") from None


def remove_parts(folder: Path) -> int:
    """Segments a killed worker was writing (once every task has its answer); how many."""
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(".") and entry.name.endswith(PART_SUFFIX):
            try:
                if entry.is_dir(follow_symlinks=False):  # an image sequence's range
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def remove_folder(folder: Path) -> None:
    """The segments' folder, once its depth clip is in place."""
    shutil.rmtree(folder, ignore_errors=True)
