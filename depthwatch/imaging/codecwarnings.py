"""What image codecs write to stderr themselves, caught and turned into a reason.

libjpeg reports a damaged file it has still decoded ("Corrupt JPEG data:
premature end of data segment": a truncated file with an end marker appended,
the rest of the picture made up) only as a warning printed from C to file
descriptor 2: no return value says so, and the raw text lands in the middle of
the daemon's log lines. So a decode runs with descriptor 2 pointed at a pipe;
afterwards the codec's messages are taken out, and anything else that another
thread wrote meanwhile (a log line) is passed on to the real stderr unchanged.
Decodes that capture are serialised by a lock (descriptor 2 is one per
process); a decode takes a few milliseconds, far less than an inference.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator

_lock = threading.Lock()

#: libjpeg's warnings (jerror.h), written without a newline.
_LIBJPEG = re.compile(
    rb"(?:Corrupt JPEG data: (?:premature end of data segment|bad Huffman code"
    rb"|\d+ extraneous bytes before marker 0x[0-9a-f]{2}|found marker 0x[0-9a-f]{2} instead of RST\d)"
    rb"|Premature end of JPEG file|Invalid SOS parameters for sequential JPEG)\n?"
)
#: Those of them that mean part of the picture was made up, not decoded.
_DAMAGED = ("premature end", "Premature end", "bad Huffman code", "instead of RST", "Invalid SOS")
#: libpng's warnings ("libpng warning: tEXt: CRC error"): a chunk it skipped, the picture intact.
_LIBPNG = re.compile(rb"libpng warning: [^\n]*\n?")
#: OpenCV's own log lines ("[ WARN:0@0.05] global grfmt_tiff.cpp:811 readData ...").
_OPENCV = re.compile(rb"\[ ?(?:WARN|ERROR|INFO):[^\]]*\][^\n]*\n?")


class Captured:
    """The codec messages caught during one decode."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    @property
    def damaged(self) -> str | None:
        """libjpeg's first message that means the picture is incomplete, or None."""
        for message in self.messages:
            if any(sign in message for sign in _DAMAGED):
                return message
        return None


@contextlib.contextmanager
def codec_messages() -> Iterator[Captured]:
    """Run the body with descriptor 2 captured; codec messages go to `Captured`, the rest on."""
    captured = Captured()
    with _lock:
        try:
            read_end, write_end = os.pipe()
            saved = os.dup(2)
        except OSError:  # out of descriptors: decode without the check
            yield captured
            return
        try:
            os.set_blocking(read_end, False)
            os.dup2(write_end, 2)
            try:
                yield captured
            finally:
                os.dup2(saved, 2)
                os.close(write_end)
                text = _drain(read_end)
                rest = _take(text, captured)
                if rest:
                    _write_all(saved, rest)
        finally:
            os.close(read_end)
            os.close(saved)


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _take(text: bytes, captured: Captured) -> bytes:
    for pattern in (_LIBJPEG, _LIBPNG, _OPENCV):
        for match in pattern.finditer(text):
            captured.messages.append(match.group().decode(errors="replace").strip())
        text = pattern.sub(b"", text)
    return text


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            return
