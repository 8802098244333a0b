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

#: Reads `n` bytes at `offset`.
ReadAt = Callable[[int, int], bytes]

#: An index larger than this is not read (hours of 60 fps video index in a few MB).
MOST_INDEX_BYTES = 64 << 20
#: Video samples looked at, evenly spread over the clip (and always its last one).
MOST_SAMPLES = 2048
#: Bytes looked at, at a sample's start (and at the last sample's end).
_LOOK = 8
#: Samples a track may list here (a day of 60 fps video): a crafted count must not fill the memory.
_MOST_TRACK_SAMPLES = 6_000_000


def unwritten(read: ReadAt, moov_start: int, moov_end: int, size: int) -> bool:
    """Whether some video sample the index at [moov_start, moov_end) lists is zeros (not yet written)."""
    if moov_end - moov_start > MOST_INDEX_BYTES or moov_end <= moov_start:
        return False
    moov = read(moov_start, moov_end - moov_start)
    if len(moov) != moov_end - moov_start:
        return False
    try:
        samples = [s for trak in _children(moov, 0, len(moov), b"trak") for s in _video_samples(moov, trak)]
    except (struct.error, ValueError, IndexError):
        return False  # an index that does not parse: FFmpeg says what is wrong with it, when the job reads it
    samples = [(offset, length) for offset, length in samples if length > 0 and offset + length <= size]
    if not samples:
        return False
    step = max(1, len(samples) // MOST_SAMPLES)
    looked = samples[::step]
    if looked[-1] != samples[-1]:
        looked.append(samples[-1])
    for offset, length in looked:
        if not read(offset, min(_LOOK, length)).strip(b"\0"):
            return True
    offset, length = samples[-1]
    tail = min(_LOOK, length)
    return not read(offset + length - tail, tail).strip(b"\0")


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


def _video_samples(data: bytes, trak: tuple[int, int]) -> list[tuple[int, int]]:
    """Each sample of a video track, as (offset, size) in the file; [] for any other track."""
    hdlr = _find(data, *trak, (b"mdia", b"hdlr"))
    if hdlr is None or data[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
        return []
    stbl = _find(data, *trak, (b"mdia", b"minf", b"stbl"))
    if stbl is None:
        return []
    tables = {kind: (body, stop) for kind, body, stop in _boxes(data, *stbl)}
    sizes = _sizes(data, tables)
    offsets = _chunk_offsets(data, tables)
    if sizes is None or offsets is None or b"stsc" not in tables:
        return []
    body, _ = tables[b"stsc"]
    entries = struct.unpack_from(">I", data, body + 4)[0]
    runs = [struct.unpack_from(">III", data, body + 8 + 12 * i)[:2] for i in range(entries)]
    samples: list[tuple[int, int]] = []
    k = 0
    for i, (first, per_chunk) in enumerate(runs):
        last = runs[i + 1][0] - 1 if i + 1 < len(runs) else len(offsets)
        for chunk in range(first - 1, min(last, len(offsets))):
            at = offsets[chunk]
            for _ in range(per_chunk):
                if k >= len(sizes):
                    return samples
                samples.append((at, sizes[k]))
                at += sizes[k]
                k += 1
    return samples


def _sizes(data: bytes, tables: dict[bytes, tuple[int, int]]) -> list[int] | None:
    if b"stsz" not in tables:
        return None
    body, _ = tables[b"stsz"]
    fixed, count = struct.unpack_from(">II", data, body + 4)
    if count > _MOST_TRACK_SAMPLES:
        raise ValueError("more samples than a clip has")
    if fixed:
        return [fixed] * count
    return list(struct.unpack_from(f">{count}I", data, body + 12))


def _chunk_offsets(data: bytes, tables: dict[bytes, tuple[int, int]]) -> list[int] | None:
    if b"stco" in tables:
        body, _ = tables[b"stco"]
        count = struct.unpack_from(">I", data, body + 4)[0]
        return list(struct.unpack_from(f">{count}I", data, body + 8))
    if b"co64" in tables:
        body, _ = tables[b"co64"]
        count = struct.unpack_from(">I", data, body + 4)[0]
        return list(struct.unpack_from(f">{count}Q", data, body + 8))
    return None
