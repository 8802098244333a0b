"""The scan thread: folders looked through for frames whose depth maps are missing or stale.

A folder moved into the watch brings its files without an event of their
own; a watch folder watched again, or a queue that turned frames away,
needs a look too. Scans run on their own thread (`scan_later`), in order, so
a big folder stalls neither watchdog's thread nor the settler; the daemon's
start-up scan runs on the main thread (`scan_now`). What a scan finds is
handed to the settler like an event, marked as found by a scan. The maps an
earlier `output.template` left match the patterns too, and every scan meets
them all again: a scan sets them aside and says so in one line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cachetools import LRUCache

from depthwatch.frames import ownership
from depthwatch.frames.errorrecords import remove_error_record
from depthwatch.frames.rules import Rules, map_is_current
from depthwatch.logtext import shown
from depthwatch.threadnames import name_this_thread

if TYPE_CHECKING:
    from depthwatch.daemon.supervisor import Slot

log = logging.getLogger("depthwatch.watch")

#: How many finished scans a folder's late subfolder events are checked against.
_SCANNED_KEPT = 64
#: A folder quiet scans stood in a watch for, not scanned this long, is forgotten (seconds).
_POLLED_KEPT_S = 60.0


def _ctime_ns(folder: Path) -> int | None:
    """When `folder` last changed (a rename into the watch counts), or None if it is gone.

    watchdog reports each subfolder of a folder moved in as created, sometimes
    only after that folder's scan has finished; a subfolder unchanged since the
    scan began was covered by it, one made since was not.
    """
    try:
        return os.stat(folder).st_ctime_ns
    except OSError:
        return None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def needs_output(rules: Rules, path: Path) -> bool:
    """Whether the map of `path` is missing or was made from another version of the frame (see `map_is_current`)."""
    try:
        output = rules.output_for(path)
    except Exception:  # an output outside the allowed folders is reported when processed
        return True
    return not map_is_current(path, output)


class Scanner:
    """Scans for frames to map; `found(path)` hands each one to the settler."""

    def __init__(self, rules: Rules, found: Callable[[Path], None], slot: Slot | None = None) -> None:
        """`slot`: the supervisor's record of the scan thread, told which folder it scans."""
        self._slot = slot
        self.rules = rules
        self._found = found
        self._stopping = False
        #: Folders to scan on their own thread (moved in, or watched again), in order -> (moved in, quiet).
        self._scans: dict[Path, tuple[bool, bool]] = {}
        self._scanning: tuple[Path, ...] = ()
        #: Folders moved in and scanned lately -> when their scan began (wall clock, ns).
        self._scanned: LRUCache[Path, int] = LRUCache(_SCANNED_KEPT)
        #: Per folder a quiet scan stands in a watch for: its frames -> the version handed over
        #: (inode, size, mtime), and when it was last scanned. Like an event, only a new or
        #: changed frame is handed over again, so one that failed is not tried (and counted)
        #: again every few seconds. A folder not scanned for a while (watched again, gone) is
        #: forgotten with its frames.
        self._polled: dict[Path, tuple[float, dict[Path, tuple[int, int, int]]]] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="depthwatch-scan", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the scan in progress at its next file, and the thread (see `join`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def scan_later(self, folder: Path, moved_in: bool = False, quiet: bool = False) -> None:
        """Scan `folder` on the scan thread: a big one must stall neither watchdog's
        thread (event delivery) nor the settler (frames dropped elsewhere meanwhile).

        `quiet`: a scan that stands in for a watch (a folder inotify does not watch),
        every few seconds, logs only when it finds frames.
        """
        changed_ns = _ctime_ns(folder) if moved_in else None
        with self._cond:
            if any(folder.is_relative_to(f) for f in (*self._scans, *self._scanning)):
                return  # its subfolders' own events, for a folder whose scan covers them
            if changed_ns is not None and any(
                folder.is_relative_to(f) and changed_ns < began for f, began in self._scanned.items()
            ):
                return  # watchdog's late events for the subfolders of a folder scanned since they came
            self._scans[folder] = (moved_in, quiet)
            self._cond.notify()

    def _loop(self) -> None:
        name_this_thread()
        while True:
            with self._cond:
                while not self._scans and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                folder, (moved_in, quiet) = next(iter(self._scans.items()))
                del self._scans[folder]
                self._scanning = (folder,)
            began_ns = time.time_ns()
            started = time.monotonic()
            if self._slot is not None:
                self._slot.working((folder, ()), "scan")
            try:
                count = self._poll(folder) if quiet else self.scan_now(folder)
            except Exception:  # one odd folder must not end the scans
                log.exception("error scanning %s", shown(folder))
                continue
            finally:
                if self._slot is not None:
                    self._slot.idle()
                with self._cond:
                    self._scanning = ()
                    if moved_in:  # a rescan of a watch folder vouches for no later arrival
                        # Taken out first: `scan_later` reads them all (each read counts as a use),
                        # so their order must stay that of their scans.
                        self._scanned.pop(folder, None)
                        self._scanned[folder] = began_ns
            if not self._stopping and (count or not quiet):
                how = "moved in" if moved_in else "not watched, scanned" if quiet else "scanned again"
                log.info("%s %s: %d frame(s) to map (scanned in %.1f s)", shown(folder), how, count, time.monotonic() - started)

    def scan_now(self, folder: Path | None = None, cancelled: Callable[[], bool] | None = None) -> int:
        """Hand over every frame whose depth map is missing or older than it, before returning; how many.

        `cancelled` is asked between files (the daemon's start-up scan runs on the main
        thread, and a SIGTERM must not wait for a folder of a hundred thousand frames).
        """
        count = 0
        own: list[Path] = []
        for root in [folder] if folder else self.rules.roots:
            for path in self._walk(root):
                if self._stopping or (cancelled is not None and cancelled()):
                    return count
                if not needs_output(self.rules, path):
                    self._tidy(path)
                elif not self.rules.is_clip(path) and ownership.is_depth_map(path):
                    own.append(path)
                else:
                    self._found(path)
                    count += 1
        if len(own) == 1:
            log.warning("%s carries depthwatch's record (a depth map, or an image saved from one); not taken as a frame", shown(own[0]))
        elif own:
            log.warning(
                "%d files carry depthwatch's record (depth maps, or images saved from them), %s among them; not taken as frames",
                len(own), shown(own[0]),
            )
        return count

    def _tidy(self, path: Path) -> None:
        """A frame whose map is current: an error record beside it is older than that map.

        A kill between the map's rename and the record's removal leaves "failed" beside a
        good map, and the next start finds the map current and looks no further: the record
        goes here, or it stays for good.
        """
        if not self.rules.error_records:
            return
        try:
            record = self.rules.error_record_for(path, self.rules.output_for(path))
        except Exception:  # an output outside the allowed folders: nothing of ours beside it
            return
        if record is not None and os.path.lexists(record):
            remove_error_record(record)
            if not os.path.lexists(record):
                log.info("%s: its map is current; removed its error record from before it", shown(path))

    def _poll(self, folder: Path) -> int:
        """A quiet scan standing in for a watch: hand over each frame that needs a map and is new or changed.

        Every few seconds over folders that may hold thousands of frames: a file
        whose version is the one seen last time costs one stat, nothing more.
        """
        now = time.monotonic()
        before = self._polled.get(folder, (now, {}))[1]
        seen: dict[Path, tuple[int, int, int]] = {}  # the files there now: one gone is new if it comes back
        found: list[tuple[int, Path]] = []
        folders = [folder]
        while folders and not self._stopping:
            try:
                entries = list(os.scandir(folders.pop()))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if self.rules.recursive:
                            folders.append(Path(entry.path))
                        continue
                    st = entry.stat()
                except OSError:
                    continue
                path = Path(entry.path)
                version = seen[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
                if before.get(path) != version and self.rules.is_frame(path) and needs_output(self.rules, path):
                    found.append((st.st_mtime_ns, path))
        for _, path in sorted(found):  # in the order they arrived, as a watch hands them over
            self._found(path)
        self._polled[folder] = (now, seen)
        for other in [f for f, (when, _) in self._polled.items() if now - when > _POLLED_KEPT_S]:
            del self._polled[other]  # watched again, or gone: its frames are not kept for ever
        return len(found)

    def _walk(self, root: Path) -> list[Path]:
        found = []
        try:
            if self.rules.recursive:
                for dirpath, _, files in os.walk(root):
                    found.extend(Path(dirpath) / f for f in files)
            else:
                found = [Path(e.path) for e in os.scandir(root) if e.is_file()]
        except OSError:
            return []
        return sorted((p for p in found if self.rules.is_frame(p)), key=_mtime)
