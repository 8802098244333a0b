"""Depth clips out: one encoder per output kind, each copying the source's timing and shape.

By the output's extension:
  .mov  ProRes 422 HQ, 10-bit 4:2:2: the grey map as luma, chroma neutral (what
        Final Cut Pro, Resolve and After Effects take as a matte without a transcode);
  .mkv  FFV1, lossless 16-bit grey (for grading and compositing);
  .mp4  H.264, 8-bit 4:2:0: a preview, small and playable anywhere.
Every one gets the source's frame rate as a fraction (24000/1001 stays exactly
that), its size, its pixel aspect, its start timecode (a tmcd track in .mov
and .mp4, a tag in .mkv) and its display matrix (`sourcemeta`). Frame k
written is frame k shown: pts k at 1/rate, or, from a variable-rate source,
the source frame's own time in the source's time base (and from a source whose
picture starts after its sound, from that start: `sourcemeta`).

The file is written under the name it is given (a temporary one: see
`clips`), so the container is named by `kind`, not by the extension.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.errors import FrameError, OutputError
from depthwatch.media.cliprecord import MARK, first_frame_mark, picture_of, quoted
from depthwatch.media.sourcemeta import SourceMeta
from depthwatch.media.video import FIELD_ORDERS, ClipInfo, require_av


@dataclass(frozen=True)
class Kind:
    """How one output extension is written: container, codec, pixel format, encoder options."""

    container: str
    codec: str
    pix_fmt: str
    options: tuple[tuple[str, str], ...] = ()
    label: str = ""


KINDS = {
    # prores_aw, not prores_ks: the same HQ profile, about 4x faster at 1080p (measured, 2 cores).
    ".mov": Kind("mov", "prores_aw", "yuv422p10le", (("profile", "3"), ("vendor", "apl0")), "ProRes 422 HQ 10-bit"),
    ".mkv": Kind("matroska", "ffv1", "gray16le", (("level", "3"), ("slicecrc", "1")), "FFV1 lossless 16-bit grey"),
    ".mp4": Kind("mp4", "libx264", "yuv420p", (("crf", "16"), ("preset", "fast")), "H.264 preview 8-bit"),
}


def kind_for(ext: str) -> Kind | None:
    return KINDS.get(ext.lower())


class ClipWriter:
    """Encodes depth maps (uint16 [H, W], 0 = far unless inverted) into one clip file.

    `close()` flushes the encoder and finishes the container; `abort()` drops it
    (the caller removes the file). Either way the file is closed. A writer
    whose constructor raises has removed the file it created.
    """

    def __init__(
        self,
        path: Path,
        kind: Kind,
        info: ClipInfo,
        source: SourceMeta | None = None,
        made_from: tuple[int, int, int] | None = None,
        folder: int | None = None,
        clip: Path | None = None,
    ) -> None:
        """`made_from`: the source clip's version (size, mtime_ns, inode), said in the comment (see `made_from`).
        `folder`: a descriptor of `path`'s folder, held by the caller: the file is made in that very folder.
        `clip`: the source clip's path, said in the comment too (see `made_for`)."""
        av = require_av()
        self._made_from = f" (source {made_from[0]}:{made_from[1]}:{made_from[2]})" if made_from is not None else ""
        if made_from is not None and clip is not None:
            self._made_from += f" (clip {quoted(clip)})"
        self._av = av
        self.kind = kind
        self._info = info
        self._source = source if source is not None and source.timed else None
        self._count = 0
        #: A variable-rate frame's own duration by its time, for its packet (see `_mux`).
        self._lasting: dict[int, int] = {}
        w, h = info.width, info.height
        if kind.pix_fmt in ("yuv422p10le", "yuv420p") and w % 2:
            raise FrameError(f"{kind.label} needs an even width, and the clip is {w}x{h}; write .mkv (FFV1) instead")
        if kind.pix_fmt == "yuv420p" and h % 2:
            raise FrameError(f"{kind.label} needs an even height, and the clip is {w}x{h}; write .mov or .mkv instead")
        try:
            raw = open(path.name if folder is not None else path, "xb", opener=partial(_open_in, folder))
        except OSError as exc:
            raise OutputError(f"cannot create {path.name} in {path.parent}: {exc.strerror or exc}") from None
        # From here the file is this writer's own: a writer that does not start (a codec refused, or the
        # SIGTERM a farm manager cancels a task with, arriving now) removes it, as no caller holds it yet.
        try:
            self._file = _SyncedFile(raw)
            self._container = av.open(self._file, "w", format=kind.container)
        except BaseException:
            raw.close()
            _unlink(path, folder)
            raise
        try:
            stream = self._container.add_stream(kind.codec, rate=info.rate, options=dict(kind.options))
            stream.width, stream.height, stream.pix_fmt = w, h, kind.pix_fmt
            stream.time_base = self._source.time_base if self._source else Fraction(1) / info.rate
            stream.codec_context.time_base = stream.time_base
            stream.thread_type = "AUTO"
            if info.sar is not None:  # the codec's (ProRes, H.264 carry it) and the container's (Matroska's)
                stream.codec_context.sample_aspect_ratio = info.sar
                try:
                    stream.sample_aspect_ratio = info.sar
                except (AttributeError, TypeError):
                    pass
            _tag_colour(stream.codec_context, kind)
            if info.field_order:  # an interlaced source's depth clip is laid over it as the same kind of picture
                code = next(n for n, name in FIELD_ORDERS.items() if name == info.field_order)
                try:
                    stream.codec_context.field_order = code
                except (AttributeError, TypeError, ValueError):
                    pass  # a PyAV that cannot set it: the depth clip is marked progressive (the log says interlaced)
            # FFV1 takes the pixel aspect from each frame (PyAV's frames cannot carry one): setsar gives it.
            self._aspect = _aspect_filter(av, kind, w, h, info.sar) if kind.codec == "ffv1" and info.sar else None
            if info.timecode:
                stream.metadata["timecode"] = info.timecode
            if source is not None and source.display_matrix:
                stream.set_display_matrix(source.display_matrix)
            # What tells a depth clip depthwatch made from any other file at its name (see `made_here`):
            # the mark, and the first packet's digest, added as that packet is muxed (the header, with
            # the comment, is written then).
            self._container.metadata["comment"] = MARK
            self._marked = False
            self._stream = stream
            self._time_base = stream.time_base
        except BaseException:
            try:
                self._container.close()
            finally:
                self._file.close()
                _unlink(path, folder)
            raise

    def write(self, depth: np.ndarray) -> None:
        """Append the next frame's map: uint16 (or uint8) [H, W] at the clip's size."""
        frame = self.frame_for(depth)
        if self._aspect is not None:
            self._aspect.push(frame)
            frame = self._aspect.pull()
        _tag_colour(frame, self.kind)  # prores_aw writes each frame's own tags into its frame header
        if self._source is not None:
            frame.pts, frame.duration = self._source.time_of(self._count)
            self._lasting[frame.pts] = frame.duration
        else:
            frame.pts = self._count
        frame.time_base = self._time_base
        self._count += 1
        try:
            packets = self._stream.encode(frame)
        except self._av.FFmpegError as exc:
            raise FrameError(f"the {self.kind.label} encoder failed: {exc.strerror or exc}") from None
        self._mux(packets)

    def copy(self, packet: Any) -> None:
        """Append a frame already encoded as this kind (a farm segment's packet), timed as the next frame.

        For the intra-only kinds (ProRes, FFV1), whose packets are each a whole
        frame: segments of one clip, written by this class with the same
        settings, join into the clip it would have written frame by frame.
        """
        # The packet keeps the duration its encoder gave it, as `write`'s packets do (the encoder's
        # frame duration, 1/rate): only its time changes.
        lasts = Fraction(packet.duration) * Fraction(packet.time_base) if packet.duration and packet.time_base else None
        if self._source is not None:
            packet.pts, duration = self._source.time_of(self._count)
        else:
            packet.pts, duration = self._count, 1
        packet.dts = packet.pts
        packet.duration = round(lasts / self._time_base) if lasts is not None else duration
        packet.time_base = self._time_base
        packet.stream = self._stream
        self._count += 1
        self._mux([packet])

    def frame_for(self, depth: np.ndarray) -> Any:
        """The encoder's frame for a map: grey as is, or luma in video range with neutral chroma.

        Written into the frame's planes directly: the map is the luma, so no
        colour conversion is needed (swscale's costs more than the encode).
        """
        av = self._av
        kind = self.kind
        if kind.pix_fmt == "gray16le":
            grey = depth if depth.dtype == np.uint16 else depth.astype(np.uint16) * np.uint16(257)
            return av.VideoFrame.from_ndarray(np.ascontiguousarray(grey), format="gray16le")
        h, w = depth.shape
        frame = av.VideoFrame(w, h, kind.pix_fmt)
        if kind.pix_fmt == "yuv422p10le":  # Y' 64..940, Cb = Cr = 512
            top = 65535.0 if depth.dtype == np.uint16 else 255.0
            luma = (depth.astype(np.float32) * np.float32(876 / top) + np.float32(64.5)).astype(np.uint16)
            dtype, neutral = np.uint16, 512
        else:  # yuv420p: Y' 16..235, Cb = Cr = 128
            top = 65535.0 if depth.dtype == np.uint16 else 255.0
            luma = (depth.astype(np.float32) * np.float32(219 / top) + np.float32(16.5)).astype(np.uint8)
            dtype, neutral = np.uint8, 128
        size = np.dtype(dtype).itemsize
        for i, plane in enumerate(frame.planes):
            view = np.frombuffer(plane, dtype).reshape(plane.height, plane.line_size // size)[:, : plane.width]
            if i == 0:
                view[:] = luma
            else:
                view.fill(neutral)
        return frame

    def _mux(self, packets: Any) -> None:
        for packet in packets:
            # An encoder gives its packets 1/rate whatever the frame's duration was; the container
            # takes each sample's from the next one's time, but the last one's from its packet.
            lasts = self._lasting.pop(packet.pts, None) if self._lasting and packet.pts is not None else None
            if lasts is not None:
                packet.duration = lasts
            if not self._marked and packet.size:
                picture = picture_of(bytes(packet), self.kind.codec.replace("libx264", "h264"))
                self._container.metadata["comment"] = f"{MARK} {first_frame_mark(picture)}{self._made_from}"
                self._marked = True
        try:
            self._container.mux(packets)
        except OSError as exc:
            raise OutputError(f"cannot write the depth clip: {exc.strerror or exc}") from None
        except self._av.FFmpegError as exc:
            raise FrameError(f"the {self.kind.label} encoder failed: {exc.strerror or exc}") from None

    def close(self) -> None:
        try:
            try:
                packets = self._stream.encode(None)
            except self._av.FFmpegError as exc:
                raise FrameError(f"the {self.kind.label} encoder failed: {exc.strerror or exc}") from None
            self._mux(packets)
        finally:
            try:
                self._container.close()
            finally:
                try:
                    self._file.close(sync=True)
                except OSError as exc:  # the last bytes, flushed: a full disk shows here too
                    raise OutputError(f"cannot write the depth clip: {exc.strerror or exc}") from None

    def abort(self) -> None:
        try:
            self._container.close()
        except Exception:  # a half-written container may fail to finish; it is removed anyway
            pass
        finally:
            try:
                self._file.close()
            except OSError:  # its buffered bytes cannot go to a full disk: the file is removed anyway
                pass

    @property
    def frames(self) -> int:
        return self._count


def _open_in(folder: int | None, name: str, flags: int) -> int:
    return os.open(name, flags, 0o666, dir_fd=folder)  # the mode `open` gives on its own


def _unlink(path: Path, folder: int | None) -> None:
    try:
        os.unlink(path.name if folder is not None else path, dir_fd=folder)
    except FileNotFoundError:
        pass


class _SyncedFile:
    """The clip's file, handed to FFmpeg as a file object, flushed to disk every SYNC_BYTES.

    A depth clip is hundreds of megabytes. Left to the kernel, it sits in the
    page cache until writeback, and an fsync of a live frame's map (ext4's
    journal commits in order) can then wait behind a large part of it: a
    frame dropped while a clip is written waits up to 200 ms for its map. Synced as
    it goes (a megabyte at a time, on the clip's writer thread, which holds back
    while a live frame is in flight), there is never much of the clip to flush.
    """

    SYNC_BYTES = 1 << 20

    def __init__(self, f: Any) -> None:
        self._f = f
        self._unsynced = 0

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self._unsynced += len(data)
        if self._unsynced >= self.SYNC_BYTES:
            self._f.flush()
            os.fdatasync(self._f.fileno())
            self._unsynced = 0
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    def close(self, sync: bool = False) -> None:
        if self._f.closed:
            return
        try:
            if sync:
                self._f.flush()
                os.fsync(self._f.fileno())
        finally:
            self._f.close()


def _tag_colour(ctx: Any, kind: Kind) -> None:
    """Rec. 709 as editors assume for HD, video range for the Y'CbCr kinds and full range for grey: say so.

    On the codec context (the container's tags: the `colr` atom, Matroska's
    Colour) and on every frame: prores_aw writes each frame header's tags from
    the frame, and FFmpeg-based readers believe the frame header.
    """
    full = kind.pix_fmt.startswith("gray")
    for name, value in (("color_primaries", 1), ("color_trc", 1), ("colorspace", 1), ("color_range", 2 if full else 1)):
        try:
            setattr(ctx, name, value)
        except (AttributeError, TypeError, ValueError):
            pass


def _aspect_filter(av: Any, kind: Kind, width: int, height: int, sar: Fraction) -> Any:
    """A filter graph that only stamps `sar` on each frame passed through it."""
    from av import filter as avfilter

    graph = avfilter.Graph()
    source = graph.add("buffer", f"video_size={width}x{height}:pix_fmt={kind.pix_fmt}:time_base=1/1:pixel_aspect={sar.numerator}/{sar.denominator}")
    stamp = graph.add("setsar", f"sar={sar.numerator}/{sar.denominator}:max=1000000")
    sink = graph.add("buffersink")
    source.link_to(stamp)
    stamp.link_to(sink)
    graph.configure()
    return graph


# -- image sequences: each frame's own timecode -------------------------------------------
