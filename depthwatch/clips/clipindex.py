"""A clip's frames in presentation order, from its packet index (demuxed, never decoded), cut into ranges.

Frame k of a clip is the k-th frame FFmpeg's decoder hands out: presentation
order (B-frames reordered) after the container's edit list. The demuxer says
all of that without decoding: every packet carries its presentation time, and
the packets an edit list hides from view carry FFmpeg's discard flag (their
frames are decoded, as references, and dropped). So the shown frames are the
presentation times of the packets not discarded, sorted; that list is what
`once --farm` sends each worker, a range of it, and the worker checks that its
decoder gave exactly those frames.

A worker starts decoding at a keyframe. With open GOPs a picture shown before
its GOP's keyframe may refer to the GOP before it, so a range is decoded from
the keyframe before the one whose GOP holds the range's first frame: every
frame of the range then has all its references (the frames decoded before
the range are dropped, unconverted).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from depthwatch.errors import FrameError
from depthwatch.media.video import picture_stream, require_av


@dataclass(frozen=True)
class ClipIndex:
    """The shown frames of a clip's first video stream, and where decoding may start."""

    #: The stream's time base: each time below is in it.
    time_base: Fraction
    #: Each shown frame's presentation time, in presentation order (frame k is `times[k]`).
    times: tuple[int, ...]
    #: Where a decoder may start (the keyframes' earliest time stamp, pts or dts), in decode order.
    keyframes: tuple[int, ...]
    #: For each frame, how many keyframes come before its packet in decode order (its GOP's number + 1).
    gop_of: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.times)

    def seek_for(self, first: int) -> int | None:
        """Where to seek to decode frames from `first` on: the keyframe before its GOP's (None: from the start)."""
        gop = self.gop_of[first]  # 1: the first GOP
        return self.keyframes[gop - 2] if gop >= 2 else None


def read(path: Path) -> ClipIndex:
    """The clip's index from its packets; FrameError (one line) when they cannot say it."""
    av = require_av()
    times: list[tuple[int, int]] = []  # (pts, decode position)
    keyframes: list[int] = []
    position: list[int] = []  # for each shown packet, the keyframes seen so far
    try:
        with av.open(str(path), "r", metadata_errors="ignore") as container:
            stream = picture_stream(container)
            if stream is None:
                raise FrameError("has no video stream (audio or data only); nothing to map")
            time_base = Fraction(stream.time_base)
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue  # the demuxer's flush
                if packet.is_keyframe:
                    stamps = [t for t in (packet.pts, packet.dts) if t is not None]
                    if stamps:
                        keyframes.append(min(stamps))
                if packet.is_discard:
                    continue  # hidden by the edit list: decoded as a reference, never shown
                if packet.pts is None:
                    raise FrameError(
                        "its packets carry no presentation times (raw streams, some AVIs), so it cannot be split "
                        "frame-exact; map it without --farm"
                    )
                times.append((packet.pts, len(times)))
                position.append(len(keyframes))
    except av.FFmpegError as exc:
        raise FrameError(f"cannot read the clip's packet index: {exc}") from None
    if not times:
        raise FrameError("its video stream holds no frames; the file is damaged or cut short")
    if not keyframes:
        raise FrameError("its video stream has no keyframe to start decoding at; map it without --farm")
    order = sorted(range(len(times)), key=lambda i: times[i][0])
    pts = tuple(times[i][0] for i in order)
    if len(set(pts)) != len(pts):
        raise FrameError("two of its frames share a presentation time, so frame k is not one frame; map it without --farm")
    # A frame's GOP, for a range starting there: the latest GOP of any packet shown from it on
    # (with B-frames a later-shown frame may come from an earlier GOP, never the other way round).
    gops = [position[i] for i in order]
    for k in range(len(gops) - 2, -1, -1):
        gops[k] = min(gops[k], gops[k + 1])
    return ClipIndex(time_base, pts, tuple(keyframes), tuple(gops))


def ranges(count: int, size: int) -> list[tuple[int, int]]:
    """[first, end) ranges of `size` frames covering `count` frames; the last one takes a short remainder."""
    size = max(1, size)
    cuts = list(range(0, count, size))
    if len(cuts) > 1 and count - cuts[-1] < size // 2:
        cuts.pop()  # a short tail joins the range before it
    return [(a, b) for a, b in zip(cuts, [*cuts[1:], count])]
