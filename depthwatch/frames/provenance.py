"""A small record inside every depth map: which version of which frame it was made from.

It answers two questions a file name cannot. Is this file one of depthwatch's
own maps (whatever the output template was when it was written, whatever odd
characters its name holds)? Then it is never taken as a frame. Does this map
belong to the frame now on disk? At start-up a map whose recorded
(size, mtime_ns, inode) differs from the frame's is stale and made again, even
if it is newer by mtime (a kill between two versions). A plugin can read the
same record to check which frame a map shows.

Where the record lives: JPEG, a COM segment right after SOI/APP0; PNG, a
`tEXt` chunk with keyword `depthwatch` right after IHDR; TIFF, the
ImageDescription tag (270) of the first image; EXR, a string attribute named
`depthwatch` in the header (Nuke shows it as `exr/depthwatch`). The text is
`depthwatch ` + compact JSON (ASCII).
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from depthwatch import __version__
from depthwatch.errors import FrameError
from depthwatch.frames.job import Signature, signature_from
from depthwatch.frames.reading import open_checked
from depthwatch.imaging import exrlayout, formats

KEYWORD = "depthwatch"
_PREFIX = (KEYWORD + " ").encode()
#: Records are a few hundred bytes; anything larger is not ours.
_MAX_RECORD = 16384
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def record_for(
    source: str, st: os.stat_result, *, model: str, normalise: str, invert: bool, made_with: str | None = None
) -> dict[str, Any]:
    """The record for a map made from the frame named `source` whose fstat was `st`.

    `made_with`: the digest of the settings that shaped its pixels (`Settings.made_with`).
    """
    record: dict[str, Any] = {
        "source": source,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "model": model,
        "normalise": normalise,
        "invert": invert,
        "version": __version__,
    }
    if made_with is not None:
        record["made_with"] = made_with
    return record


def same_version(record: dict[str, Any], version: os.stat_result | Signature) -> bool:
    """Whether `record` was made from this very frame version (its size, mtime and inode): the one test of it.

    `version`: the frame's stat, or its `Signature`. The pipeline asks it before
    writing a version again, the API's waiters of the map on disk, and
    `rules.map_is_current` of a map a scan finds.
    """
    if isinstance(version, os.stat_result):
        version = signature_from(version)
    return (record.get("size"), record.get("mtime_ns"), record.get("inode")) == tuple(version)


def same_clip_version(record: dict[str, Any], st: os.stat_result) -> bool:
    """Whether a sequence frame's `record` was made from the clip whose stat is `st`: by size and mtime, not the inode.

    A clip is hours of work to map again, and a share that gives new inodes at
    each reconnect, a copy with `cp -a`, or a farm worker's view of the file
    would have it mapped again with nothing changed.
    """
    return (record.get("size"), record.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)


def _text(record: dict[str, Any]) -> bytes:
    text = _PREFIX + json.dumps(record, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(text) > _MAX_RECORD:
        raise FrameError("the provenance record is too long (a frame name of thousands of characters?)")
    return text


def embed(encoded: bytes, record: dict[str, Any]) -> bytes:
    """`encoded` (a JPEG, PNG, TIFF or EXR file) with `record` inside; other formats unchanged."""
    fmt = formats.sniff(encoded)
    text = _text(record)
    if fmt == formats.JPEG:
        return _jpeg_embed(encoded, text)
    if fmt == formats.PNG:
        return _png_embed(encoded, text)
    if fmt == formats.TIFF and encoded[2:4] in (b"*\x00", b"\x00*"):
        return _tiff_embed(encoded, text)
    if fmt == formats.EXR:
        return exrlayout.with_string_attribute(encoded, KEYWORD, text)
    return encoded


def read(source: Path | bytes, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The record in a map file or its bytes; None if there is none (not one of ours).

    A path is opened without following a link and only if it is a regular file
    (a FIFO put in a map's place must not hang the caller). `dir_fd`: the path
    is a name in the folder open on that descriptor.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _read(io.BytesIO(bytes(source)))
    try:
        fd, _ = open_checked(Path(source), follow_links=False, max_bytes=1 << 62, dir_fd=dir_fd)
    except FrameError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return _read(f)
        except OSError:
            return None


def _read(f: BinaryIO) -> dict[str, Any] | None:
    head = f.read(16)
    fmt = formats.sniff(head)
    f.seek(0)
    try:
        if fmt == formats.JPEG:
            text = _jpeg_read(f)
        elif fmt == formats.PNG:
            text = _png_read(f)
        elif fmt == formats.TIFF:
            text = _tiff_read(f)
        elif fmt == formats.EXR:
            text = _exr_read(f)
        else:
            return None
    except (struct.error, ValueError, IndexError, exrlayout.Incomplete):
        return None
    if not text or not text.startswith(_PREFIX):
        return None
    try:
        record = json.loads(text[len(_PREFIX) :].rstrip(b"\x00"))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


# -- JPEG: a COM segment after SOI (and after APP0, where JFIF wants it) ----------------


def _jpeg_embed(data: bytes, text: bytes) -> bytes:
    pos = 2
    if data[2:4] == b"\xff\xe0":
        pos = 4 + struct.unpack(">H", data[4:6])[0]
    return data[:pos] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + data[pos:]


def _jpeg_read(f: BinaryIO) -> bytes | None:
    if f.read(2) != b"\xff\xd8":
        return None
    for _ in range(64):  # the record sits among the first segments
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF or marker[1] in (0xDA, 0xD9):
            return None
        (length,) = struct.unpack(">H", f.read(2))
        if marker[1] == 0xFE and length - 2 <= _MAX_RECORD:
            body = f.read(length - 2)
            if body.startswith(_PREFIX):
                return body
        else:
            f.seek(length - 2, io.SEEK_CUR)
    return None


# -- PNG: a tEXt chunk after IHDR -------------------------------------------------------


def _png_embed(data: bytes, text: bytes) -> bytes:
    (length,) = struct.unpack(">I", data[8:12])
    pos = 8 + 12 + length  # after IHDR
    body = KEYWORD.encode() + b"\x00" + text
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    return data[:pos] + chunk + data[pos:]


def _png_read(f: BinaryIO) -> bytes | None:
    if f.read(8) != _PNG_SIGNATURE:
        return None
    for _ in range(64):
        header = f.read(8)
        if len(header) < 8:
            return None
        length, kind = struct.unpack(">I", header[:4])[0], header[4:]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tEXt" and length <= _MAX_RECORD + 32:
            body = f.read(length)
            keyword, _, text = body.partition(b"\x00")
            if keyword == KEYWORD.encode():
                return text
            f.seek(4, io.SEEK_CUR)
        else:
            f.seek(length + 4, io.SEEK_CUR)
    return None


# -- TIFF: ImageDescription in the first IFD ---------------------------------------------
# The first IFD is copied to the end of the file with tag 270 added, and the
# header pointed at the copy: nothing the other tags point to moves.


def _tiff_embed(data: bytes, text: bytes) -> bytes:
    e = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(e + "I", data[4:8])
    (count,) = struct.unpack(e + "H", data[ifd : ifd + 2])
    entries = [data[ifd + 2 + 12 * i : ifd + 14 + 12 * i] for i in range(count)]
    (next_ifd,) = struct.unpack(e + "I", data[ifd + 2 + 12 * count : ifd + 6 + 12 * count])
    entries = [entry for entry in entries if struct.unpack(e + "H", entry[:2])[0] != 270]
    out = bytearray(data)
    if len(out) % 2:
        out += b"\x00"
    payload = text + b"\x00"
    offset = len(out)
    out += payload
    if len(out) % 2:
        out += b"\x00"
    entries.append(struct.pack(e + "HHII", 270, 2, len(payload), offset))
    entries.sort(key=lambda entry: struct.unpack(e + "H", entry[:2])[0])
    new_ifd = len(out)
    out += struct.pack(e + "H", len(entries)) + b"".join(entries) + struct.pack(e + "I", next_ifd)
    out[4:8] = struct.pack(e + "I", new_ifd)
    return bytes(out)


def _tiff_read(f: BinaryIO) -> bytes | None:
    head = f.read(8)
    if head[2:4] not in (b"*\x00", b"\x00*"):
        return None
    e = "<" if head[:2] == b"II" else ">"
    (ifd,) = struct.unpack(e + "I", head[4:8])
    f.seek(ifd)
    (count,) = struct.unpack(e + "H", f.read(2))
    table = f.read(12 * min(count, 512))
    for i in range(len(table) // 12):
        tag, kind, n, offset = struct.unpack(e + "HHII", table[12 * i : 12 * i + 12])
        if tag == 270 and kind == 2 and n <= _MAX_RECORD:
            if n <= 4:
                return table[12 * i + 8 : 12 * i + 8 + n]
            f.seek(offset)
            return f.read(n)
    return None


# -- EXR: a string attribute in the header -------------------------------------------------


def _exr_read(f: BinaryIO) -> bytes | None:
    def read(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    size = f.seek(0, io.SEEK_END)
    layout = exrlayout.read_layout(read, size)  # the header only, bounded (exrlayout.MAX_HEADER)
    found = layout.attributes.get(KEYWORD)
    if found is None or found.type != "string" or found.size > _MAX_RECORD:
        return None
    return read(found.offset, found.size)
