"""Whether a clip being copied in is whole yet, from its own structure: no decoding, no PyAV.

QuickTime and MP4: the top-level boxes add up to the file's size with a `moov`
(the index FFmpeg needs) among them. Matroska: a Segment of declared size ends
at the file's end. And a copy that preallocates, whole in structure long before
its data is there, still ends in zeros (or, for QuickTime and MP4, has a video
sample its index lists still zeros: `mp4index`). The watcher's settle check
and `video.Clip` ask here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

from depthwatch.media import mp4index

#: QuickTime / ISO BMFF top-level boxes that may hold or pad a clip; anything else at the
#: top level means the bytes are not (yet) a whole file of that family.
_TOP_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"uuid", b"pnot", b"udta", b"meta", b"pdin", b"styp", b"sidx", b"moof", b"mfra", b"prfl"}
#: Boxes that only pad: a copy that preallocates leaves them as they are, so they say nothing of it.
_PADDING = {b"free", b"skip", b"wide"}
#: The top-level box walk reads at most this many boxes. A real clip has a handful, a fragmented
#: recording a pair per fragment; millions of tiny crafted ones must not hold the settle thread.
MOST_TOP_BOXES = 20_000
#: The last bytes of a clip's data looked at: all zeros there is, most likely, a copy that set
#: the full size first (preallocated) and is still filling it in.
_TAIL = 64
_EBML = b"\x1a\x45\xdf\xa3"
_SEGMENT = b"\x18\x53\x80\x67"


def is_complete(path: Path, size: int) -> bool | None:
    """`is_complete_at` for a file opened here (not by the watcher: see there)."""
    try:
        with open(path, "rb") as f:

            def read(offset: int, n: int) -> bytes:
                f.seek(offset)
                return f.read(n)

            return is_complete_at(read, size)
    except OSError:
        return None


def is_complete_at(read: Callable[[int, int], bytes], size: int) -> bool | None:
    """Whether the clip file of `size` bytes is completely written, from its own structure.

    `read(offset, n)` reads the file (the watcher's pread on a descriptor it opened
    without blocking). QuickTime and MP4: the top-level boxes must add up to
    exactly the file's size, with a `moov` (the index FFmpeg needs) among them: a
    copy in progress ends in the middle of a box, and a recording not yet
    finished has no index. Matroska: a Segment of declared size must end at the
    file's end. None: the format has no such structure (MXF, AVI...), or more
    boxes than a real clip has (see MOST_TOP_BOXES), and settling is all the
    watcher can go by; or the file is (nearly) empty, and the job says what is
    wrong with it.
    """
    return state_at(read, size)[0]


def state_at(read: Callable[[int, int], bytes], size: int) -> tuple[bool | None, bool]:
    """`is_complete_at`, and whether the clip's data still ends in zeros (from one walk).

    A copier that preallocates (the full size first, then filled in, as some
    copy tools and NLE exports do) makes a file whose structure is whole long
    before its data is there: until its last bytes are written, they are
    zeros; and a QuickTime or MP4 file filled in another order has a video
    sample its index lists still zeros (`mp4index`). A finished clip's data
    rarely ends so (silent audio last might), so this says "wait while it is
    still being written", never "refuse".
    """
    if size < 8:
        return None, False
    try:
        head = read(0, 16)
        if len(head) < 8:
            return False, False
        moov = None
        if head[4:8] in _TOP_BOXES:
            whole, last, moov = _boxes_complete(read, size)
        elif head[:4] == _EBML:
            whole, last = _matroska_complete(read, size)
        else:
            return None, False
        if not whole:
            return whole, False
        if last is not None and _zeros_at_end(read, *last):
            return whole, True
        # Filled in some other order (a parallel copier): a video sample the index lists still zeros.
        return whole, moov is not None and mp4index.unwritten(read, *moov, size)
    except OSError:
        return None, False


Box = tuple[int, int]


def _boxes_complete(read: Callable[[int, int], bytes], size: int) -> tuple[bool | None, Box | None, Box | None]:
    """Whether the top-level boxes add up to `size` with a `moov` among them; the last data box and the
    `moov`'s content (start, end).

    At most MOST_TOP_BOXES are read (None beyond: the structure cannot say, settling decides).
    """
    pos = 0
    moov: Box | None = None
    last: Box | None = None
    for _ in range(MOST_TOP_BOXES):
        if pos >= size:
            break
        header = read(pos, 16)
        if len(header) < 8:
            return False, None, None
        length, kind = struct.unpack(">I4s", header[:8])
        if kind not in _TOP_BOXES:
            return False, None, None
        start = pos + 8
        if length == 1:
            if len(header) < 16:
                return False, None, None
            length = struct.unpack(">Q", header[8:16])[0]
            start = pos + 16
        elif length == 0:  # "to the end of the file": a writer that has not closed its mdat yet
            return False, None, None
        if length < 8 or start > pos + length:
            return False, None, None
        if kind == b"moov" and moov is None:
            moov = (start, pos + length)
        if kind not in _PADDING:
            last = (start, pos + length)
        pos += length
    else:
        if pos < size:
            return None, None, None
    return pos == size and moov is not None, last, moov


def _zeros_at_end(read: Callable[[int, int], bytes], start: int, end: int) -> bool:
    """Whether the last bytes before `end` (from `start` at most) are all zeros."""
    begin = max(start, end - _TAIL)
    if begin >= end:
        return False
    tail = read(begin, end - begin)
    return not tail.strip(b"\0")


def _ebml_size(data: bytes) -> tuple[int | None, int]:
    """An EBML variable-size integer at the start of `data`: (value or None for 'unknown', its width)."""
    if not data:
        return None, 0
    b = data[0]
    width = 1
    while width <= 8 and not b & (0x80 >> (width - 1)):
        width += 1
    if width > 8 or len(data) < width:
        return None, 1
    value = b & (0xFF >> width)
    for byte in data[1:width]:
        value = (value << 8) | byte
    if value == (1 << (7 * width)) - 1:
        return None, width
    return value, width


def _matroska_complete(read: Callable[[int, int], bytes], size: int) -> tuple[bool | None, tuple[int, int] | None]:
    header_size, n = _ebml_size(read(4, 8))
    if header_size is None:
        return None, None
    pos = 4 + n + header_size
    if read(pos, 4) != _SEGMENT:
        return False, None
    segment, n = _ebml_size(read(pos + 4, 8))
    if segment is None:
        return None, None  # a live-written Matroska of unknown size: settling decides
    start = pos + 4 + n
    return start + segment == size, (start, size)
