"""An OpenEXR file's structure, read from its bytes without decoding a pixel.

Three jobs need it before the OpenEXR library sees a byte: refusing a frame
whose data window is over the megapixel limit (or that holds thousands of
channels) before any memory is spent on it; telling a completely written EXR
from one still being written (an EXR has no end marker: its writer fills the
offset table when it closes the file, so a finished file has every chunk
there, each where the table says); and finding the string attribute that
carries depthwatch's provenance record (`frames/provenance.py`).

Only single-part scanline and tiled files are laid out here (what renderers,
Nuke and Resolve write for frames); deep and multi-part files are named as
such, so the reason given is the right one. The layout follows the OpenEXR
file layout document (openexr.com, "OpenEXR File Layout").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = b"\x76\x2f\x31\x01"

#: A header larger than this is not a frame's (thousands of channels of long names fit in it).
MAX_HEADER = 1 << 20
#: Offset tables larger than this (8 bytes a chunk, 8 MB) are refused before they are read: a
#: 16K frame tiled 16x16 has a million tiles; scan lines of an 8K frame are 4,320 chunks at most.
MAX_CHUNKS = 1 << 20

_TILED, _LONG_NAMES, _DEEP, _MULTIPART = 0x200, 0x400, 0x800, 0x1000

#: Scan lines per chunk, by compression (the enum's value in the file).
LINES_PER_CHUNK = {0: 1, 1: 1, 2: 1, 3: 16, 4: 32, 5: 16, 6: 32, 7: 32, 8: 32, 9: 256, 10: 256, 11: 32}
COMPRESSION_NAMES = {
    0: "none", 1: "rle", 2: "zips", 3: "zip", 4: "piz", 5: "pxr24", 6: "b44", 7: "b44a",
    8: "dwaa", 9: "dwab", 10: "htj2k256", 11: "htj2k32", 12: "lj2k", 13: "zstd",
}
PIXEL_TYPES = {0: "uint", 1: "half", 2: "float"}

Read = Callable[[int, int], bytes]


class ExrProblem(ValueError):
    """The bytes are not an EXR frame depthwatch can read; the message says why (one sentence)."""


class Incomplete(Exception):
    """The bytes end before the structure does: a file still being written (or cut short)."""


@dataclass(frozen=True)
class Channel:
    name: str
    pixel_type: int
    x_sampling: int
    y_sampling: int


@dataclass(frozen=True)
class Attribute:
    """Where one header attribute's value lies in the file."""

    type: str
    offset: int
    size: int


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    channels: tuple[Channel, ...]
    compression: int
    #: (tile width, tile height) for a tiled file, else None.
    tile: tuple[int, int] | None
    #: Offset of the offset table: the header ends (its terminating null) one byte before.
    table: int
    chunks: int
    attributes: dict[str, Attribute]
    #: The data window's first row, and scan lines per chunk (None: unknown compression).
    y_min: int = 0
    lines: int | None = None
    #: (x_min, y_min, x_max, y_max) of the pixels stored, and of the frame as a viewer frames it
    #: (a render cropped to its bounding box stores less than it displays).
    data_window: tuple[int, int, int, int] = (0, 0, 0, 0)
    display_window: tuple[int, int, int, int] | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def table_end(self) -> int:
        return self.table + 8 * self.chunks

    @property
    def leader(self) -> int:
        """Bytes before each chunk's data: (y, size) for scan lines, (tx, ty, lx, ly, size) for tiles."""
        return 20 if self.tile else 8


class _Cursor:
    """Sequential reads through `read`, in blocks, with the header's size bound."""

    def __init__(self, read: Read, size: int, pos: int = 0) -> None:
        self._read, self.size, self.pos = read, size, pos
        self._buf, self._start = b"", 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > self.size:
            raise Incomplete
        if end > MAX_HEADER:
            raise ExrProblem(f"its header is over {MAX_HEADER >> 20} MB; not an image frame")
        if not (self._start <= self.pos and end <= self._start + len(self._buf)):
            self._start = self.pos
            self._buf = self._read(self.pos, max(n, 65536))
            if len(self._buf) < n:
                raise Incomplete
        out = self._buf[self.pos - self._start : end - self._start]
        self.pos = end
        return out

    def text(self, most: int) -> str:
        chars = bytearray()
        while True:
            c = self.take(1)
            if c == b"\x00":
                return chars.decode("latin-1")
            chars += c
            if len(chars) > most:
                raise ExrProblem("its header has a name longer than the format allows; the file is damaged")


def read_layout(read: Read, size: int) -> Layout:
    """The layout of the EXR whose bytes `read(offset, n)` returns; `size`: the file's length.

    ExrProblem says why it is not a frame depthwatch reads; Incomplete means
    the header or its offset table is not all there yet.
    """
    cur = _Cursor(read, size)
    if cur.take(4) != MAGIC:
        raise ExrProblem("not an OpenEXR file")
    (version,) = struct.unpack("<I", cur.take(4))
    if version & 0xFF != 2:
        raise ExrProblem(f"OpenEXR version {version & 0xFF} is not one this depthwatch reads (2)")
    if version & _MULTIPART:
        raise ExrProblem("a multi-part EXR; depthwatch reads single-part frames (write the beauty pass on its own)")
    if version & _DEEP:
        raise ExrProblem("a deep EXR (samples per pixel, not an image); depthwatch reads flat frames")
    longest = 255 if version & _LONG_NAMES else 31
    attributes: dict[str, Attribute] = {}
    values: dict[str, bytes] = {}
    for _ in range(100_000):
        name = cur.text(longest)
        if not name:
            break
        kind = cur.text(longest)
        (length,) = struct.unpack("<i", cur.take(4))
        if length < 0:
            raise ExrProblem(f"its header attribute {name!r} has a negative size; the file is damaged")
        attributes[name] = Attribute(kind, cur.pos, length)
        if name in ("channels", "compression", "dataWindow", "displayWindow", "tiles", "chunkCount"):
            values[name] = cur.take(length)
        else:
            cur.pos += length
            if cur.pos > size:
                raise Incomplete
            if cur.pos > MAX_HEADER:
                raise ExrProblem(f"its header is over {MAX_HEADER >> 20} MB; not an image frame")
    else:
        raise ExrProblem("its header has no end; the file is damaged")
    table = cur.pos
    for required in ("channels", "compression", "dataWindow"):
        if required not in values:
            raise ExrProblem(f"its header has no {required}; the file is damaged")
    try:
        x0, y0, x1, y1 = struct.unpack("<iiii", values["dataWindow"][:16])
        framed = values.get("displayWindow", b"")
        display = struct.unpack("<iiii", framed[:16]) if len(framed) >= 16 else None
        compression = values["compression"][0]
        channels = _channels(values["channels"])
    except (struct.error, IndexError, ValueError):
        raise ExrProblem("its header is damaged (a short attribute)") from None
    width, height = x1 - x0 + 1, y1 - y0 + 1
    if width <= 0 or height <= 0:
        raise ExrProblem(f"its data window is empty ({width}x{height})")
    tile = None
    if version & _TILED:
        if "tiles" not in values or len(values["tiles"]) < 9:
            raise ExrProblem("a tiled EXR without a tile description; the file is damaged")
        tw, th, mode = struct.unpack("<IIB", values["tiles"][:9])
        if mode & 0x0F != 0:
            raise ExrProblem("a mip- or rip-mapped EXR (a texture); depthwatch reads frames of one level")
        if tw == 0 or th == 0:
            raise ExrProblem("its tiles are empty (0 pixels wide or high); the file is damaged")
        tile = (tw, th)
        chunks = math.ceil(width / tw) * math.ceil(height / th)
    elif "chunkCount" in values and len(values["chunkCount"]) >= 4:
        chunks = struct.unpack("<i", values["chunkCount"][:4])[0]
    elif compression in LINES_PER_CHUNK:
        chunks = math.ceil(height / LINES_PER_CHUNK[compression])
    else:
        raise ExrProblem(f"its compression ({compression}) is not one depthwatch knows")
    if not 0 < chunks <= MAX_CHUNKS:
        raise ExrProblem(f"it declares {chunks} chunks of pixels, more than a frame has")
    lines = None if tile else LINES_PER_CHUNK.get(compression)
    return Layout(width, height, channels, compression, tile, table, chunks, attributes, y0, lines, (x0, y0, x1, y1), display)


def _channels(data: bytes) -> tuple[Channel, ...]:
    out = []
    pos = 0
    while pos < len(data) and data[pos] != 0:
        end = data.index(b"\x00", pos)
        name = data[pos:end].decode("latin-1")
        pixel_type, _, x_sampling, y_sampling = struct.unpack("<iB3xii", data[end + 1 : end + 17])
        out.append(Channel(name, pixel_type, x_sampling, y_sampling))
        pos = end + 17
    return tuple(out)


def offsets(layout: Layout, read: Read, size: int) -> tuple[int, ...]:
    """The offset table: where each chunk starts (0: not written). Incomplete if cut short."""
    if layout.table_end > size:
        raise Incomplete
    data = read(layout.table, 8 * layout.chunks)
    if len(data) < 8 * layout.chunks:
        raise Incomplete
    return struct.unpack(f"<{layout.chunks}Q", data)


def missing_chunk(layout: Layout, read: Read, size: int, *, every: bool = True) -> str | None:
    """Why not every chunk of pixels is in the file (None: all there, each inside the file).

    `every`: look at each chunk's own leader (in memory, before decoding);
    else only the table and the last chunk in the file (the watcher's quick
    look: a writer fills the table last, so a finished file passes).
    """
    try:
        table = offsets(layout, read, size)
    except Incomplete:
        return "it is cut short inside its offset table"
    what = "tile" if layout.tile else "chunk"
    for index, offset in enumerate(table):
        if offset == 0:
            return f"{what} {index + 1} of {layout.chunks} was never written (its offset is 0)"
        if not layout.table_end <= offset <= size - layout.leader:
            return f"{what} {index + 1} of {layout.chunks} lies outside the file (cut short?)"
    checked = range(len(table)) if every else (max(range(len(table)), key=table.__getitem__),)
    seen: set[tuple[int, ...]] = set()
    for index in checked:
        leader = struct.unpack("<iiiii" if layout.tile else "<ii", read(table[index], layout.leader))
        length = leader[-1]
        if length < 0 or table[index] + layout.leader + length > size:
            return f"{what} {index + 1} of {layout.chunks} is cut short: the file is incomplete"
        if not every:
            continue
        place = _place(layout, leader[:-1])
        if place is None or place in seen:
            return f"{what} {index + 1} of {layout.chunks} names a place outside the image (or twice); the file is damaged"
        seen.add(place)
        if length > 2 * _raw_bytes(layout) + 1024:
            return f"{what} {index + 1} of {layout.chunks} is larger than its pixels can be; the file is damaged"
    return None


def _place(layout: Layout, where: tuple[int, ...]) -> tuple[int, ...] | None:
    """Which tile or scan-line block a chunk's leader names, if it is one of the image's."""
    if layout.tile:
        tx, ty, lx, ly = where
        across, down = math.ceil(layout.width / layout.tile[0]), math.ceil(layout.height / layout.tile[1])
        return (tx, ty) if (lx, ly) == (0, 0) and 0 <= tx < across and 0 <= ty < down else None
    row = where[0] - layout.y_min
    if not 0 <= row < layout.height or (layout.lines and row % layout.lines):
        return None
    return (row,)


def _raw_bytes(layout: Layout) -> int:
    """Bytes of one chunk's pixels uncompressed (a compressor that does not help stores them raw)."""
    per_pixel = sum(2 if c.pixel_type == 1 else 4 for c in layout.channels)
    if layout.tile:
        return layout.tile[0] * layout.tile[1] * per_pixel
    return (layout.lines or layout.height) * layout.width * per_pixel


def is_complete(read: Read, size: int) -> bool:
    """Whether an EXR being written is finished: header, offset table and every chunk in place.

    A file whose header says it is not a frame depthwatch reads counts as
    complete, so the pipeline reports why at once instead of waiting.
    """
    try:
        layout = read_layout(read, size)
    except Incomplete:
        return False
    except ExrProblem:
        return True
    return missing_chunk(layout, read, size, every=False) is None


def string_attribute(data: bytes, layout: Layout, name: str) -> bytes | None:
    """The value of a header attribute of type string (its bytes), or None."""
    found = layout.attributes.get(name)
    if found is None or found.type != "string":
        return None
    return data[found.offset : found.offset + found.size]


def with_string_attribute(data: bytes, name: str, value: bytes) -> bytes:
    """`data` (an EXR) with a string attribute `name` added to its header (replacing one of that name).

    Inserting bytes in the header moves every chunk, so each offset in the
    table moves by the same amount; nothing else in the file refers to a position.
    """
    layout = read_layout(lambda o, n: data[o : o + n], len(data))
    table = offsets(layout, lambda o, n: data[o : o + n], len(data))
    head = bytearray(data[: layout.table - 1])  # without the header's terminating null
    old = layout.attributes.get(name)
    if old is not None:
        start = old.offset - (len(name) + 1 + len(old.type) + 1 + 4)
        del head[start : old.offset + old.size]
    head += name.encode("latin-1") + b"\x00string\x00" + struct.pack("<i", len(value)) + value + b"\x00"
    shift = len(head) - layout.table
    moved = struct.pack(f"<{len(table)}Q", *(offset + shift for offset in table))
    return bytes(head) + moved + data[layout.table_end :]
