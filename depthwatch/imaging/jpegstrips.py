"""A grey depth map's JPEG made as two strips at once and joined: the same file, byte for byte.

Why: encoding a 1080p map takes about 3 ms on one core, the largest step after
the model that a frame on its own waits for. A JPEG whose entropy-coded data
restarts at each row of blocks (a restart interval of one block row: DRI,
part of baseline JPEG, read by every decoder) can be encoded in horizontal
strips by two threads: each strip is a JPEG of its own with the same tables,
and the file is the first strip's headers and data, the restart marker that
follows its last row, then the second strip's data. Split at a multiple of 64
rows (8 block rows), the second strip's own markers (RST0..RST7 in turn) are
already the ones the whole file has there, so nothing inside is rewritten,
and the joined file is exactly the whole encode's (`tests/test_jpegstrips.py`).

The restart markers are always written, split or not, so a map's bytes never
depend on how busy the machine was: 2 bytes a block row and the padding to a
byte, about 0.2 % of a 1080p map.
"""

from __future__ import annotations

import cv2
import numpy as np

from depthwatch.imaging.beside import Beside, Offered

#: A grey JPEG's block (its minimum coded unit) is 8 x 8 pixels.
BLOCK = 8
#: Strips are split at a multiple of this many rows: 8 block rows, one turn of RST0..RST7.
SPLIT_ROWS = 64
#: Maps shorter than this are encoded whole (too little work to share).
MIN_SPLIT_HEIGHT = 256
_SOS, _SOF0, _SOF1, _EOI = 0xDA, 0xC0, 0xC1, b"\xff\xd9"


def encode(depth: np.ndarray, quality: int, beside: Beside | None = None) -> bytes:
    """`depth` (uint8, one channel) as a JPEG with a restart at every block row.

    `beside`: where the lower strip may go while this thread encodes the upper
    one (see `beside`); the file is the same either way.
    """
    height = depth.shape[0]
    split = split_row(height)
    if beside is None or split is None:
        return _encode(depth, quality)
    lower = Offered(lambda: _encode(depth[split:], quality), beside)
    upper = _encode(depth[:split], quality)
    return join(upper, lower.take(), split, height)


def split_row(height: int) -> int | None:
    """Where a map of `height` rows is split: a multiple of SPLIT_ROWS near its middle (None: not split)."""
    if height < MIN_SPLIT_HEIGHT:
        return None
    return max(SPLIT_ROWS, round(height / 2 / SPLIT_ROWS) * SPLIT_ROWS)


def _encode(depth: np.ndarray, quality: int) -> bytes:
    per_row = -(-depth.shape[1] // BLOCK)  # restart interval: one row of blocks
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_RST_INTERVAL, per_row]
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(depth), params)
    if not ok:
        raise ValueError("OpenCV could not encode the map as JPEG")
    return buf.tobytes()


def join(upper: bytes, lower: bytes, split: int, height: int) -> bytes:
    """One JPEG of `height` rows from the strip above row `split` and the strip from it on."""
    if split % SPLIT_ROWS or not upper.endswith(_EOI) or not lower.endswith(_EOI):
        raise ValueError("not two strips of one JPEG split at a multiple of 64 rows")
    head = bytearray(upper[:-2])
    frame = _segment(upper, (_SOF0, _SOF1))
    head[frame + 5 : frame + 7] = height.to_bytes(2, "big")  # SOF: length(2) precision(1) height(2)
    restart = bytes((0xFF, 0xD0 + (split // BLOCK - 1) % 8))
    scan = _segment(lower, (_SOS,))
    data = scan + 2 + int.from_bytes(lower[scan + 2 : scan + 4], "big")
    return bytes(head) + restart + lower[data:]


def _segment(jpeg: bytes, markers: tuple[int, ...]) -> int:
    """Where the first header segment with one of `markers` starts (its 0xFF)."""
    at = 2  # after SOI
    while at + 4 <= len(jpeg) and jpeg[at] == 0xFF:
        if jpeg[at + 1] in markers:
            return at
        if jpeg[at + 1] == _SOS:
            break
        at += 2 + int.from_bytes(jpeg[at + 2 : at + 4], "big")
    raise ValueError("a JPEG strip without the segment its joining needs")
