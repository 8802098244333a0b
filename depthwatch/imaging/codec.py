"""Image files to pixels and depth maps to image files: decode and encode, no I/O, no state.

decode (bytes -> image: JPEG, PNG, TIFF, WebP, EXR through `exr`, and 10- and
12-bit TIFF and DPX plates through `plates`) comes
before the model; encode (map -> bytes) is the last step of the render chain
(see `render`). None of it runs on the inference thread.

One choice here is made for speed and tested to give the same result as the
obvious path: JPEGs are decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT
scaling) when the model's input is that much smaller than the frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np
import simplejpeg

from depthwatch.errors import FrameError
from depthwatch.imaging import exr, formats, jpegstrips, plates
from depthwatch.imaging.beside import Beside
from depthwatch.imaging.formats import OUTPUT_FORMATS
from depthwatch.logtext import amount

#: libjpeg's warnings that mean part of the picture was made up, not decoded (jerror.h). Others
#: ("extraneous bytes before marker", an unknown JFIF revision) leave the picture whole.
_JPEG_DAMAGED = ("premature end", "Premature end", "bad Huffman code", "instead of RST", "Invalid SOS")

#: EXIF orientation -> what turns the stored pixels into the picture as a viewer shows it.
_ORIENT = {
    2: lambda a: cv2.flip(a, 1),
    3: lambda a: cv2.rotate(a, cv2.ROTATE_180),
    4: lambda a: cv2.flip(a, 0),
    5: lambda a: cv2.transpose(a),
    6: lambda a: cv2.rotate(a, cv2.ROTATE_90_CLOCKWISE),
    7: lambda a: cv2.rotate(cv2.transpose(a), cv2.ROTATE_180),
    8: lambda a: cv2.rotate(a, cv2.ROTATE_90_COUNTERCLOCKWISE),
}

# OpenCV's own log lines ("[ERROR:0@0.03] global grfmt_tiff.cpp:117 TIFF_Error ...") repeat, raw,
# what a failed decode's None already says; depthwatch logs the reason itself, naming the file.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_FATAL)


@dataclass(frozen=True)
class Decoded:
    """A decoded frame: BGR pixels (maybe at reduced scale) and the frame's true size."""

    image: np.ndarray
    #: (width, height) of the frame as an editor displays it (EXIF orientation applied).
    size: tuple[int, int]
    format: str
    #: EXR: how many NaN or infinite values were made finite before the model (see `view`).
    not_finite: int = 0
    #: EXR: its data and display windows when they are not plain (the map's EXR gets the same).
    windows: exr.Windows | None = None
    #: EXR: its timecode, rate and pixel aspect when it says them (the map's EXR says the same).
    exr_frame: exr.FrameMeta | None = None


@dataclass(frozen=True)
class ExrOptions:
    """How EXR frames are read and EXR maps written (`input.exr_colour`, `output.exr_*`)."""

    #: linear: scene-linear frames get the view transform (`view`); display: taken as they are.
    colour: str = "linear"
    half: bool = False
    compression: str = "zip"
    #: Z and R, G, B (a picture every viewer shows), Z and Y, or Z alone: `exr.CHANNEL_SETS`.
    channels: str = "z+rgb"


def reduction(size: tuple[int, int], min_size: tuple[int, int] | None) -> int:
    """The largest of 8, 4, 2 by which a frame of `size` can shrink and still give the model `min_size`.

    The one reduced-scale rule: a still JPEG's DCT-scaled decode and a clip's
    frames (`clips.stream`) both use it, so a clip's frame and the same frame
    as a still get the same map. A side is rounded up, as libjpeg(-turbo)
    rounds its scaled output (`jdiv_round_up`: 1790 px at 1/8 gives 224).
    """
    if not min_size:
        return 1
    need = max(min_size)
    short = min(size)
    for factor in (8, 4, 2):
        if math.ceil(short / factor) >= need:
            return factor
    return 1


def _reduction(header: formats.Header, min_size: tuple[int, int] | None) -> int:
    """The largest JPEG DCT scale-down that still leaves at least `min_size` pixels (1 for other formats)."""
    if header.format != formats.JPEG:
        return 1
    return reduction((header.width, header.height), min_size)


def decode(
    data: bytes,
    *,
    max_pixels: int,
    min_size: tuple[int, int] | None = None,
    checked_format: str | None = None,
    exr_colour: str = "linear",
) -> Decoded:
    """Decode image bytes already in memory; FrameError says why a file is unusable.

    The size is checked from the header first so a decompression bomb is refused
    before any memory is spent on it. `min_size` lets a JPEG decode at reduced
    scale when the model needs far fewer pixels than the frame has.
    `checked_format`: the watcher already sniffed these bytes as that format and
    saw its end marker, so neither is looked for again. `exr_colour`: whether
    EXR frames are scene-linear ("linear") or display-referred ("display").
    """
    if not data:
        raise FrameError("the file is empty (0 bytes)")
    fmt = checked_format or formats.sniff(data)
    if fmt is None:
        raise FrameError("not a JPEG, PNG, TIFF, WebP, EXR or DPX image")
    if fmt == formats.EXR:
        return _decode_exr(data, max_pixels, exr_colour)
    header = formats.read_header(data, fmt)
    if header is None:
        raise FrameError(f"the {fmt.upper()} header is damaged or cut short")
    if header.width == 0 or header.height == 0:
        raise FrameError(f"the {fmt.upper()} header declares an empty {header.width}x{header.height} image")
    if header.problem:
        raise FrameError(f"the {fmt.upper()} header {header.problem}; not decoded")
    _check_pixels(header.width, header.height, max_pixels)
    if checked_format is None and formats.is_complete(fmt, data[-16:], len(data), data[:16]) is False:
        raise FrameError(f"the {fmt.upper()} data is cut short (no end marker): the file is incomplete")
    if fmt == formats.DPX:
        if formats.is_complete_at(fmt, lambda o, n: data[o : o + n], len(data)) is False:
            raise FrameError("the DPX data is cut short (less image data than its header lays out): the file is incomplete")
        return Decoded(plates.decode(data, fmt), (header.width, header.height), fmt)
    if fmt == formats.TIFF and formats.tiff_bits(data) in (10, 12, 14):  # OpenCV reads 8, 16 and 32
        image = _upright_tiff(plates.decode(data, fmt), data)
        return Decoded(image, (image.shape[1], image.shape[0]), fmt)
    if fmt == formats.TIFF and formats.tiff_sample_format(data) == 3:
        raise FrameError("the TIFF holds floating-point samples, an unsupported sample type; save it as 8- or 16-bit")
    factor = _reduction(header, min_size)
    image = _decode_jpeg(data, header, factor) if fmt == formats.JPEG else _decode_other(data, fmt)
    size = (image.shape[1], image.shape[0]) if factor == 1 else header.display_size
    return Decoded(image, size, fmt)


def _decode_jpeg(data: bytes, header: formats.Header, factor: int) -> np.ndarray:
    """libjpeg-turbo through simplejpeg: a damaged file raises instead of printing to stderr.

    strict=True stops at libjpeg's first warning and raises it as the ValueError's
    text, so nothing is written to descriptor 2 and decodes run side by side. A
    warning that leaves the picture whole is decoded again without stopping (rare).
    The reduced scale is libjpeg's DCT scaling: the smallest M/8 that keeps
    (width/factor, height/factor), so exactly 1/2, 1/4 or 1/8.
    """
    least = {"min_width": -(-header.width // factor), "min_height": -(-header.height // factor)} if factor > 1 else {}
    try:
        image = simplejpeg.decode_jpeg(data, "BGR", strict=True, **least)
    except ValueError as exc:
        reason = str(exc).strip() or "unknown error"
        if any(sign in reason for sign in _JPEG_DAMAGED):
            raise FrameError(f"the JPEG data is damaged ({reason}); the picture is incomplete") from None
        try:
            image = simplejpeg.decode_jpeg(data, "BGR", strict=False, **least)
        except ValueError as again:
            raise FrameError(f"cannot decode the JPEG data: {str(again).strip() or reason}") from None
    if image.size == 0:
        raise FrameError("cannot decode the JPEG data: the file is corrupt")
    turn = _ORIENT.get(header.orientation)
    return turn(image) if turn else image


def _decode_other(data: bytes, fmt: str) -> np.ndarray:
    """PNG, TIFF and WebP through OpenCV: a damaged file decodes to None, which is the reason.

    libpng reports a fatal error by returning to OpenCV, which gives None, and
    OpenCV's own log (libtiff's errors go through it) is kept at FATAL above, so
    nothing needs catching from descriptor 2.
    """
    turn = None
    if fmt == formats.PNG:
        # Its eXIf orientation goes with the chunks stripped below: applied here, as viewers do.
        turn = _ORIENT.get(formats.png_orientation(data))
        data = _png_pixels_only(data)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:
        raise FrameError(f"cannot decode the {fmt.upper()} data: {_cv_reason(exc)}") from None
    if (image is None or image.size == 0) and fmt == formats.TIFF:
        # A layout OpenCV's libtiff reading does not take (16-bit CMYK, CMYK with alpha) is no
        # corrupt file: OpenImageIO, which reads the deeper plates, reads these too.
        return _upright_tiff(_tiff_by_openimageio(data), data)
    if image is None or image.size == 0:
        raise FrameError(f"cannot decode the {fmt.upper()} data: the file is corrupt")
    return turn(image) if turn is not None else image


def _tiff_by_openimageio(data: bytes) -> np.ndarray:
    try:
        plates.require()
    except FrameError:
        raise FrameError(
            "cannot decode the TIFF data: OpenCV does not read this TIFF's layout, and OpenImageIO, which may, "
            f"is not installed; run: {plates.INSTALL}"
        ) from None
    return plates.decode(data, formats.TIFF)


def _upright_tiff(image: np.ndarray, data: bytes) -> np.ndarray:
    """A TIFF OpenImageIO decoded, turned as its Orientation tag says (OpenCV's own reading does so)."""
    turn = _ORIENT.get(formats.tiff_orientation(data))
    return turn(image) if turn is not None else image


#: The PNG chunks that make the picture; the rest (text, colour profiles, times) is not read.
_PNG_PIXEL_CHUNKS = (b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND")


def _png_pixels_only(data: bytes) -> bytes:
    """The PNG without its ancillary chunks, which OpenCV does not use.

    libpng prints its warnings about them ("libpng warning: tEXt: CRC error",
    "iCCP: known incorrect sRGB profile") from C straight to descriptor 2, into
    the daemon's log; without the chunks there is nothing to warn about. A file
    whose chunks do not add up is passed on as it is, for libpng to refuse.
    """
    kept, at, end = [data[:8]], 8, len(data)
    while at + 12 <= end:
        length = int.from_bytes(data[at : at + 4], "big")
        kind = data[at + 4 : at + 8]
        stop = at + 12 + length
        if stop > end:
            return data
        if kind in _PNG_PIXEL_CHUNKS or not kind[:1].islower():  # critical chunks are capitalised
            kept.append(data[at:stop])
        at = stop
        if kind == b"IEND":
            break
    return b"".join(kept)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise FrameError(over_pixels(width, height, max_pixels))


def over_pixels(width: int, height: int, max_pixels: int) -> str:
    """The one line for a frame or a clip over `daemon.max_megapixels` (stills, clips and the farm alike)."""
    return (
        f"{width}x{height} is {amount(width * height / 1e6)} megapixels, over the "
        f"limit of {amount(max_pixels / 1e6)}; raise daemon.max_megapixels to accept it"
    )


def _decode_exr(data: bytes, max_pixels: int, colour: str) -> Decoded:
    """An EXR frame: its structure checked (size, channels, every chunk there) before decoding."""
    found = exr.layout(data)
    _check_pixels(found.width, found.height, max_pixels)
    picture = exr.decode(data, found, colour, max_pixels)
    return Decoded(picture.image, (found.width, found.height), formats.EXR, picture.not_finite, picture.windows, picture.frame)


def _cv_reason(exc: cv2.error) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


#: A JPEG's width and height are 16-bit numbers in its frame header (SOF): no JPEG is larger.
JPEG_MAX_SIDE = 65_535


def check_map_size(size: tuple[int, int], ext: str, instead: str) -> None:
    """FrameError if a map of (width, height) `size` cannot be written as `ext`; `instead`: what to do.

    Why before the work: the frame's size is known once it is decoded, so a map
    no JPEG can hold is refused in one line before the model runs, not met as an
    overflow in the encoder after it.
    """
    if OUTPUT_FORMATS.get(ext.lower()) != ".jpg":
        return
    w, h = size
    for side, name in ((h, "taller"), (w, "wider")):
        if side > JPEG_MAX_SIDE:
            raise FrameError(f"its map would be {w} x {h} px, {name} than a JPEG can be ({JPEG_MAX_SIDE:,}): {instead}")


def encode(
    depth: np.ndarray,
    ext: str,
    *,
    jpeg_quality: int = 95,
    png_compression: int = 1,
    exr_options: ExrOptions = ExrOptions(),
    exr_windows: exr.Windows | None = None,
    exr_frame: exr.FrameMeta | None = None,
    beside: Beside | None = None,
) -> bytes:
    """Encode a depth map for an output whose name ends in `ext`, at the depth the format holds.

    uint8, uint16 or float32 maps (float in [0, 1]); JPEG takes 8 bits, PNG up to
    16, TIFF keeps float32 as it is (no quantisation), EXR too (channel Z, float32
    or half: `exr.encode`), with an EXR frame's data and display windows if given,
    and a clip's frame's timecode, rate and pixel aspect (`exr_frame`). A grey
    JPEG restarts at every block row and may be encoded in two strips, one on
    another thread (`beside`; see `jpegstrips`): the same bytes either way.
    """
    kind = OUTPUT_FORMATS.get(ext.lower())
    if kind is None:
        raise FrameError(f"cannot write depth maps as {ext!r}; use .jpg, .png, .tif or .exr")
    if kind == ".exr":
        return exr.encode(
            _as_float(depth),
            half=exr_options.half,
            compression=exr_options.compression,
            windows=exr_windows,
            channels=exr_options.channels,
            frame=exr_frame,
        )
    if exr_windows is not None and not exr_windows.plain:
        depth = on_display_window(depth, exr_windows)
    if kind == ".jpg":
        check_map_size((depth.shape[1], depth.shape[0]), kind, "write it as a PNG or TIFF")
        depth = _as_integer(depth, 8)
        if depth.ndim == 2:
            try:
                return jpegstrips.encode(depth, jpeg_quality, beside)
            except ValueError:
                raise FrameError("could not encode the depth map as .jpg") from None
        params = [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)]
    elif kind == ".png":
        depth = _as_integer(depth, 16)
        params = [cv2.IMWRITE_PNG_COMPRESSION, int(png_compression)]
    else:
        params = []
    ok, buf = cv2.imencode(kind, depth, params)
    if not ok:
        raise FrameError(f"could not encode the depth map as {kind}")
    return buf.tobytes()


def on_display_window(depth: np.ndarray, windows: exr.Windows) -> np.ndarray:
    """A map of an EXR's data window, placed on its display window: what a PNG, TIFF or JPEG map must be.

    Those formats have no windows, so the map is the picture the plate shows:
    the display window's size, the data window at its offset, 0 outside it,
    and overscan (data outside the display window) cut off. Then it sits on
    the plate as the EXR map (which keeps the windows) does.
    """
    x0, y0, x1, y1 = windows.data
    d0, e0, d1, e1 = windows.display
    canvas = np.zeros((e1 - e0 + 1, d1 - d0 + 1), depth.dtype)
    left, top, right, bottom = max(x0, d0), max(y0, e0), min(x1, d1), min(y1, e1)
    if left <= right and top <= bottom:
        canvas[top - e0 : bottom - e0 + 1, left - d0 : right - d0 + 1] = depth[top - y0 : bottom - y0 + 1, left - x0 : right - x0 + 1]
    return canvas


def _as_integer(depth: np.ndarray, most_bits: int) -> np.ndarray:
    if depth.dtype == np.uint8 or (depth.dtype == np.uint16 and most_bits == 16):
        return depth
    if depth.dtype == np.uint16:
        return (depth >> 8).astype(np.uint8)
    top, dtype = (255, np.uint8) if most_bits == 8 else (65535, np.uint16)
    return (np.clip(depth, 0.0, 1.0) * np.float32(top) + np.float32(0.5)).astype(dtype)


def _as_float(depth: np.ndarray) -> np.ndarray:
    if depth.dtype == np.float32:
        return depth
    return depth.astype(np.float32) * np.float32(1 / np.iinfo(depth.dtype).max)


def bits_for(ext: str, png_bits: int) -> int:
    """Bit depth an output file gets: 8 for JPEG, at most 16 for PNG, the configured
    depth for TIFF (32 = float), 32 (float; written as half with output.exr_half) for EXR."""
    kind = OUTPUT_FORMATS.get(ext.lower())
    if kind == ".jpg":
        return 8
    if kind == ".exr":
        return 32
    if kind == ".png":
        return min(png_bits, 16)
    return png_bits
