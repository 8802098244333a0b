"""Which files of one folder were opened, closed and moved in, in the kernel's order (inotify).

For tests that must act between two reads of a file by another process: the
kernel queues the events of one folder in the order they happened, whoever
caused them, so waiting on them is waiting on the reads themselves, and the
order read back afterwards shows the test did act between them.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
from daemon_process import TIMEOUT

IN_OPEN = 0x00000020
IN_CLOSE_NOWRITE = 0x00000010
IN_MOVED_TO = 0x00000080
_KINDS = {IN_OPEN: "open", IN_CLOSE_NOWRITE: "read", IN_MOVED_TO: "moved in"}
_HEADER = struct.Struct("iIII")


class FileEvents:
    """(kind, name) for each open, close without writing ("read") and move into `folder`."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self._fd, os.fsencode(folder), IN_OPEN | IN_CLOSE_NOWRITE | IN_MOVED_TO) < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
        self.events: list[tuple[str, str]] = []

    def wait_for(self, condition: Callable[[list[tuple[str, str]]], bool], what: str, timeout: float = TIMEOUT) -> None:
        """Block until `condition(events so far)` holds, reading events as the kernel queues them."""
        deadline = time.monotonic() + timeout
        while not condition(self.events):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; events: {self.events}"
            if select.select([self._fd], [], [], min(left, 1.0))[0]:
                self._read()

    def take(self) -> list[tuple[str, str]]:
        """Every event queued so far."""
        self._read()
        return list(self.events)

    def count(self, kind: str, name: str) -> int:
        return self.events.count((kind, name))

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, size = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size : offset + _HEADER.size + size].rstrip(b"\0").decode(errors="replace")
                offset += _HEADER.size + size
                for bit, kind in _KINDS.items():
                    if mask & bit:
                        self.events.append((kind, name))

    def close(self) -> None:
        os.close(self._fd)


def new_version(frame: Path) -> Path:
    """What a late render might bring for `frame`: something bright in one place; written beside its folder."""
    image = cv2.imread(str(frame))
    image[16:40, 24:56] = 255
    new = frame.parent.parent / f"new_{frame.name}"
    assert cv2.imwrite(str(new), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return new


@contextmanager
def rewritten_between_the_passes(
    frame: Path, new: Path, started: Callable[[], subprocess.Popen[bytes]], events: FileEvents
) -> Iterator[subprocess.Popen[bytes]]:
    """A two-pass run that, once its pass 1 has read `frame`, finds `new` moved into its place.

    The kernel's events say when pass 1 has read the frame; pass 2 reads it
    only once the slow model has run on every frame of the shot. The events
    read back afterwards show the new version landed between the two reads.
    The run is stopped on the way out if it is still going (a failed test).
    """
    proc = started()
    try:
        events.wait_for(lambda seen: ("read", frame.name) in seen, f"pass 1 to read {frame.name}")
        os.replace(new, frame)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def assert_read_once_before_the_rewrite_and_again_after(events: FileEvents, name: str) -> None:
    seen = events.take()
    moved = seen.index(("moved in", name))
    assert seen[:moved].count(("read", name)) == 1, seen  # pass 1 had read it, pass 2 had not
    assert ("open", name) in seen[moved:], seen
