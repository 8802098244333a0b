"""What a depth clip copies from its source beyond `video.ClipInfo`: each frame's own time, and
the display matrix.

Phone footage is variable-rate more often than not: frames last as long as
the light or the phone's load made them. Written at a constant rate, the same
frame count drifts against its source over the clip (a clip whose later frames
last twice as long came out 2.36 s short). So a variable-rate source's frame
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

from depthwatch.imaging.video import picture_stream, require_av
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch.clips")


@dataclass(frozen=True)
class SourceMeta:
    """A source clip's frame times (variable-rate only) and display matrix."""

    time_base: Fraction
    #: Each frame's presentation time in `time_base`, from 0, in presentation order; empty when
    #: the source is constant-rate (frame k at k / rate).
    times: tuple[int, ...] = ()
    #: How long the last frame lasts, in `time_base` (its packet's duration).
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
            earliest = _earliest_start(container)
            matrix = _display_matrix(container, stream)
        with av.open(str(path), "r", metadata_errors="ignore") as container:
            stream = picture_stream(container)
            found: dict[int, int] = {}
            untimed = False
            for packet in container.demux(stream):
                if getattr(packet, "is_discard", False) or packet.size == 0:
                    continue  # hidden by an edit list, or the demuxer's flush
                if packet.pts is None:
                    untimed = True  # AVI's B-frames, raw streams: no frame times to keep
                    continue
                found[packet.pts] = int(packet.duration or 0)
    except (av.FFmpegError, OSError, AttributeError):  # no video stream: the mapping pass says so
        # A clip that cannot be read through: the mapping pass says where it is damaged.
        return SourceMeta(Fraction(1) / rate if rate else Fraction(1, 1000))
    pts = sorted(found)
    times: tuple[int, ...] = ()
    last = found[pts[-1]] if pts else 0
    if len(pts) > 2 and rate and not untimed:
        tick = 1 / (rate * time_base)  # one frame at the nominal rate, in ticks
        steps = [b - a for a, b in zip(pts, pts[1:])]
        if any(abs(step - tick) > 1 for step in steps):
            times = tuple(p - pts[0] for p in pts)
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
            log.info(
                "clip %s: its picture starts %.3f s into the file, after its sound; its depth clip starts there too",
                shown(path.name), float(start * time_base),
            )
    return SourceMeta(time_base, times, last, matrix, start, 1 / (rate * time_base) if rate else Fraction(0))


def _earliest_start(container: object) -> Fraction | None:
    """When the file's first sound or picture is shown (its streams' own start times), in seconds.

    Never before 0: a negative start is an encoder's priming (AAC's 1024
    samples), cut off by the edit list, not a moment the file shows.
    """
    starts = [
        s.start_time * Fraction(s.time_base)
        for s in container.streams  # type: ignore[attr-defined]
        if s.type in ("video", "audio") and s.start_time is not None and s.time_base
    ]
    return max(Fraction(0), min(starts)) if starts else None


def _display_matrix(container: object, stream: object) -> tuple[int, ...] | None:
    """The display matrix FFmpeg attaches to the first decoded frame (from the stream's side data)."""
    for frame in container.decode(stream):  # type: ignore[attr-defined]
        for side in frame.side_data:
            if "DISPLAYMATRIX" in str(side.type):
                data = bytes(side)
                if len(data) == 36:
                    matrix = struct.unpack("=9i", data)
                    return None if matrix == (65536, 0, 0, 0, 65536, 0, 0, 0, 1 << 30) else matrix
        return None
    return None
