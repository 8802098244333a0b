"""Frames whose map could not be written after every try, kept until their folder can be written.

A full disk or a read-only folder outlasts the daemon's few quick retries
(`daemon.retries`). Dropping the frame then would leave the old map showing
the previous frame for good, so each such frame is parked under its output
folder. The folder is looked at again with growing pauses (two seconds, then
up to a minute): once it looks writable (free space for the map, write
permission), or once another map was written there, its frames go back to the
watcher and get their tries again. Nothing is written to look.

A folder that looks writable and still cannot take the map (a disk with room
for a small file but not for this 16-bit map, a quota, a flaky share) keeps
its grown pause when its frames come back: only a map written there starts
the pauses again from two seconds. (Were every hand-back to start them
again, such a frame would be tried every five seconds for good.)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: First pause before a folder is looked at again, and the longest.
FIRST_LOOK_S = 2.0
LONGEST_LOOK_S = 60.0
#: Frames kept at most (each is one path; a flood of failures must not grow memory).
MOST_PARKED = 10_000
#: Free space a folder must have to look writable: twice its largest parked frame, at least this.
LEAST_ROOM_BYTES = 64 * 1024
#: A folder whose frames all went back is remembered this long (its pause with it).
FORGET_AFTER_S = 10 * LONGEST_LOOK_S


@dataclass
class _Folder:
    sources: set[Path] = field(default_factory=set)
    pause: float = FIRST_LOOK_S
    next_look: float = 0.0
    room: int = LEAST_ROOM_BYTES


def looks_writable(folder: Path, room: int) -> bool:
    """Whether `folder` has free space and write permission now (a cheap look, no write).

    A folder not there yet is looked at in its parent, where it would be made
    (a cache drive back without it).
    """
    if not folder.is_dir() and folder.parent.is_dir():
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= room and os.access(folder, os.W_OK | os.X_OK)


class Parked:
    """Parked frames, by output folder; thread-safe (workers park, the main loop takes them back)."""

    def __init__(self) -> None:
        self._folders: dict[Path, _Folder] = {}
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def park(self, folder: Path, source: Path) -> bool:
        """Keep `source` until `folder` can be written; False when full (then it is only reported)."""
        try:
            room = 2 * os.stat(source).st_size  # a map is rarely larger than its frame
        except OSError:
            room = 0
        with self._lock:
            entry = self._folders.setdefault(folder, _Folder())
            entry.room = max(entry.room, room)
            if source in entry.sources:
                return True
            if self._count >= MOST_PARKED:
                return False
            entry.sources.add(source)
            self._count += 1
            now = time.monotonic()
            if entry.next_look <= now:  # new, or its frames went back and failed again: the grown pause
                entry.next_look = now + entry.pause
            return True

    def written(self, folder: Path, source: Path) -> None:
        """`source`'s map was written in `folder`: it is done, and the folder's others are looked at at once."""
        with self._lock:
            entry = self._folders.get(folder)
            if entry is None:
                return
            if source in entry.sources:
                entry.sources.discard(source)
                self._count -= 1
            if not entry.sources:  # nothing waits there: forgotten, its pauses start again
                del self._folders[folder]
                return
            entry.next_look = time.monotonic()
            entry.pause = FIRST_LOOK_S
            entry.room = LEAST_ROOM_BYTES

    def due(self) -> tuple[list[Path], list[Path]]:
        """(the parked frames of the folders that look writable now, those found gone), both taken out of the lot.

        A folder that does not look writable is looked at again after a longer
        pause; so is one whose frames come back here (it looked writable, but
        writing failed again): its entry, with its pause, stays until a map is
        written there (`written`) or it has had no frame for FORGET_AFTER_S. A
        frame deleted meanwhile (a render cleared to make room) is no longer
        waiting: it is dropped, not counted as waiting and kept for good while
        its folder stays unwritable.
        """
        now = time.monotonic()
        with self._lock:
            looks = [(folder, entry, list(entry.sources)) for folder, entry in self._folders.items() if entry.sources and entry.next_look <= now]
        taken: list[Path] = []
        gone: list[Path] = []
        for folder, entry, sources in looks:
            # Deleted: its folder is there, the frame is not (a share that is away hides both: kept).
            missing = {source for source in sources if not os.path.lexists(source) and os.path.isdir(source.parent)}
            ok = looks_writable(folder, entry.room)
            with self._lock:
                missing &= entry.sources
                entry.sources -= missing
                self._count -= len(missing)
                gone.extend(missing)
                entry.next_look = now + entry.pause
                entry.pause = min(LONGEST_LOOK_S, entry.pause * 2)
                if ok:
                    taken.extend(entry.sources)
                    self._count -= len(entry.sources)
                    entry.sources = set()
        with self._lock:
            for folder in [f for f, e in self._folders.items() if not e.sources and now - e.next_look > FORGET_AFTER_S]:
                del self._folders[folder]
        return taken, gone
