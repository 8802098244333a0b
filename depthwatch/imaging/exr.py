"""EXR in and out with the OpenEXR package (the ASWF's own Python bindings), in memory.

Out: a depth map as one channel `Z`, as Nuke (`depth.Z`), Resolve/Fusion and
After Effects look for it, float32 or half, in a single-part scanline file.
`encode` returns the file's bytes (the bindings write to a stream since 3.5),
so an EXR map goes through the same atomic writer as every other map and
carries its provenance record the same way (`frames/provenance.py` adds it as
a string attribute). `encode` is the one EXR encoder: `depthwatch once` and
the daemon use it through `codec.encode`, and image-sequence writers may call
it directly.

In: RGB(A) float, half (or Y) frames. The file's structure is checked first
(`exrlayout`: data window, channels, every chunk where the offset table
says) so a file cut short, with a tile never written, or declaring a huge
image never reaches the decoder; then only the colour channels are turned
into the 8-bit display picture the model expects (`view`).

The OpenCV EXR codec is not used at all: OpenCV leaves it off for safety and
depthwatch keeps it that way (no process-wide switch).
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType

import numpy as np

from depthwatch.errors import FrameError
from depthwatch.imaging import exrlayout, view
from depthwatch.logtext import shown

#: `output.exr_compression` values and what they are in the file. zip: lossless, the
#: default; piz: lossless, better on grainy data; dwaa: lossy, smallest; none: fastest.
COMPRESSIONS = ("zip", "piz", "dwaa", "none")
#: `output.exr_channels` values: z+rgb, the map as Z (depth, for compositors) and as R, G and B
#: (a grey picture to every viewer: FFmpeg, ImageMagick, OpenImageIO, Blender's image editor);
#: z+y, Z and Y (the same picture in one channel, but FFmpeg 5 refuses Y beside any other
#: channel but A: "Not yet implemented"); z, Z alone. Three equal planes cost little: zip finds
#: each row again in the next channel (a 1080p float map: 8.4 MB against 7.9 for Z alone).
CHANNEL_SETS = {"z+rgb": ("Z", "R", "G", "B"), "z+y": ("Z", "Y"), "z": ("Z",)}
#: At most this many channels are decoded (a beauty pass with a few AOVs); more is not a frame.
MAX_CHANNELS = 64


@functools.lru_cache(maxsize=1)
def _openexr() -> ModuleType:
    try:
        import OpenEXR
    except ImportError:
        raise FrameError("EXR needs the OpenEXR package (pip install 'OpenEXR>=3.5'), which is not installed") from None
    if not hasattr(OpenEXR, "File"):
        raise FrameError(f"the OpenEXR package here is version {getattr(OpenEXR, '__version__', '?')}; EXR needs 3.5 or later")
    return OpenEXR


def _compression(name: str) -> object:
    lib = _openexr()
    table = {
        "zip": lib.ZIP_COMPRESSION,
        "piz": lib.PIZ_COMPRESSION,
        "dwaa": lib.DWAA_COMPRESSION,
        "none": lib.NO_COMPRESSION,
    }
    if name not in table:
        raise FrameError(f"EXR compression {name!r} is not one of {', '.join(COMPRESSIONS)}")
    return table[name]


def encode(
    depth: np.ndarray,
    *,
    half: bool = False,
    compression: str = "zip",
    attributes: Mapping[str, str] | None = None,
    windows: Windows | None = None,
    channels: str = "z+rgb",
    frame: FrameMeta | None = None,
) -> bytes:
    """The bytes of an EXR holding `depth` (a 2-D map) as channel `Z`, and as R, G, B by default.

    A Z-only file is what Nuke files depth under (`depth.Z`), but every viewer
    (ImageMagick, Blender's image editor, ffmpeg, which refuses it outright)
    shows it black, as if the map were empty. The same values in R, G and B
    make the file a grey picture to all of them (`CHANNEL_SETS`).

    float maps are written as they are (float32, or half with `half`); uint8
    and uint16 maps are scaled to [0, 1] first. `attributes`: extra string
    header attributes (a provenance record, a timecode note). `windows`: the
    EXR frame's data and display windows, so a map of a render cropped to its
    bounding box (or with overscan) lands on the plate in Nuke; the map must
    be the data window's size. `frame`: a clip's frame in a sequence, whose
    timecode, rate and pixel aspect go into the standard attributes.
    """
    lib = _openexr()
    if channels not in CHANNEL_SETS:
        raise FrameError(f"EXR channels {channels!r} is not one of {', '.join(CHANNEL_SETS)}")
    if depth.ndim != 2:
        raise FrameError(f"an EXR depth map is one channel, not an array of shape {depth.shape}")
    if np.issubdtype(depth.dtype, np.integer):
        z = depth.astype(np.float32) * np.float32(1 / np.iinfo(depth.dtype).max)
    else:
        z = depth.astype(np.float32, copy=False)
    z = np.ascontiguousarray(z.astype(np.float16) if half else z)
    header: dict[str, object] = {"compression": _compression(compression), "type": lib.scanlineimage}
    if windows is not None:
        x0, y0, x1, y1 = windows.data
        if (x1 - x0 + 1, y1 - y0 + 1) != (z.shape[1], z.shape[0]):
            raise FrameError(f"the depth map is {z.shape[1]}x{z.shape[0]}, not its EXR frame's {x1 - x0 + 1}x{y1 - y0 + 1}")
        header["dataWindow"] = (np.array([x0, y0], np.int32), np.array([x1, y1], np.int32))
        d0, e0, d1, e1 = windows.display
        header["displayWindow"] = (np.array([d0, e0], np.int32), np.array([d1, e1], np.int32))
    if frame is not None:
        header.update(frame.attributes(lib))
    header.update(attributes or {})
    out = io.BytesIO()
    try:
        with lib.File(header, {name: z for name in CHANNEL_SETS[channels]}) as image:
            image.write(out)
    except Exception as exc:  # the bindings raise RuntimeError/ValueError with the library's text
        raise FrameError(f"could not encode the depth map as EXR: {exc}") from None
    return out.getvalue()


@dataclass(frozen=True)
class FrameMeta:
    """A clip's frame as an EXR in a sequence says it: `timeCode`, `framesPerSecond`, `pixelAspectRatio`.

    What Nuke, Resolve and OpenImageIO read to put the frame back on its
    source's timeline (the timecode is the frame's own, not the clip's start).
    """

    #: HH:MM:SS:FF, or HH:MM:SS;FF for drop-frame; None when the source has none.
    timecode: str | None
    #: None: the source (an EXR frame) says none.
    rate: Fraction | None
    pixel_aspect: Fraction | None = None

    def attributes(self, lib: ModuleType) -> dict[str, object]:
        found: dict[str, object] = {"pixelAspectRatio": float(self.pixel_aspect or 1)}
        if self.rate:
            found["framesPerSecond"] = self.rate
        fields = re.fullmatch(r"(\d\d):(\d\d):(\d\d)([:;.,])(\d\d)", self.timecode or "")
        if fields:
            code = lib.TimeCode()
            code.hours, code.minutes, code.seconds, code.frame = (int(fields.group(i)) for i in (1, 2, 3, 5))
            code.dropFrame = fields.group(4) in ";,"
            found["timeCode"] = code
        return found


@dataclass(frozen=True)
class Windows:
    """An EXR frame's data window (the pixels stored) and display window, (x_min, y_min, x_max, y_max)."""

    data: tuple[int, int, int, int]
    display: tuple[int, int, int, int]

    @property
    def plain(self) -> bool:
        """Stored from (0, 0) and displayed as stored: nothing to carry over."""
        return self.data[:2] == (0, 0) and self.data == self.display


@dataclass(frozen=True)
class Picture:
    """An EXR frame as the model sees it: BGR uint8, how many values were not finite, its windows."""

    image: np.ndarray
    not_finite: int
    windows: Windows | None = None
    #: The frame's own timecode, rate and pixel aspect, which its EXR map carries on.
    frame: FrameMeta | None = None


def layout(data: bytes) -> exrlayout.Layout:
    """The structure of an EXR held in memory; FrameError (one line) if it is no frame."""
    try:
        return exrlayout.read_layout(lambda o, n: data[o : o + n], len(data))
    except exrlayout.Incomplete:
        raise FrameError("the EXR is cut short inside its header: the file is incomplete") from None
    except exrlayout.ExrProblem as exc:
        raise FrameError(f"the EXR is unusable: {exc}") from None


def colour_channels(found: exrlayout.Layout) -> tuple[str, ...]:
    """The channels that make the picture: R, G, B (A and any others are left out) or Y."""
    names = {c.name: c for c in found.channels}
    wanted = ("R", "G", "B") if all(n in names for n in "RGB") else ("Y",) if "Y" in names else None
    if wanted is None:
        listed = ", ".join(shown(n) for n in sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise FrameError(f"the EXR has no R, G, B (or Y) channels, only {listed or 'none'}: not a picture depthwatch reads")
    for name in wanted:
        channel = names[name]
        if (channel.x_sampling, channel.y_sampling) != (1, 1):
            raise FrameError(f"the EXR's {name} channel is subsampled ({channel.x_sampling}x{channel.y_sampling}); save it at full resolution")
        if channel.pixel_type not in (1, 2):
            kind = exrlayout.PIXEL_TYPES.get(channel.pixel_type, str(channel.pixel_type))
            raise FrameError(f"the EXR's {name} channel holds {kind} values, not half or float colour")
    return wanted


def decode(data: bytes, found: exrlayout.Layout, colour: str, max_pixels: int) -> Picture:
    """The frame's picture; FrameError says why an EXR cannot be one.

    `found` is its layout (already checked against the megapixel limit); the
    decoder holds every channel at once, so the channel count is bounded too.
    """
    if len(found.channels) > MAX_CHANNELS:
        raise FrameError(
            f"the EXR has {len(found.channels)} channels, more than the {MAX_CHANNELS} depthwatch decodes "
            "for a frame; write the beauty pass (R, G, B) on its own"
        )
    if found.pixels * len(found.channels) > 4 * max_pixels:
        raise FrameError(
            f"the EXR's {len(found.channels)} channels of {found.width}x{found.height} are more data than "
            f"{max_pixels / 1e6:.0f} megapixels of RGBA; raise daemon.max_megapixels or write fewer channels"
        )
    wanted = colour_channels(found)
    for channel in found.channels:  # what the decoder would allocate for, or divide by
        if channel.pixel_type not in exrlayout.PIXEL_TYPES or (channel.x_sampling, channel.y_sampling) != (1, 1):
            raise FrameError(
                f"the EXR's {shown(channel.name)} channel is of type {channel.pixel_type} sampled "
                f"{channel.x_sampling}x{channel.y_sampling}; depthwatch decodes full-resolution channels only"
            )
    if found.tile and found.tile[0] * found.tile[1] > max(4 * found.pixels, 1 << 20):
        raise FrameError(f"the EXR's tiles ({found.tile[0]}x{found.tile[1]}) are far larger than its image; the file is damaged")
    missing = exrlayout.missing_chunk(found, lambda o, n: data[o : o + n], len(data))
    if missing:
        raise FrameError(f"the EXR is incomplete: {missing}")
    lib = _openexr()
    try:
        with lib.File(io.BytesIO(data), separate_channels=True, num_threads=0) as image:
            frame = _frame_meta(image.header())
            channels = image.channels()
            planes = [channels[name].pixels if name in channels else None for name in wanted]
            if any(plane is None or plane.shape != (found.height, found.width) for plane in planes):
                # The bindings print the library's reason and leave the channel out (or empty).
                raise FrameError("cannot decode the EXR data: its compressed pixels are damaged")
            # BGR, as OpenCV decodes; a copy made while the file's buffers are surely alive.
            stack = np.stack(planes[::-1] if len(planes) == 3 else planes * 3, axis=-1)
    except FrameError:
        raise
    except Exception as exc:  # the bindings raise RuntimeError/ValueError/KeyError with the library's text
        lines = str(exc).strip().splitlines()
        raise FrameError(f"cannot decode the EXR data: {lines[-1] if lines else type(exc).__name__}") from None
    if stack.shape[:2] != (found.height, found.width):
        raise FrameError(f"the EXR decoded to {stack.shape[1]}x{stack.shape[0]}, not the {found.width}x{found.height} its header declares")
    windows = Windows(found.data_window, found.display_window or found.data_window)
    d0, e0, d1, e1 = windows.display
    if (d1 - d0 + 1) * (e1 - e0 + 1) > max_pixels or d1 < d0 or e1 < e0:
        raise FrameError(
            f"the EXR's display window ({d1 - d0 + 1}x{e1 - e0 + 1}) is empty or over the limit of "
            f"{max_pixels / 1e6:.0f} megapixels; raise daemon.max_megapixels"
        )
    return Picture(view.to_display(stack, colour), view.count_not_finite(stack), None if windows.plain else windows, frame)


def _frame_meta(header: Mapping[str, object]) -> FrameMeta | None:
    """A plate's `timeCode`, `framesPerSecond` and `pixelAspectRatio`, for its map to say the same."""
    code, rate, aspect = header.get("timeCode"), header.get("framesPerSecond"), header.get("pixelAspectRatio")
    timecode = None
    if code is not None and hasattr(code, "hours"):
        mark = ";" if getattr(code, "dropFrame", False) else ":"
        timecode = f"{code.hours:02d}:{code.minutes:02d}:{code.seconds:02d}{mark}{code.frame:02d}"  # type: ignore[attr-defined]
    try:
        rate = Fraction(rate) if rate is not None and Fraction(rate) > 0 else None  # type: ignore[arg-type]
        aspect = Fraction(float(aspect)).limit_denominator(10_000) if aspect is not None and float(aspect) > 0 else None  # type: ignore[arg-type]
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        rate = aspect = None
    if timecode is None and rate is None and aspect in (None, 1):
        return None
    return FrameMeta(timecode, rate, aspect)
