"""What each thread works on, on disk while it works: a frame that ends the process is named at the next start.

A frame that crashes the model's runtime natively (a segfault in a provider,
an abort in a kernel), or that takes the machine's memory in a worker's
decode or render (an OOM kill), ends the process with no line at all.
launchd or systemd start it again, the start-up scan meets the frame again,
and it ends the process again: the folder is stuck for good and the log says
nothing of why. So each thread that works on frames (the inference thread,
every worker, the clip thread) has a slot of its own, and the supervisor
notes there each frame (its path, version and stage) before the thread works
on it and clears the note after: one write into a block the file already has
(a few microseconds, no fsync: a process that dies leaves its writes in the
page cache). Not a file mapped into memory: where the disk is full, or copies
on write (btrfs, APFS), the first store into a mapped page that has no block
kills the process with SIGBUS, the very loop this is for, on every frame; a
write just fails, and the frame is mapped all the same. A note left at the
next start names the frame the last run ended on, and its stage. The first
time it is tried once more (a kill or a power cut ends a run too); ended on
twice, that version of the frame is set aside, one line says so, and it stays
aside (in a small file beside the status) until it changes or that file is
removed. A native crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) is told
apart from a kill: Python's faulthandler writes the crash, with every thread's
stack, to a file beside the status (`<status>.crash`), so a frame the process
crashed on is set aside at the very next start, met once. A kill (an OOM
kill, `kill -9`, a power cut) leaves no such file, and cannot be told apart
from one that says nothing of the frame: those frames are tried once more.
A frame the model hung on (its run given up past the stall bound,
see `supervisor`) is set aside at once, as it is given up, and stays aside
across restarts; another model in service lets it be tried again. A clean
stop removes the notes. The notes are locked while a daemon keeps them: a
second daemon given the same status file neither reads another's live note
as a crash nor clears it.
"""

from __future__ import annotations

import faulthandler
import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from depthwatch.errors import OutputError
from depthwatch.frames.job import Signature, signature_of
from depthwatch.frames.writer import atomic_write
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")

#: Ends of the process on one version of one frame before it is set aside.
ENDS_BEFORE_SET_ASIDE = 2
#: A slot's room: a path (at most 4096 bytes), its version and stage, as JSON, ended by a NUL.
_NOTE_BYTES = 8192
#: The stage of the inference thread's notes (see `supervisor`); the others are the workers' and the clip thread's.
INFER = "infer"
#: What a thread was doing at each stage it notes, as the next start says it.
_DOING = {"read": "reading or decoding", "render": "rendering or writing", "clip": "making the depth clip of"}
#: Why a frame is set aside: runs of the process ended on it, or the model hung on it.
CRASHED, HUNG = "crashed", "hung"
_REFUSALS = {
    CRASHED: (
        "set aside: runs of depthwatch ended while working on this version of it (a crash in the model's runtime, "
        "or out of memory?); it is mapped again once it changes: replace it, or remove it"
    ),
    HUNG: (
        "set aside: the model ran on this version of it past the stall bound (daemon.stall_timeout_s) and was "
        "given up; it is mapped again once it changes or another model is loaded"
    ),
}


class BlackBox:
    """The notes of the frames worked on now (`note`, one slot per thread) and the frames set aside."""

    def __init__(self, status_file: Path) -> None:
        self._path = status_file.with_name(status_file.name + ".inference")
        #: The other threads' slots (workers, the clip thread): a file of their own, so the `.inference`
        #: note names only what the model runs on.
        self._threads_path = status_file.with_name(status_file.name + ".threads")
        self._aside_path = status_file.with_name(status_file.name + ".set-aside")
        #: Where faulthandler writes a native crash (`crashes` in `open`), and the last run's, kept for the user.
        self._crash_path = status_file.with_name(status_file.name + ".crash")
        self._last_crash_path = status_file.with_name(status_file.name + ".crash.last")
        self._crash_file: Any = None
        #: The last run crashed natively (its first line), as its crash file said at this start.
        self._crashed: str | None = None
        #: Frames set aside (path -> version): never run again until they change.
        self.set_aside: dict[str, Signature] = {}
        #: Why each frame is set aside (CRASHED, HUNG).
        self._why: dict[str, str] = {}
        #: The frames the last run ended on -> (their version, how many runs ended on that version).
        self._suspects: dict[str, tuple[Signature, int]] = {}
        self._fd: int | None = None
        self._threads_fd: int | None = None
        #: The length of each slot's note: cleared whole, so what a slot shows is only ever what its thread works on now.
        self._noted: dict[int, int] = {}
        self._slots = 1
        self._closed = False
        self._lock = threading.Lock()

    def open(self, slots: int = 1, crashes: bool = False) -> None:
        """Read what the last run left, say it, and start noting in `slots` slots (main thread, before the first frame).

        `crashes`: this process is the daemon itself (`depthwatch run`), so faulthandler may be
        pointed at the crash file (it is process-wide: a daemon embedded in another program leaves it be).
        """
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
        self._crashed = self._last_crash()  # locked: never another live daemon's crash file
        notes = self._read_notes(fd)
        threads_fd: int | None = None
        if slots > 1:
            try:
                threads_fd = os.open(self._threads_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                self._cannot_keep(exc, self._threads_path)
            else:
                notes += self._read_notes(threads_fd)
        judged: set[str] = set()
        for note in notes:
            if note[0] not in judged:
                judged.add(note[0])
                self._judge(note)
        try:
            # The notes' blocks, had now: a full disk says so here, once, not at a frame.
            os.pwrite(fd, bytes(_NOTE_BYTES), 0)
        except OSError as exc:
            os.close(fd)
            if threads_fd is not None:
                os.close(threads_fd)
            self._cannot_keep(exc)
            return
        if threads_fd is not None:
            try:
                os.ftruncate(threads_fd, 0)
                os.pwrite(threads_fd, bytes(_NOTE_BYTES * (slots - 1)), 0)
            except OSError as exc:
                os.close(threads_fd)
                threads_fd = None
                self._cannot_keep(exc, self._threads_path)
        self._fd, self._threads_fd = fd, threads_fd
        self._slots = max(1, slots)
        if crashes:
            self._catch_crashes()

    def _last_crash(self) -> str | None:
        """The first line of the last run's native crash, kept as `<status>.crash.last`; None if it did not crash."""
        try:
            with open(self._crash_path, "rb") as f:
                dump = f.read(65536)
        except OSError:
            return None
        if not dump.strip():
            return None
        try:
            os.replace(self._crash_path, self._last_crash_path)
        except OSError:
            pass
        first = dump.decode("utf-8", "replace").strip().splitlines()[0]
        return first.removeprefix("Fatal Python error: ").strip() or "a fatal signal"

    def _catch_crashes(self) -> None:
        """Point faulthandler at the crash file: a native crash in any thread is written there as it happens."""
        try:
            self._crash_file = open(self._crash_path, "wb")  # noqa: SIM115  (open for the process's life)
        except OSError as exc:
            self._cannot_keep(exc, self._crash_path)
            return
        faulthandler.enable(file=self._crash_file, all_threads=True)

    def _judge(self, last: tuple[str, Signature, int, str]) -> None:
        frame, version, ends, stage = last[0], last[1], last[2] + 1, last[3]
        model = stage == INFER
        doing = "the model ran on" if model else f"depthwatch was {_DOING.get(stage, 'working on')}"
        if signature_of(Path(frame)) != version:
            log.warning("the last run ended while %s %s, which has changed since", doing, shown(frame))
        elif frame in self.set_aside:
            return  # set aside already (the model hung on it, and the process ended before it moved on)
        elif self._crashed is not None:
            self._put_aside(frame, version, CRASHED)
            log.error(
                "%s: the process crashed (%s) while %s this version of it; it is set aside, not mapped again until "
                "it changes (or %s is removed); the crash, with every thread's stack, is in %s",
                shown(frame), self._crashed, doing, shown(self._aside_path), shown(self._last_crash_path),
            )
        elif ends >= ENDS_BEFORE_SET_ASIDE:
            self._put_aside(frame, version, CRASHED)
            cause = "a crash in the model's runtime?" if model else "out of memory, or a crash in a decoder?"
            log.error(
                "%s: the process ended %d times while %s this version of it (%s); it is set aside, not mapped "
                "again until it changes (or %s is removed)",
                shown(frame), ends, doing, cause, shown(self._aside_path),
            )
        else:
            self._suspects[frame] = (version, ends)
            said = "the model was running on it" if model else f"{doing} it"
            log.warning(
                "%s: %s when the last run ended without stopping; it is tried once more "
                "(set aside if the process ends on it again)", shown(frame), said,
            )

    def _put_aside(self, frame: str, version: Signature, why: str) -> None:
        with self._lock:
            self.set_aside[frame] = version
            self._why[frame] = why
            self._write_set_aside()

    def _cannot_keep(self, exc: OSError, path: Path | None = None) -> None:
        log.warning(
            "cannot keep %s (%s): a frame that crashes the model's runtime will not be named", shown(path or self._path), exc.strerror or exc
        )

    def holds(self, frame: Path, version: Signature | None) -> bool:
        """Whether this version of `frame` is set aside."""
        return version is not None and self.set_aside.get(str(frame)) == tuple(version)

    def refusal(self, frame: Path) -> str:
        """Why `frame` is set aside, in one line (its error line, its record, an API answer)."""
        return _REFUSALS[self._why.get(str(frame), CRASHED)]

    def hung(self, frame: Path, version: Signature) -> None:
        """The model hung on this version of `frame` and its run is given up: set aside now, kept across restarts."""
        self._put_aside(str(frame), tuple(version), HUNG)

    def forget_hung(self) -> int:
        """Another model is in service: the frames the last one hung on may be tried again; how many."""
        with self._lock:
            hung = [frame for frame, why in self._why.items() if why == HUNG]
            for frame in hung:
                self.set_aside.pop(frame, None)
                self._why.pop(frame, None)
            if hung:
                self._write_set_aside()
        return len(hung)

    def note(self, label: Any, slot: int = 0, stage: str = INFER) -> None:
        """`label` (path, version) is about to be worked on at `stage` by the thread of `slot`; None: that work is over."""
        fd = self._fd if slot == 0 else self._threads_fd
        if fd is None or self._closed or not 0 <= slot < self._slots:
            return
        where = max(0, slot - 1) * _NOTE_BYTES
        try:
            if label is None:
                os.pwrite(fd, bytes(max(1, self._noted.pop(slot, 1))), where)  # an empty note
                return
            frame, version = str(label[0]), tuple(label[1])
            suspect = self._suspects.get(frame)
            ends = suspect[1] if suspect is not None and suspect[0] == version else 0
            data = json.dumps({"frame": frame, "version": list(version), "ends": ends, "stage": stage}).encode() + b"\0"
            if len(data) <= _NOTE_BYTES:  # a longer path is not noted: its frame is mapped all the same
                os.pwrite(fd, data, where)
                self._noted[slot] = max(len(data), self._noted.get(slot, 0))
        except OSError:  # a disk full even for a block it had (copy on write): the frame is mapped all the same
            pass

    def close(self) -> None:
        """A clean stop: no frame was cut off by a crash (main thread, after the engine stopped)."""
        self._closed = True
        if self._crash_file is not None:
            faulthandler.disable()
            self._crash_file.close()
            self._crash_file = None
            try:
                os.unlink(self._crash_path)
            except OSError:
                pass
        fd, self._fd = self._fd, None
        threads_fd, self._threads_fd = self._threads_fd, None
        if threads_fd is not None:
            try:
                os.unlink(self._threads_path)  # while the note is still locked: never another daemon's
            except OSError:
                pass
            os.close(threads_fd)
        if fd is not None:
            try:
                os.unlink(self._path)  # while still locked: never another daemon's note
            except OSError:
                pass
            os.close(fd)

    @staticmethod
    def _read_notes(fd: int) -> list[tuple[str, Signature, int, str]]:
        """What each slot holds: what each thread was working on when the last run ended."""
        notes: list[tuple[str, Signature, int, str]] = []
        where = 0
        while True:
            try:
                block = os.pread(fd, _NOTE_BYTES, where)
            except OSError:
                return notes
            if not block:
                return notes
            where += _NOTE_BYTES
            try:
                data = json.loads(block.split(b"\0", 1)[0] or b"null")
                if data is None:
                    continue
                version = tuple(int(v) for v in data["version"])
                notes.append((str(data["frame"]), version, int(data.get("ends", 0)), str(data.get("stage", INFER))))  # type: ignore[arg-type]
            except (ValueError, KeyError, TypeError):  # half written by a run cut off mid-write
                continue

    def _read_set_aside(self) -> None:
        try:
            entries = json.loads(self._aside_path.read_text())
            kept = {str(e["frame"]): tuple(int(v) for v in e["version"]) for e in entries}
            why = {str(e["frame"]): str(e.get("why", CRASHED)) for e in entries}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        # A frame changed or gone since it was set aside is a frame like any other again.
        self.set_aside = {frame: version for frame, version in kept.items() if signature_of(Path(frame)) == version}  # type: ignore[misc]
        self._why = {frame: why[frame] for frame in self.set_aside}
        if len(self.set_aside) != len(kept):
            self._write_set_aside()

    def _write_set_aside(self) -> None:
        entries = [
            {"frame": frame, "version": list(version), "why": self._why.get(frame, CRASHED)} for frame, version in self.set_aside.items()
        ]
        try:
            if entries:
                atomic_write(self._aside_path, json.dumps(entries).encode())
            else:
                self._aside_path.unlink(missing_ok=True)
        except (OSError, OutputError) as exc:
            log.warning("cannot keep %s (%s)", shown(self._aside_path), getattr(exc, "strerror", None) or exc)
