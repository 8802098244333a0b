"""A timeline to open beside a depth clip: the source on V1, the depth clip on V2, same start and
duration, as an OpenTimelineIO file (`.otio`) and a Final Cut Pro XML 1.9 file (`.fcpxml`).

Laying a depth clip over its shot by hand is where a matte slips a frame.
The `.otio` opens in anything OpenTimelineIO reads (Resolve 18.5+, Nuke
Studio/Hiero, RV, and Premiere through its adapters); the `.fcpxml` in Final
Cut Pro 10.4.9 and later (FCPXML 1.9: media by `media-rep`) and Resolve. Both
start at the source's timecode, so the timeline reads the shot's own code.

The `.otio` is written by OpenTimelineIO itself (the `timeline` extra,
imported only when a timeline is asked for). FCPXML 1.9 is written here, to
the DTD: the FCP X adapter for OpenTimelineIO writes version 1.8 (an asset's
`src`, which 1.9 replaced) and rounds 23.976 to 23.

Each file carries a mark, so a second run replaces its own timeline and
never a file of the same name someone else made. The mark names a digest of
the file as written: a timeline an editor opened and saved with their own
markers, tracks or name (OpenTimelineIO keeps metadata through every round
trip, so the mark comes along) is theirs now, and is never replaced. A
timeline from before the digest (a plain mark) is still known as ours.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType

from depthwatch.errors import FrameError
from depthwatch.frames.writer import atomic_write
from depthwatch.logtext import one_line, shown
from depthwatch.media.cliptemplates import timecode_frames
from depthwatch.media.video import ClipInfo

#: In every timeline depthwatch writes (OTIO metadata, an FCPXML comment): its own to replace.
MARK = "depthwatch depth clip timeline"
#: Hex digits of the file's own digest after the mark (see `_signed`).
_DIGITS = 16
_BLANK = "0" * _DIGITS
_SIGNED = re.compile(re.escape(MARK).encode() + rb"(?: sha256:([0-9a-f]{%d}))?" % _DIGITS)
#: A timeline larger than this is no timeline depthwatch wrote (its are a few KB).
_LARGEST = 1 << 22
INSTALL = "pip install 'depthwatch[timeline]'"
SUFFIXES = (".otio", ".fcpxml")


@functools.lru_cache(maxsize=1)
def _otio() -> ModuleType:
    try:
        import opentimelineio
    except ImportError:
        raise FrameError(f"a timeline (--timeline, output.timeline) needs OpenTimelineIO, which is not installed; run: {INSTALL}") from None
    return opentimelineio


def check(sequence: bool) -> None:
    """FrameError (one line) before any work when no timeline could be written for the job."""
    if sequence:
        raise FrameError("a timeline (--timeline, output.timeline) is made for a depth clip (.mov, .mkv, .mp4), not an image sequence")
    _otio()


def paths_for(depth: Path) -> tuple[Path, Path]:
    return depth.with_suffix(".otio"), depth.with_suffix(".fcpxml")


def refusal(depth: Path) -> str | None:
    """Why the timelines beside `depth` could not be written (a file at a name that is not depthwatch's), or None.

    Asked before a clip is mapped, not found after: a refused timeline would
    otherwise fail a job whose depth clip is already in place (the run saying
    no depth clip was written while one was).
    """
    for path in paths_for(depth):
        try:
            folder = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None  # no folder yet: nothing in it to replace
        try:
            why = _may_replace(folder, path.name)
        finally:
            os.close(folder)
        if why:
            return f"its timeline {shown(path.name)} in {shown(path.parent)} {why}"
    return None


def write(
    source: Path, depth: Path, info: ClipInfo, frames: int, roots: tuple[Path, ...] = (), lead: int = 0
) -> tuple[Path, Path]:
    """Write the `.otio` and `.fcpxml` beside `depth`; OutputError if a file at either name is not depthwatch's.

    `frames`: the clip's length in frames of `info.rate` (a variable-rate clip's
    own duration at its nominal rate, not its count of frames: see `clips.make`).
    `lead`: frames of `info.rate` before the picture starts (its sound starts
    first; the depth clip keeps the same lead): the timeline is the picture's
    span, from the timecode the picture starts at, or the shot's end would
    fall outside it.
    """
    start = 0
    if info.timecode:
        counted = timecode_frames(info.timecode, info.rate)
        start = counted[0] if counted else 0
    span = Span(start, lead, frames)
    otio_path, fcpxml_path = paths_for(depth)
    for path, data in ((otio_path, otio_json(source, depth, info, span)), (fcpxml_path, fcpxml(source, depth, info, span))):
        atomic_write(path, data, roots, may_replace=_may_replace)
    return otio_path, fcpxml_path


@dataclass(frozen=True)
class Span:
    """Where a clip's picture lies in its media, in frames of its rate."""

    #: The frame number of the file's start (its timecode; 0 without one).
    media_start: int
    #: Frames from the file's start to its first picture.
    lead: int
    #: The picture's length.
    frames: int

    @property
    def start(self) -> int:
        """The picture's first frame number: where the timeline starts."""
        return self.media_start + self.lead

    @property
    def media_length(self) -> int:
        return self.lead + self.frames


def _name(name: str) -> str:
    """A name as a timeline can hold it: UTF-8 (OpenTimelineIO refuses undecodable bytes) and no control
    character (XML 1.0 forbids them: Final Cut Pro and Resolve refuse the whole file), escaped as the log shows them."""
    return one_line(name)


def _may_replace(folder: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError:
        return "is not a timeline depthwatch made; not replacing it"
    try:
        data = os.read(fd, _LARGEST + 1)
    finally:
        os.close(fd)
    found = _as_written(data) if len(data) <= _LARGEST else None
    if found is None:
        return "is not a timeline depthwatch made; not replacing it"
    if not found:
        return "is a timeline depthwatch made, edited since (markers, tracks, a name of yours?); not replacing it"
    return None


def _signed(data: bytes) -> bytes:
    """`data`, whose mark carries a blank digest, with the digest of those very bytes filled in."""
    blank = f"{MARK} sha256:{_BLANK}".encode()
    digest = hashlib.sha256(data).hexdigest()[:_DIGITS]
    return data.replace(blank, f"{MARK} sha256:{digest}".encode(), 1)


def _as_written(data: bytes) -> bool | None:
    """True: a timeline depthwatch wrote, as written; False: one it wrote, changed since; None: not its."""
    mark = _SIGNED.search(data)
    if mark is None:
        return None
    if mark.group(1) is None:
        return True  # from before the digest
    blank = data[: mark.start(1)] + _BLANK.encode() + data[mark.end(1) :]
    return hashlib.sha256(blank).hexdigest()[:_DIGITS] == mark.group(1).decode()


def otio_json(source: Path, depth: Path, info: ClipInfo, span: Span) -> bytes:
    otio = _otio()
    rate = float(info.rate)

    def time_range(start: int, frames: int) -> object:
        return otio.opentime.TimeRange(otio.opentime.RationalTime(start, rate), otio.opentime.RationalTime(frames, rate))

    timeline = otio.schema.Timeline(name=_name(f"{source.stem} depth"), global_start_time=otio.opentime.RationalTime(span.start, rate))
    timeline.metadata["depthwatch"] = f"{MARK} sha256:{_BLANK}"
    for name, path in (("V1", source), ("V2", depth)):
        track = otio.schema.Track(name=name, kind=otio.schema.TrackKind.Video)
        reference = otio.schema.ExternalReference(target_url=path.resolve().as_uri(), available_range=time_range(span.media_start, span.media_length))
        track.append(otio.schema.Clip(name=_name(path.name), media_reference=reference, source_range=time_range(span.start, span.frames)))
        timeline.tracks.append(track)
    return _signed(otio.adapters.write_to_string(timeline, "otio_json").encode())


def _time(frames: int, rate: Fraction) -> str:
    """A time as FCPXML writes one: rational seconds, a whole number of frames."""
    seconds = Fraction(frames) / rate
    return f"{seconds.numerator}s" if seconds.denominator == 1 else f"{seconds.numerator}/{seconds.denominator}s"


def _sound(info: ClipInfo) -> dict[str, str]:
    """The source asset's sound, declared: without it Final Cut Pro may open the shot silent."""
    if not info.audio_streams:
        return {}
    sound = {"hasAudio": "1", "audioSources": str(info.audio_streams)}
    if info.audio_channels:
        sound["audioChannels"] = str(info.audio_channels)
    if info.audio_rate:
        sound["audioRate"] = str(info.audio_rate)
    return sound


def fcpxml(source: Path, depth: Path, info: ClipInfo, span: Span) -> bytes:
    """FCPXML 1.9: one format, two assets, a project whose spine holds the source with the depth clip connected above.

    The format is the picture as shown: a phone clip stored on its side with a
    display matrix opens in a portrait project, as Final Cut Pro's own would.
    """
    rate = info.rate
    drop = bool(info.timecode) and ";" in (info.timecode or "")
    root = ET.Element("fcpxml", version="1.9")
    resources = ET.SubElement(root, "resources")
    width, height = info.shown_size
    fmt = {"id": "r1", "frameDuration": _time(1, rate), "width": str(width), "height": str(height), "colorSpace": "1-1-1 (Rec. 709)"}
    sar = info.shown_sar
    if sar is not None:  # anamorphic, DV, PAL: without it the project opens with square pixels
        fmt["paspH"], fmt["paspV"] = str(sar.numerator), str(sar.denominator)
    ET.SubElement(resources, "format", fmt)
    at, length = _time(span.start, rate), _time(span.frames, rate)
    for ref, path in (("r2", source), ("r3", depth)):
        asset = ET.SubElement(
            resources, "asset",
            {
                "id": ref, "name": _name(path.stem), "start": _time(span.media_start, rate), "duration": _time(span.media_length, rate),
                "hasVideo": "1", "format": "r1", "videoSources": "1", **(_sound(info) if path == source else {}),
            },
        )
        ET.SubElement(asset, "media-rep", {"kind": "original-media", "src": path.resolve().as_uri()})
    library = ET.SubElement(root, "library")
    event = ET.SubElement(library, "event", {"name": "depthwatch"})
    project = ET.SubElement(event, "project", {"name": _name(f"{source.stem} depth")})
    tc = {"tcFormat": "DF" if drop else "NDF"}
    sequence = ET.SubElement(project, "sequence", {"format": "r1", "duration": length, "tcStart": at, **tc})
    spine = ET.SubElement(sequence, "spine")
    clip = ET.SubElement(
        spine, "asset-clip", {"ref": "r2", "name": _name(source.stem), "offset": at, "start": at, "duration": length, "format": "r1", **tc}
    )
    ET.SubElement(
        clip, "asset-clip",
        {"ref": "r3", "lane": "1", "name": _name(depth.stem), "offset": at, "start": at, "duration": length, "format": "r1", **tc},
    )
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return _signed(f'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE fcpxml>\n<!-- {MARK} sha256:{_BLANK} -->\n{body}\n'.encode())
