"""Video clips in: what a container says about its clip, and its frames in presentation order.

PyAV (the `video` extra) runs FFmpeg's own libraries inside this process: no
ffmpeg subprocess, so the daemon never forks. It is imported only when a clip
is met, so the core install stays small; without it `require_av` says, in one
line, what to install. Whether a file being copied in is whole yet is
`wholeness`'s, from its bytes alone: a clip cut short is refused before
FFmpeg opens it.

Frame k is the k-th frame FFmpeg's decoder hands out, which is presentation
order (B-frames reordered) after the container's edit list is applied: the
frames `ffprobe -count_frames` counts and an editor's timeline shows.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from depthwatch.errors import FrameError
from depthwatch.media import orientation
from depthwatch.media.wholeness import is_complete

#: File extensions taken as clips (the containers editors hand around).
CLIP_EXTENSIONS = frozenset({".mov", ".mp4", ".m4v", ".mkv", ".mxf", ".avi", ".webm", ".mts", ".m2ts"})

INSTALL = "pip install 'depthwatch[video]'"

#: Containers with no end structure whose header says how long the clip is (AVI a frame count,
#: MXF a duration): a copy cut short still declares the whole. (MPEG-TS only estimates its length.)
_DECLARING = frozenset({"avi", "mxf"})


def is_clip_name(path: Path) -> bool:
    return path.suffix.lower() in CLIP_EXTENSIONS


def picture_stream(container: Any) -> Any:
    """The clip's picture among its video streams; None when it has none.

    Why not the first: a cover image or a thumbnail is a video stream too,
    and Matroska may list it first (a one-frame PNG: taken, its "depth clip" is
    one frame, said written). So: never an attached picture, a still or a
    thumbnail track (unless that is all there is), then the stream marked
    default, then one that lasts (nine tenths of the longest at least: a
    cover unmarked is a frame long), then the largest (a proxy track lasts as
    long as the picture, at a fraction of its size), then the longest, then
    the first. Every reader of a clip (local, the farm's index and workers,
    its timing) asks here, so all read the same frames.
    """
    streams = list(container.streams.video)
    if not streams:
        return None
    av = require_av()
    flags = av.stream.Disposition
    aside = flags.attached_pic | flags.still_image | flags.timed_thumbnails
    moving = [s for s in streams if not s.disposition & aside] or streams

    seconds = {s.index: _seconds(s) for s in moving}
    longest = max(seconds.values())

    def rank(s: Any) -> tuple[bool, bool, int, float, int]:
        lasts = seconds[s.index] >= longest * 0.9
        return (bool(s.disposition & flags.default), lasts, s.codec_context.width * s.codec_context.height, seconds[s.index], -s.index)

    return max(moving, key=rank)


def _seconds(stream: Any) -> float:
    """How long a stream lasts by its container (Matroska keeps it in a DURATION tag); 0 if unknown."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = str(stream.metadata.get("DURATION", ""))
    parts = tag.split(":")
    try:
        return float(parts[0]) * 3600 + float(parts[1]) * 60 + float(parts[2]) if len(parts) == 3 else 0.0
    except ValueError:
        return 0.0


def require_av() -> ModuleType:
    """PyAV, or FrameError with the one line that says how to get it."""
    try:
        import av
    except ImportError:
        raise FrameError(f"clips need PyAV (FFmpeg in-process), which is not installed; run: {INSTALL}") from None
    return av


@dataclass(frozen=True)
class ClipInfo:
    """What the container says about its video stream; a depth clip copies all of it."""

    width: int
    height: int
    #: The frame rate as FFmpeg guesses it (r_frame_rate): 24000/1001 stays exactly that.
    rate: Fraction
    #: Frames the container declares (0: it does not say, as Matroska often does not).
    frames: int
    #: The start timecode (tmcd track or timecode tag), like 01:00:00:00, or None.
    timecode: str | None
    #: Pixel aspect (sample aspect ratio), None for square pixels or unknown.
    sar: Fraction | None
    codec: str
    #: The container's comment (a depth clip depthwatch made carries `cliprecord.MARK`).
    comment: str = ""
    #: Frames the clip must hold at least: what its header declares, where nothing else says the
    #: file is whole (AVI, MXF: no end structure to check). 0: no such promise (QuickTime, MP4 and
    #: Matroska are checked by their structure, and an edit list may show fewer frames than listed).
    expected: int = 0
    #: The display matrix (`sourcemeta`), where the job has read it: frames are turned upright by it.
    display_matrix: tuple[int, ...] | None = None
    #: Interlaced: which field comes first, as FFmpeg names it ("tt", "bb", "tb", "bt"); "" progressive or unsaid.
    field_order: str = ""
    #: The clip's sound: how many audio streams, and the first one's channels and sample rate (0: none).
    audio_streams: int = 0
    audio_channels: int = 0
    audio_rate: int = 0

    @functools.cached_property  # read for every frame a depth clip stores
    def turn(self) -> orientation.Turn | None:
        """How the stored pixels become the picture as shown (`orientation`), None: as stored."""
        return orientation.turn_for(self.display_matrix)

    @property
    def shown_size(self) -> tuple[int, int]:
        """(width, height) of the picture as shown: the maps' size."""
        turn = self.turn
        return turn.size(self.width, self.height) if turn is not None else (self.width, self.height)

    @property
    def shown_sar(self) -> Fraction | None:
        """The pixel aspect of the picture as shown (a quarter turn turns 4:3 into 3:4): an upright sequence's."""
        turn = self.turn
        return turn.aspect(self.sar) if turn is not None else self.sar

    def stored(self, depth: np.ndarray) -> np.ndarray:
        """A map made upright, turned back as the stored pixels lie (what a depth clip holds)."""
        turn = self.turn
        return turn.stored(depth) if turn is not None else depth

    def describe(self) -> str:
        rate = f"{float(self.rate):.3f}".rstrip("0").rstrip(".")
        count = f"{self.frames} frames" if self.frames else "frames unknown"
        tc = f", timecode {self.timecode}" if self.timecode else ""
        return f"{self.codec} {self.width}x{self.height} at {rate} fps, {count}{tc}"


def _reason(exc: Exception) -> str:
    strerror = getattr(exc, "strerror", None)
    text = str(strerror or exc).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    # PyAV's messages end in "...: 'path'"; the caller names the file already.
    return text.split(": '", 1)[0][:200]


class Clip:
    """An open clip: `info`, and `frames()` to decode it once, start to end (a context manager).

    Opening twice is how a two-pass job reads a clip twice without holding it.
    """

    def __init__(self, path: Path) -> None:
        av = require_av()
        self.path = path
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise FrameError(f"cannot read the clip: {exc.strerror or exc}") from None
        if size == 0:
            raise FrameError("the file is empty (0 bytes)")
        whole = is_complete(path, size)
        if whole is False:
            raise FrameError("the clip is cut short: its data ends before its boxes do, or its index is missing (an unfinished copy?)")
        try:
            self._container = av.open(str(path), "r", metadata_errors="ignore")
        except av.FFmpegError as exc:
            raise FrameError(f"not a clip FFmpeg can read, or cut short (its index is missing): {_reason(exc)}") from None
        except OSError as exc:
            raise FrameError(f"cannot open the clip: {exc.strerror or exc}") from None
        try:
            stream = picture_stream(self._container)
            if stream is None:
                raise FrameError("has no video stream (audio or data only); nothing to map")
            stream.thread_type = "AUTO"  # FFmpeg's own decoding threads
            self._stream = stream
            ctx = stream.codec_context
            if not ctx.width or not ctx.height:
                raise FrameError("its video stream declares no picture size; the file is damaged")
            rate = stream.guessed_rate or stream.average_rate or stream.base_rate
            if not rate:
                raise FrameError("its video stream declares no frame rate; cannot keep its timing")
            sar = stream.sample_aspect_ratio
            tags = {str(k).lower(): str(v) for k, v in self._container.metadata.items()}  # Matroska says COMMENT
            declares = whole is None and self._container.format.name in _DECLARING
            self.info = ClipInfo(
                width=ctx.width,
                height=ctx.height,
                rate=Fraction(rate),
                frames=int(stream.frames or 0),
                timecode=_timecode(self._container),
                sar=Fraction(sar) if sar and Fraction(sar) != 1 else None,
                codec=ctx.name,
                comment=tags.get("comment", ""),
                expected=_declared_frames(stream, Fraction(rate)) if declares else 0,
                field_order=field_order_of(ctx),
                **_sound(self._container),
            )
        except BaseException:
            self._container.close()
            raise

    def frames(self, scale: int = 1, turn: orientation.Turn | None = None) -> Iterator[np.ndarray]:
        """Each frame as BGR uint8 [H, W, 3], in presentation order; FrameError if the clip is damaged.

        `scale` > 1: each frame shrunk by that factor (area average) as it is converted,
        cheaper than converting the whole frame and shrinking it after. `turn`: each
        frame turned from its stored pixels to the picture as shown.

        (A copy that stopped half-way is refused when the clip is opened, by its structure:
        the container's frame count is no guide, since an edit list may drop frames it lists.
        AVI and MXF have no such structure: `info.expected` is what their header declares.)
        """
        av = require_av()
        count = 0
        size = {}
        if scale > 1:  # sides rounded up, as libjpeg's reduced decode rounds them (see `codec.reduction`)
            size = {"width": -(-self.info.width // scale), "height": -(-self.info.height // scale), "interpolation": "AREA"}
        try:
            for frame in self._container.decode(self._stream):
                image = frame.to_ndarray(format="bgr24", **size)
                yield turn.shown(image) if turn is not None else image
                count += 1
        except av.FFmpegError as exc:
            raise FrameError(f"the clip is damaged after frame {count}: {_reason(exc)}") from None
        if count == 0:
            raise FrameError("its video stream holds no frames FFmpeg can decode; the file is damaged or cut short")

    def close(self) -> None:
        self._container.close()

    def __enter__(self) -> Clip:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


#: FFmpeg's interlaced field orders (AVFieldOrder), by number and by name: which field is first in time.
FIELD_ORDERS = {2: "tt", 3: "bb", 4: "tb", 5: "bt"}
_FIELD_NAMES = {
    "tt": "top field first",
    "bb": "bottom field first",
    "tb": "bottom field shown first, top coded first",
    "bt": "top field shown first, bottom coded first",
}


def field_order_of(ctx: Any) -> str:
    """A codec context's field order as FFmpeg names it ("tt"...); "" progressive or unsaid."""
    order = getattr(ctx, "field_order", None)
    if isinstance(order, int):
        return FIELD_ORDERS.get(order, "")
    name = str(order or "").lower()
    return name if name in _FIELD_NAMES else ""


def describe_fields(order: str) -> str:
    """How a field order reads in a log line (`tt`: top field first)."""
    return _FIELD_NAMES.get(order, order)


def _sound(container: Any) -> dict[str, int]:
    """The clip's audio streams, and the first one's channels and sample rate (for a timeline's asset)."""
    streams = list(container.streams.audio)
    if not streams:
        return {}
    ctx = streams[0].codec_context
    return {"audio_streams": len(streams), "audio_channels": int(ctx.channels or 0), "audio_rate": int(ctx.sample_rate or 0)}


def _declared_frames(stream: object, rate: Fraction) -> int:
    """The frames the container's header declares (AVI: a count; MXF: a duration), 0 if it does not say."""
    frames = int(getattr(stream, "frames", 0) or 0)
    if frames:
        return frames
    duration, time_base = getattr(stream, "duration", None), getattr(stream, "time_base", None)
    if not duration or not time_base:
        return 0
    return max(0, round(Fraction(duration) * Fraction(time_base) * rate))


def _timecode(container: object) -> str | None:
    """The start timecode: the video stream's tag, a tmcd (data) stream's, or the file's."""
    streams = getattr(container, "streams")
    for holder in [*streams.video, *streams.data, *getattr(streams, "other", ()), container]:
        # Matroska's tags are upper case (TIMECODE), QuickTime's and MXF's lower.
        tc = next((value for key, value in getattr(holder, "metadata", {}).items() if str(key).lower() == "timecode"), None)
        if tc:
            return str(tc)
    return None
