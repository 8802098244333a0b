"""Whether a QuickTime or MP4 file's video samples are all written yet, read from its own index (`moov`).

A copier that sets the full size first and then fills it in (some copy tools
and NLE exports; parallel copiers fill it in any order) makes a file whose
top-level boxes add up, and whose index is there, long before its data is:
the bytes not yet written are zeros. A video sample never starts with eight
zero bytes (a length and a NAL header, a ProRes frame's size and `icpf`, a
JPEG's marker...), so the index says where to look: the start of each video
sample (evenly spread, at most MOST_SAMPLES of them) and the end of the last.

Bounded like the box walk: an index over MOST_INDEX_BYTES, or one that does
not parse, says nothing (settling decides).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np

#: Reads `n` bytes at `offset`.
ReadAt = Callable[[int, int], bytes]

#: An index larger than this is not read (hours of 60 fps video index in a few MB).
MOST_INDEX_BYTES = 64 << 20
#: Video samples looked at, evenly spread over the clip (and always its last one).
MOST_SAMPLES = 2048
#: Bytes looked at, at a sample's start (and at the last sample's end).
_LOOK = 8
#: Entries a table may list here (a day of 60 fps video): a crafted count must not fill the memory.
_MOST_TRACK_SAMPLES = 6_000_000


def unwritten(read: ReadAt, moov_start: int, moov_end: int, size: int) -> bool:
    """Whether some video sample the index at [moov_start, moov_end) lists is zeros (not yet written)."""
    if moov_end - moov_start > MOST_INDEX_BYTES or moov_end <= moov_start:
        return False
    moov = read(moov_start, moov_end - moov_start)
    if len(moov) != moov_end - moov_start:
        return False
    try:
        samples = [s for trak in _children(moov, 0, len(moov), b"trak") for s in _looked_at(moov, trak)]
    except (struct.error, ValueError, IndexError):
        return False  # an index that does not parse: FFmpeg says what is wrong with it, when the job reads it
    for offset, length, last in samples:
        if length <= 0 or offset < 0 or offset + length > size:
            continue
        if not read(offset, min(_LOOK, length)).strip(b"\0"):
            return True
        tail = min(_LOOK, length)
        if last and not read(offset + length - tail, tail).strip(b"\0"):
            return True
    return False


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The boxes in data[start:end]: (type, content start, box end)."""
    pos = start
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        body = pos + 8
        if length == 1:
            length = struct.unpack_from(">Q", data, pos + 8)[0]
            body = pos + 16
        elif length == 0:
            length = end - pos
        if length < body - pos or pos + length > end:
            raise ValueError("a box runs past its parent")
        yield kind, body, pos + length
        pos += length


def _children(data: bytes, start: int, end: int, kind: bytes) -> Iterator[tuple[int, int]]:
    for k, body, stop in _boxes(data, start, end):
        if k == kind:
            yield body, stop


def _find(data: bytes, start: int, end: int, path: tuple[bytes, ...]) -> tuple[int, int] | None:
    """The first box at `path` below [start, end)."""
    for kind, body, stop in _boxes(data, start, end):
        if kind == path[0]:
            return (body, stop) if len(path) == 1 else _find(data, body, stop, path[1:])
    return None


def _table(data: bytes, body: int, width: int, skip: int = 0, fields: int = 1) -> np.ndarray:
    """A full box's table of big-endian unsigned integers (`fields` to an entry): its count, then the
    entries, `skip` bytes in; flat."""
    count = struct.unpack_from(">I", data, body + 4 + skip)[0]
    if count > _MOST_TRACK_SAMPLES:
        raise ValueError("more entries than a clip has")
    return np.frombuffer(data, dtype=f">u{width}", count=count * fields, offset=body + 8 + skip).astype(np.int64)


def _looked_at(data: bytes, trak: tuple[int, int]) -> list[tuple[int, int, bool]]:
    """The video samples of a track to look at, as (offset, size, whether it is the last one); [] for any other track.

    Evenly spread, at most MOST_SAMPLES and the last; found from the tables
    (sizes, sample-to-chunk, chunk offsets) without listing every sample.
    """
    hdlr = _find(data, *trak, (b"mdia", b"hdlr"))
    if hdlr is None or data[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
        return []
    stbl = _find(data, *trak, (b"mdia", b"minf", b"stbl"))
    if stbl is None:
        return []
    tables = {kind: body for kind, body, _ in _boxes(data, *stbl)}
    if b"stsz" not in tables or b"stsc" not in tables or not ({b"stco", b"co64"} & tables.keys()):
        return []
    fixed = struct.unpack_from(">I", data, tables[b"stsz"] + 4)[0]
    if fixed:
        count = struct.unpack_from(">I", data, tables[b"stsz"] + 8)[0]
        sizes = np.full(min(count, _MOST_TRACK_SAMPLES), fixed, dtype=np.int64)
    else:
        sizes = _table(data, tables[b"stsz"], 4, skip=4)
    offsets = _table(data, tables[b"stco"], 4) if b"stco" in tables else _table(data, tables[b"co64"], 8)
    runs = _table(data, tables[b"stsc"], 4, fields=3).reshape(-1, 3)  # first chunk, samples per chunk, description
    # Samples in each chunk, from the runs (each from its first chunk to the next run's).
    bounds = np.clip(np.append(runs[:, 0] - 1, len(offsets)), 0, len(offsets))
    per_chunk = np.repeat(runs[:, 1], np.clip(np.diff(bounds), 0, None))
    starts = np.concatenate(([0], np.cumsum(per_chunk)))  # each chunk's first sample
    total = int(min(starts[-1], len(sizes)))
    if total == 0:
        return []
    at = np.concatenate(([0], np.cumsum(sizes[:total])))  # each sample's offset within its run of samples
    picked = np.unique(np.append(np.arange(0, total, max(1, total // MOST_SAMPLES)), total - 1))
    chunk = np.searchsorted(starts, picked, side="right") - 1
    where = offsets[chunk] + at[picked] - at[starts[chunk]]
    return [(int(o), int(sizes[k]), bool(k == total - 1)) for o, k in zip(where, picked)]
