"""What an image file's own bytes say about it, read without decoding it.

Two jobs need this before any pixel is decoded: refusing a decompression bomb
(a small file that declares a huge image) and telling a completely written
file from one still being written (JPEG ends with EOI, PNG with IEND, WebP
declares its length, an EXR has every chunk its offset table lists: see
`exrlayout`; a DPX holds all the data its header lays out). On macOS there is no "file closed" event, so the end
marker is how a dropped frame is accepted at once.

Which extensions a depth map can be written as (`OUTPUT_FORMATS`) lives here
too, with the rule the config and each frame's job apply to a template that
takes the frame's own extension (`map_format_problem`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from depthwatch.imaging import exrlayout

JPEG, PNG, TIFF, WEBP, EXR, DPX = "jpeg", "png", "tiff", "webp", "exr", "dpx"

#: File extensions and the format each one promises.
EXTENSIONS = {
    ".jpg": JPEG,
    ".jpeg": JPEG,
    ".png": PNG,
    ".tif": TIFF,
    ".tiff": TIFF,
    ".webp": WEBP,
    ".exr": EXR,
    ".dpx": DPX,
}

#: Depth map formats by output file extension (the value is OpenCV's encoder name; EXR is written
#: by the OpenEXR package): JPEG is 8-bit only, PNG up to 16, TIFF 8, 16 or 32-bit float, EXR
#: float32 or half in channel Z.
OUTPUT_FORMATS = {".jpg": ".jpg", ".jpeg": ".jpg", ".png": ".png", ".tif": ".tiff", ".tiff": ".tiff", ".exr": ".exr"}

def map_format_problem(template: str, frame_ext: str, png_bits: int, frame: str = "the frame") -> str | None:
    """Why the map `template` names for a frame ending in `frame_ext` cannot be written as configured.

    None when it can. Matters for templates that take the frame's own extension
    (`{ext}`, `{name}`): a WebP frame would get a .webp map, which no encoder
    here writes, and a PNG frame a PNG map, which cannot hold png_bits 32.
    `frame` names the frame in the message ("a *.webp frame", "the frame").
    """
    if "{ext}" not in template and "{name}" not in template:
        return None  # a fixed extension, checked as the template is read
    ext = frame_ext.lower()
    suffix = Path(template.format(stem="frame", name=f"frame{ext}", ext=ext.lstrip("."))).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        return (
            f"output.template {template!r} names the map after {frame}'s extension, and depth maps cannot be "
            f"written as {suffix or 'a file without one'}; give the template its own: .jpg, .png, .tif or .exr "
            "(e.g. '{stem}_depth.png')"
        )
    if png_bits == 32 and OUTPUT_FORMATS[suffix] == ".png":
        return (
            f"output.png_bits 32 (float) needs .tif or .exr maps, and output.template {template!r} makes {frame}'s "
            "map a PNG, which holds at most 16 bits; use a .tif or .exr template, or png_bits 16"
        )
    return None


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
# JPEG start-of-frame markers carry the image size; C4, C8 and CC are not SOFs.
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


@dataclass(frozen=True)
class Header:
    """Format and size as stored; `orientation` is the EXIF tag (1 = as stored)."""

    format: str
    width: int
    height: int
    orientation: int = 1
    #: Why the header cannot be trusted although it parses (a TIFF listing its size twice), or "".
    problem: str = ""

    @property
    def display_size(self) -> tuple[int, int]:
        """(width, height) as a viewer shows the image, EXIF rotation applied."""
        if self.orientation in (5, 6, 7, 8):
            return self.height, self.width
        return self.width, self.height

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff(data: bytes) -> str | None:
    """The format named by the file's magic bytes, or None if not an image we read."""
    if data[:3] == b"\xff\xd8\xff":
        return JPEG
    if data[:8] == _PNG_SIGNATURE:
        return PNG
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return TIFF
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    if data[:4] == exrlayout.MAGIC:
        return EXR
    if data[:4] in _DPX_MAGIC:
        return DPX
    return None


def is_complete(fmt: str, tail: bytes, size: int, head: bytes = b"") -> bool | None:
    """Whether a file of `size` bytes ending in `tail` is completely written.

    None means the format has no end marker (TIFF), or that its ends do not
    tell (EXR: ask `is_complete_at`): the caller must rely on the file having settled.
    """
    if fmt == JPEG:
        return tail.rstrip(b"\x00")[-2:] == b"\xff\xd9"
    if fmt == PNG:
        return tail[-12:] == _PNG_IEND
    if fmt == WEBP:
        return len(head) >= 8 and struct.unpack("<I", head[4:8])[0] + 8 <= size
    return None


def is_complete_at(fmt: str, read: Callable[[int, int], bytes], size: int) -> bool | None:
    """Whether a file of `size` bytes is completely written, reading what it needs with `read(offset, n)`.

    For formats whose ends tell, only the ends are read; an EXR's header and
    offset table are read too (bounded: `exrlayout.MAX_HEADER`, 8 bytes a chunk).
    """
    if fmt == EXR:
        return exrlayout.is_complete(read, size)
    if fmt == DPX:
        layout = dpx_layout(read(0, _DPX_HEADER))
        return None if layout is None or layout.problem else size >= layout.end
    return is_complete(fmt, read(max(0, size - 16), 16), size, read(0, 16))


def read_header(data: bytes, fmt: str | None = None) -> Header | None:
    """Parse the size (and JPEG EXIF orientation) from the header; None if unreadable.

    `fmt`: the format already sniffed from these bytes, if known.
    """
    fmt = fmt or sniff(data)
    try:
        if fmt == JPEG:
            return _jpeg_header(data)
        if fmt == PNG and len(data) >= 24 and data[12:16] == b"IHDR":
            w, h = struct.unpack(">II", data[16:24])
            return Header(PNG, w, h)
        if fmt == TIFF:
            return _tiff_header(data)
        if fmt == WEBP:
            return _webp_header(data)
        if fmt == EXR:
            layout = exrlayout.read_layout(lambda o, n: data[o : o + n], len(data))
            return Header(EXR, layout.width, layout.height)
        if fmt == DPX:
            dpx = dpx_layout(data[:_DPX_HEADER])
            return None if dpx is None else Header(DPX, dpx.width, dpx.height, problem=dpx.problem)
    except exrlayout.Incomplete:
        return None
    except (struct.error, IndexError, ValueError):
        return None
    return None


def _jpeg_header(data: bytes) -> Header | None:
    pos, orientation = 2, 1
    n = len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        segment = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1 and segment[:6] == b"Exif\x00\x00":
            orientation = _exif_orientation(segment[6:]) or 1
        elif marker in _JPEG_SOF:
            h, w = struct.unpack(">HH", segment[1:5])
            return Header(JPEG, w, h, orientation)
        elif marker == 0xDA:  # start of scan before any SOF: broken
            return None
        pos += 2 + length
    return None


def _tiff_ifd0(tiff: bytes) -> tuple[str, dict[int, int]]:
    """The short/long tags of a TIFF structure's first IFD (for EXIF and TIFF files); a repeated tag's last value."""
    endian, listed = _tiff_ifd0_all(tiff)
    return endian, {tag: values[-1] for tag, values in listed.items()}


def _tiff_ifd0_all(tiff: bytes) -> tuple[str, dict[int, list[int]]]:
    """Every value each short/long tag of the first IFD is listed with, in file order."""
    endian = "<" if tiff[:2] == b"II" else ">"
    (offset,) = struct.unpack(endian + "I", tiff[4:8])
    (count,) = struct.unpack(endian + "H", tiff[offset : offset + 2])
    tags: dict[int, list[int]] = {}
    for i in range(min(count, 512)):
        entry = tiff[offset + 2 + 12 * i : offset + 14 + 12 * i]
        tag, kind = struct.unpack(endian + "HH", entry[:4])
        if kind == 3:  # SHORT
            tags.setdefault(tag, []).append(struct.unpack(endian + "H", entry[8:10])[0])
        elif kind == 4:  # LONG
            tags.setdefault(tag, []).append(struct.unpack(endian + "I", entry[8:12])[0])
    return endian, tags


def tiff_orientation(data: bytes) -> int:
    """A TIFF's Orientation tag (1 = as stored), for a decoder that does not apply it (OpenImageIO)."""
    found = _exif_orientation(data)
    return found if isinstance(found, int) and 1 <= found <= 8 else 1


def png_orientation(data: bytes) -> int:
    """The orientation in a PNG's eXIf chunk (1 = as stored, or none): browsers and OpenCV honour it."""
    at, end = 8, len(data)
    while at + 12 <= end:
        length = int.from_bytes(data[at : at + 4], "big")
        kind = data[at + 4 : at + 8]
        if kind == b"eXIf":
            return tiff_orientation(data[at + 8 : at + 8 + length])
        if kind in (b"IDAT", b"IEND"):  # eXIf comes before the pixels
            return 1
        at += 12 + length
    return 1


def _exif_orientation(tiff: bytes) -> int | None:
    try:
        return _tiff_ifd0(tiff)[1].get(0x0112)
    except (struct.error, IndexError):
        return None


def _tiff_header(data: bytes) -> Header | None:
    """The TIFF's size, as large as any of its size tags says.

    A TIFF may list ImageWidth (256) or ImageLength (257) more than once;
    libtiff (OpenCV's decoder) takes the first and warns, a reader taking the
    last would see another size. So the largest listed is the size, for the
    megapixel limit, and such a file is refused anyway (`problem`).
    """
    _, listed = _tiff_ifd0_all(data)
    widths, heights = listed.get(256), listed.get(257)
    if not widths or not heights:
        return None
    problem = ""
    if len(widths) > 1 or len(heights) > 1:
        sizes = ", ".join(f"{w}x{h}" for w, h in zip(widths, heights))
        problem = f"lists its size more than once ({sizes}); decoders disagree on which one holds"
    return Header(TIFF, max(widths), max(heights), problem=problem)


def _tiff_first_short(data: bytes, wanted: int, default: int) -> int:
    """The first value of a SHORT-per-sample tag of the first image (inline if it fits in 4 bytes), or `default`."""
    try:
        endian = "<" if data[:2] == b"II" else ">"
        (offset,) = struct.unpack(endian + "I", data[4:8])
        (count,) = struct.unpack(endian + "H", data[offset : offset + 2])
        for i in range(min(count, 512)):
            tag, kind, n, value = struct.unpack(endian + "HHII", data[offset + 2 + 12 * i : offset + 14 + 12 * i])
            if tag == wanted and kind == 3:
                at = offset + 2 + 12 * i + 8 if n <= 2 else value
                return struct.unpack(endian + "H", data[at : at + 2])[0]
    except (struct.error, IndexError):
        pass
    return default


def tiff_sample_format(data: bytes) -> int:
    """TIFF SampleFormat (tag 339) of the first image: 1 unsigned, 2 signed, 3 floating point."""
    return _tiff_first_short(data, 339, 1)


def tiff_bits(data: bytes) -> int:
    """TIFF BitsPerSample (tag 258) of the first image's first sample (8 when absent, as the standard says)."""
    return _tiff_first_short(data, 258, 8)


# -- DPX (SMPTE 268M): the generic file header, then the first image element's -------------

_DPX_MAGIC = (b"SDPX", b"XPDS")  # big- and little-endian
_DPX_HEADER = 832
#: Image element descriptors read, with their components: luma, RGB, RGBA.
_DPX_COMPONENTS = {6: 1, 50: 3, 51: 4}
_DPX_PACKING = {0: "packed", 1: "filled (method A)", 2: "filled (method B)"}
_DPX_READ = "depthwatch reads 8-, 10- and 12-bit DPX filled by method A (what ffmpeg, ImageMagick, Nuke and Resolve write) and 16-bit"


@dataclass(frozen=True)
class DpxLayout:
    """Where a DPX's first image lies and how it is packed; `problem` says why it is not read ("" if it is)."""

    width: int
    height: int
    bits: int
    packing: int
    components: int
    offset: int
    #: Bytes of image data from `offset`: the file must hold at least `end` bytes.
    data_bytes: int
    problem: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.data_bytes


def dpx_layout(head: bytes) -> DpxLayout | None:
    """The DPX's first image element, from the file's first 832 bytes; None if they are not a DPX header."""
    if len(head) < _DPX_HEADER or head[:4] not in _DPX_MAGIC:
        return None
    e = ">" if head[:4] == b"SDPX" else "<"
    (offset,) = struct.unpack(e + "I", head[4:8])
    orientation, _, width, height = struct.unpack(e + "HHII", head[768:780])
    (sign,) = struct.unpack(e + "I", head[780:784])
    descriptor, bits = head[800], head[803]
    packing, encoding, element_offset, eol = struct.unpack(e + "HHII", head[804:816])
    offset = element_offset if element_offset not in (0, 0xFFFFFFFF) else offset
    components = _DPX_COMPONENTS.get(descriptor, 0)
    problem = ""
    if not components:
        problem = f"says its image is of descriptor {descriptor} (not luma, RGB or RGBA: 4:2:2 video or a component order); {_DPX_READ}, RGB(A) or luma"
    elif encoding not in (0, 0xFFFF):
        problem = f"says its image is run-length encoded; {_DPX_READ}, uncompressed"
    elif sign not in (0, 0xFFFFFFFF):
        problem = f"says its samples are signed; {_DPX_READ}, unsigned"
    elif orientation not in (0, 0xFFFF):
        problem = f"says its image is stored in orientation {orientation} (mirrored or turned); {_DPX_READ}, stored left to right, top to bottom"
    elif eol not in (0, 0xFFFFFFFF):
        problem = f"says its lines are padded ({eol} bytes); {_DPX_READ}, unpadded"
    elif not (bits in (8, 16) and packing in (0, 1) or bits in (10, 12) and packing == 1):
        problem = f"says {bits}-bit samples, {_DPX_PACKING.get(packing, f'packing {packing}')}; {_DPX_READ}"
    samples = width * components
    if bits == 10:
        row = -(-samples // 3) * 4  # three 10-bit samples to a 32-bit word, 2 bits of padding
    else:
        row = -(-samples * (1 if bits == 8 else 2) // 4) * 4  # 12-bit samples each in 16 bits
    return DpxLayout(width, height, bits, packing, components, offset, row * height, problem)


def _webp_header(data: bytes) -> Header | None:
    chunk = data[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return Header(WEBP, w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L":
        bits = struct.unpack("<I", data[21:25])[0]
        return Header(WEBP, (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return Header(WEBP, w, h)
    return None
