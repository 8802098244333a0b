"""The frame the model is running on, on disk while it runs: a crash inside the runtime names it at the next start.

A frame that crashes the model's runtime natively (a segfault in a provider,
an abort in a kernel) ends the process with no line at all. launchd or
systemd start it again, the start-up scan meets the frame again, and it
crashes again: the folder is stuck for good and the log says nothing of why.
So the inference thread notes each frame (its path and version) before the
model runs on it and clears the note after: one write into a block the file
already has (a few microseconds, no fsync: a process that dies leaves its
writes in the page cache). Not a file mapped into memory: where the disk is
full, or copies on write (btrfs, APFS), the first store into a mapped page
that has no block kills the process with SIGBUS, the very loop this is for,
on every frame; a write just fails, and the frame is mapped all the same. A
note left at the next start names the frame the last run ended on. The first
time it is tried once more (a kill or a power cut ends a run too); ended on
twice, that version of the frame is set aside, one line says so, and it stays
aside (in a small file beside the status) until it changes or that file is
removed. A clean stop removes the note. The note is locked while a daemon
keeps it: a second daemon given the same status file neither reads another's
live note as a crash nor clears it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from depthwatch.errors import OutputError
from depthwatch.frames.job import Signature, signature_of
from depthwatch.frames.writer import atomic_write
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")

#: Ends of the process on one version of one frame before it is set aside.
ENDS_BEFORE_SET_ASIDE = 2
#: The note's room: a path (at most 4096 bytes) and its version, as JSON, ended by a NUL.
_NOTE_BYTES = 8192


class BlackBox:
    """The note of the frame in the model now (`note`, inference thread) and the frames set aside."""

    def __init__(self, status_file: Path) -> None:
        self._path = status_file.with_name(status_file.name + ".inference")
        self._aside_path = status_file.with_name(status_file.name + ".set-aside")
        #: Frames set aside (path -> version): never run again until they change.
        self.set_aside: dict[str, Signature] = {}
        #: The frame the last run ended on, and how many runs ended on it (that version).
        self._suspect: tuple[str, Signature, int] | None = None
        self._fd: int | None = None
        self._closed = False

    def open(self) -> None:
        """Read what the last run left, say it, and start noting (main thread, before the first frame)."""
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._cannot_keep(exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            log.warning(
                "another depthwatch keeps %s (both were given this status file): a frame that crashes this one's model "
                "runtime will not be named; give each daemon its own daemon.status_file", shown(self._path),
            )
            return
        self._read_set_aside()
        self._judge(self._read_note(fd))
        try:
            # The note's blocks, had now: a full disk says so here, once, not at a frame.
            os.pwrite(fd, bytes(_NOTE_BYTES), 0)
        except OSError as exc:
            os.close(fd)
            self._cannot_keep(exc)
            return
        self._fd = fd

    def _judge(self, last: tuple[str, Signature, int] | None) -> None:
        if last is None:
            return
        frame, version, ends = last[0], last[1], last[2] + 1
        if signature_of(Path(frame)) != version:
            log.warning("the last run ended while the model ran on %s, which has changed since", shown(frame))
        elif ends >= ENDS_BEFORE_SET_ASIDE:
            self.set_aside[frame] = version
            self._write_set_aside()
            log.error(
                "%s: the process ended %d times while the model ran on this version of it (a crash in the model's "
                "runtime?); it is set aside, not mapped again until it changes (or %s is removed)",
                shown(frame), ends, shown(self._aside_path),
            )
        else:
            self._suspect = (frame, version, ends)
            log.warning(
                "%s: the model was running on it when the last run ended without stopping; it is tried once more "
                "(set aside if the process ends on it again)", shown(frame),
            )

    def _cannot_keep(self, exc: OSError) -> None:
        log.warning("cannot keep %s (%s): a frame that crashes the model's runtime will not be named", shown(self._path), exc.strerror or exc)

    def holds(self, frame: Path, version: Signature | None) -> bool:
        """Whether this version of `frame` is set aside."""
        return version is not None and self.set_aside.get(str(frame)) == tuple(version)

    def note(self, label: Any) -> None:
        """`label` (path, version) is about to run through the model; None: the run is over (inference thread)."""
        fd = self._fd
        if fd is None or self._closed:
            return
        try:
            if label is None:
                os.pwrite(fd, b"\0", 0)  # an empty note
                return
            frame, version = str(label[0]), tuple(label[1])
            suspect = self._suspect
            ends = suspect[2] if suspect is not None and suspect[0] == frame and suspect[1] == version else 0
            data = json.dumps({"frame": frame, "version": list(version), "ends": ends}).encode() + b"\0"
            if len(data) <= _NOTE_BYTES:  # a longer path is not noted: its frame is mapped all the same
                os.pwrite(fd, data, 0)
        except OSError:  # a disk full even for a block it had (copy on write): the frame is mapped all the same
            pass

    def close(self) -> None:
        """A clean stop: no frame was cut off by a crash (main thread, after the engine stopped)."""
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.unlink(self._path)  # while still locked: never another daemon's note
            except OSError:
                pass
            os.close(fd)

    @staticmethod
    def _read_note(fd: int) -> tuple[str, Signature, int] | None:
        try:
            data = json.loads(os.pread(fd, _NOTE_BYTES, 0).split(b"\0", 1)[0] or b"null")
            if data is None:
                return None
            return str(data["frame"]), tuple(int(v) for v in data["version"]), int(data.get("ends", 0))  # type: ignore[return-value]
        except (OSError, ValueError, KeyError, TypeError):  # half written by a run cut off mid-write
            return None

    def _read_set_aside(self) -> None:
        try:
            entries = json.loads(self._aside_path.read_text())
            kept = {str(e["frame"]): tuple(int(v) for v in e["version"]) for e in entries}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError):
            return
        # A frame changed or gone since it was set aside is a frame like any other again.
        self.set_aside = {frame: version for frame, version in kept.items() if signature_of(Path(frame)) == version}  # type: ignore[misc]
        if len(self.set_aside) != len(kept):
            self._write_set_aside()

    def _write_set_aside(self) -> None:
        entries = [{"frame": frame, "version": list(version)} for frame, version in self.set_aside.items()]
        try:
            if entries:
                atomic_write(self._aside_path, json.dumps(entries).encode())
            else:
                self._aside_path.unlink(missing_ok=True)
        except (OSError, OutputError) as exc:
            log.warning("cannot keep %s (%s)", shown(self._aside_path), getattr(exc, "strerror", None) or exc)
