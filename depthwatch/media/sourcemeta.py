"""What a depth clip copies from its source beyond `video.ClipInfo`: each frame's own time, and
the display matrix.

Phone footage is variable-rate more often than not: frames last as long as
the light or the phone's load made them. Written at a constant rate, the same
frame count drifts against its source over the clip (a clip whose later frames
last twice as long comes out 2.36 s short). So a variable-rate source's frame
times are read here, from the container's packets (demuxed, not decoded),
and the depth clip is written with exactly those times and its source's time
base. A constant-rate source (within one tick of its rate) keeps the plain
frame k at k / rate.

A phone also films on its side and says so in a display matrix (90 degrees,
say): the pixels are stored turned, and players turn them back. The depth
clip's pixels are stored as its source's are, so it carries the same matrix,
or the matte would lie on its side over the shot.

And a clip's picture may start after its sound (an edit list's empty edit:
the camera's audio from 0, its video from 0.5 s). The depth clip has no sound,
but it is laid over its source, so its first frame is shown where the
source's is, measured from the source's earliest stream: a tool that honours
timestamps (FFmpeg, a QuickTime-based editor) pairs each map with its frame.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from depthwatch.logtext import shown
from depthwatch.media.video import picture_stream, require_av

log = logging.getLogger("depthwatch.clips")


@dataclass(frozen=True)
class SourceMeta:
    """A source clip's frame times (variable-rate only) and display matrix."""

    time_base: Fraction
    #: Each frame's presentation time in `time_base`, from 0, in presentation order; empty when
    #: the source is constant-rate (frame k at k / rate).
    times: tuple[int, ...] = ()
    #: How long the last frame lasts, in `time_base` (to the stream's end: see `_last_duration`).
    last_duration: int = 0
    #: The 3x3 display matrix (FFmpeg's layout: 16.16 and 2.30 fixed point), or None.
    display_matrix: tuple[int, ...] | None = None
    #: Where the first frame is shown, in `time_base`, after the file's earliest sound or picture
    #: (0 unless the video starts late).
    start: int = 0
    #: One frame at the nominal rate, in `time_base` (a constant-rate source that starts late is timed by it).
    tick: Fraction = Fraction(0)

    @property
    def variable(self) -> bool:
        return bool(self.times)

    @property
    def timed(self) -> bool:
        """Whether a depth clip must keep its source's clock (its own frame times, or a late start)."""
        return self.variable or (self.start > 0 and self.tick > 0)

    def time_of(self, k: int) -> tuple[int, int]:
        """Frame k's (presentation time, duration) in `time_base`; frames past the list go on at the last one's pace."""
        times = self.times
        if not times:
            at = round(k * self.tick)
            return self.start + at, round((k + 1) * self.tick) - at
        last = self.last_duration or (times[-1] - times[-2] if len(times) > 1 else 1)
        if k + 1 < len(times):
            return self.start + times[k], times[k + 1] - times[k]
        return self.start + times[-1] + (k - len(times) + 1) * last, last


    def lead(self, rate: Fraction) -> int:
        """Frames of `rate` from the file's start to its first picture (a clip whose sound starts first)."""
        return round(Fraction(self.start) * self.time_base * rate) if self.start and rate else 0

    def length(self, frames: int, rate: Fraction) -> int:
        """How long the clip's first `frames` frames last, in frames of `rate` (a timeline's units).

        At a constant rate that is the count; a variable-rate clip lasts as long
        as its frames' own times say (a phone clip of 30 frames, half of them
        twice as long, lasts 45 frames of its nominal 30 fps, not 30).
        """
        if not self.variable or frames <= 0 or not rate:
            return frames
        start, lasts = self.time_of(frames - 1)  # from the file's start: the picture's own begins at `self.start`
        return max(1, round(Fraction(start - self.start + lasts) * self.time_base * rate))


def read(path: Path, rate: Fraction, keeps_times: bool = True) -> SourceMeta:
    """The source's frame times (when it is variable-rate: said in the log) and display matrix.

    `keeps_times` False: for an image sequence, which numbers frames one by one (the log says so).
    """
    av = require_av()
    try:
        with av.open(str(path), "r", metadata_errors="ignore") as container:
            stream = picture_stream(container)
            time_base = Fraction(stream.time_base)
            earliest, first_kind = _earliest_start(container)
            end = stream.start_time + stream.duration if stream.start_time is not None and stream.duration else None
            matrix = _display_matrix(container, stream)
        first = _first_decoded(av, path)
        with av.open(str(path), "r", metadata_errors="ignore") as container:
            stream = picture_stream(container)
            found: list[tuple[int, int]] = []  # (pts, duration): two frames may share a time
            untimed = False
            for packet in container.demux(stream):
                if getattr(packet, "is_discard", False) or packet.size == 0:
                    continue  # hidden by an edit list, or the demuxer's flush
                if packet.pts is None:
                    untimed = True  # AVI's B-frames, raw streams: no frame times to keep
                    continue
                if first is not None and packet.pts < first:
                    continue  # before the first picture the decoder gives: a stream joined midway
                found.append((packet.pts, int(packet.duration or 0)))
    except (av.FFmpegError, OSError, AttributeError):  # no video stream: the mapping pass says so
        # A clip that cannot be read through: the mapping pass says where it is damaged.
        return SourceMeta(Fraction(1) / rate if rate else Fraction(1, 1000))
    found.sort(key=lambda packet: packet[0])
    pts = [p for p, _ in found]
    times: tuple[int, ...] = ()
    last = _last_duration(found, end)
    if len(pts) > 2 and rate and not untimed:
        tick = 1 / (rate * time_base)  # one frame at the nominal rate, in ticks
        steps = [b - a for a, b in zip(pts, pts[1:])]
        repeats = sum(1 for step in steps if step <= 0)
        if repeats > max(2, len(pts) // 20):
            # Not one timeline: streams joined end to end (`cat a.ts b.ts`), each from its own 0. Sorted,
            # their times would pair the frames of one with those of the other, a tick apart.
            log.warning(
                "clip %s: %d of its frames share their time with another; its times are not one timeline (streams "
                "joined end to end?), so its depth clip is timed at its nominal rate, frame k at k / rate",
                shown(path.name), repeats,
            )
        elif any(abs(step - tick) > 1 for step in steps):
            times = _apart(tuple(p - pts[0] for p in pts), path, keeps_times)
            shortest, longest = min(steps) * time_base * 1000, max(steps) * time_base * 1000
            log.info(
                "clip %s is variable-rate (frames last %.1f to %.1f ms): %s",
                shown(path.name), shortest, longest,
                "its depth clip keeps each frame's own time" if keeps_times
                else "an image sequence cannot keep its frames' times; they are numbered one by one",
            )
    start = 0
    if pts and earliest is not None and rate:
        start = max(0, round((pts[0] * time_base - earliest) / time_base))
        if start and keeps_times:
            after = "its sound" if first_kind == "audio" else "packets that do not decode (recorded or split midway)"
            log.info(
                "clip %s: its picture starts %.3f s into the file, after %s; its depth clip starts there too",
                shown(path.name), float(start * time_base), after,
            )
    return SourceMeta(time_base, times, last, matrix, start, 1 / (rate * time_base) if rate else Fraction(0))


def _last_duration(found: list[tuple[int, int]], end: int | None) -> int:
    """How long the last frame (`found`: (pts, duration), by time) lasts: to the stream's end, where the
    track's media duration and edit list put it.

    With B-frames, the packet with the highest time is not the last one
    decoded, and its duration is its decode step, not how long it is shown
    (a phone clip's last frame would come out 43.3 ms long where the source
    shows it for 40.3, 33 where HEVC's shows it for 40). The packet's own is taken
    only where the stream does not say, or says something no frame could
    last (past four of the clip's longest steps).
    """
    if not found:
        return 0
    at, duration = found[-1]
    if end is not None and end > at:
        steps = [b - a for (a, _), (b, _) in zip(found, found[1:])]
        longest = max([*steps, duration, 1])
        if end - at <= 4 * longest:
            return end - at
    return duration


def _first_decoded(av: object, path: Path) -> int | None:
    """The presentation time of the first frame the decoder gives, or None.

    A transport stream recorded or split midway starts with packets that never
    decode (no parameter sets, no keyframe yet): their times are not frames',
    and taken for them every map would be shown before its picture.
    """
    try:
        with av.open(str(path), "r", metadata_errors="ignore") as container:  # type: ignore[attr-defined]
            for frame in container.decode(picture_stream(container)):
                return frame.pts
    except Exception:  # noqa: BLE001 - a clip that cannot be decoded: the mapping pass says why
        return None
    return None


def _apart(times: tuple[int, ...], path: Path, keeps_times: bool) -> tuple[int, ...]:
    """`times` with each one that repeats the one before moved a tick later, said once.

    Two frames at one time (concatenating and slideshow tools write them): the
    depth clip cannot hold two frames at one time, and dropping one shows every
    later map over the frame after its own.
    """
    kept = list(times)
    moved = 0
    for i in range(1, len(kept)):
        if kept[i] <= kept[i - 1]:
            kept[i] = kept[i - 1] + 1
            moved += 1
    if moved and keeps_times:
        log.info(
            "clip %s: %d frame(s) share their time with the frame before; each is kept one tick later, so every map "
            "after it stays on its own frame", shown(path.name), moved,
        )
    return tuple(kept)


def _earliest_start(container: object) -> tuple[Fraction | None, str]:
    """When the file's first sound or picture is shown (its streams' own start times), in seconds, and which it is.

    Never before 0: a negative start is an encoder's priming (AAC's 1024
    samples), cut off by the edit list, not a moment the file shows.
    """
    starts = [
        (s.start_time * Fraction(s.time_base), s.type)
        for s in container.streams  # type: ignore[attr-defined]
        if s.type in ("video", "audio") and s.start_time is not None and s.time_base
    ]
    if not starts:
        return None, ""
    at, kind = min(starts)
    return max(Fraction(0), at), kind


def _display_matrix(container: object, stream: object) -> tuple[int, ...] | None:
    """The display matrix FFmpeg attaches to the first decoded frame (from the stream's side data)."""
    for frame in container.decode(stream):  # type: ignore[attr-defined]
        sides = frame.side_data  # a mapping from type to side data in PyAV 15 and later, a sequence before
        for side in sides.values() if hasattr(sides, "values") else sides:
            if "DISPLAYMATRIX" in str(side.type):
                data = bytes(side)
                if len(data) == 36:
                    matrix = struct.unpack("=9i", data)
                    return None if matrix == (65536, 0, 0, 0, 65536, 0, 0, 0, 1 << 30) else matrix
        return None
    return None
