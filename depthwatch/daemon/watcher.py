"""From filesystem events to complete frames: the settle check, the watcher's state machine.

The watchdog handler only records which path moved; it returns at once. A
"settler" thread then decides when a file is completely written: on Linux a
close-after-write or a move into the folder says so; elsewhere (FSEvents on
macOS merges events and has no close event; polling on network volumes) the
file must stop changing for `settle_ms` and carry its format's end marker.
A file that never completes is reported after `incomplete_timeout_s`, never
turned into a depth map. The same thread looks after the watch folders'
health (`watches`); folders are scanned on a thread of their own (`scanner`);
what a file's bytes say is read by `probing`; the observer is `observer`'s.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING

from cachetools import LRUCache
from watchdog.events import FileSystemEvent

from depthwatch.config import WatchConfig
from depthwatch.daemon.observer import EventHandler, WatchdogLog
from depthwatch.daemon.probing import CLIP, clip_state, kernel_file, probe, what_is_missing
from depthwatch.daemon.scanner import Scanner, needs_output
from depthwatch.daemon.watches import WatchFolders
from depthwatch.files import kind_of, link_problem
from depthwatch.frames.job import Signature, signature_from
from depthwatch.frames.rules import Rules
from depthwatch.logtext import shown
from depthwatch.media import video
from depthwatch.threadnames import name_this_thread

if TYPE_CHECKING:
    from depthwatch.daemon.supervisor import Slot

log = logging.getLogger("depthwatch.watch")


class Mode(IntEnum):
    """How a file is judged complete; of two events for one file, the higher mode wins.

    SETTLE: no event can be trusted (FSEvents, polling): it must stop changing for settle_ms.
    WAIT: being written (seen created, no end marker yet): its close event decides, or the
      incomplete timeout reports it.
    CREATED: inotify saw it appear. A file moved in from another folder shows only this,
      so it is taken at once if its end marker is there; otherwise it is being written (WAIT).
    NOW: a close-after-write or a move said so (only a missing end marker makes it wait).
    """

    SETTLE = 0
    WAIT = 1
    CREATED = 2
    NOW = 3


_HEALTH_INTERVAL = 1.0
#: A file that cannot be looked at (permission denied) is looked at again after these pauses.
_DENIED_FIRST_S = 1.0
_DENIED_LONGEST_S = 60.0
#: Versions already handed over, remembered to drop a second event for the same one:
#: the "closed" that follows a "created" already taken, a repeated FSEvents event, or
#: an event that arrives after a rescan took the file. Such pairs arrive within
#: moments, so a short memory of plain strings keeps RSS flat. A close or move event
#: is never dropped against another close or move: an in-place rewrite of the same
#: size within one clock tick has the same (size, mtime, inode) but is new.
_SEEN_MEMORY = 1024
#: A rescan for lost events at most this often.
_LOST_RESCAN_S = 5.0


@dataclass
class _Settling:
    """One path waiting for the settle check: how it is judged, when it is due, what was seen of it."""

    mode: Mode
    due: float
    since: float
    signature: Signature | None = None
    #: Found by a scan, not an event: its depth map may have been written meanwhile.
    scanned: bool = False
    #: Wall-clock time (ns) of the latest event for it, to compare with the file's mtime.
    event_ns: int = 0
    #: Its event came before the file's last write (see `_check`): it only stands in for
    #: that write's own event, in case none comes.
    late: bool = False
    #: When it was first seen (never reset), and whether "still growing" was said (clips).
    first: float = field(default_factory=time.monotonic)
    told: bool = False
    #: Its latest event was a move (renamed into place whole), not a close.
    moved: bool = False
    #: Seconds until the next look while it cannot be looked at (permission denied); 0: it can.
    denied: float = 0.0


class Watcher:
    """Watches the configured folders and calls `emit(path, signature, format)` once per complete frame.

    `format` is what the file's magic bytes say (its end marker seen, where the
    format has one), or None for a file that is no image depthwatch reads: the
    pipeline reports why.

    Files that never complete, and links it will not follow, go to `report(path, reason)`.
    """

    def __init__(
        self,
        rules: Rules,
        config: WatchConfig,
        emit: Callable[[Path, Signature, str | None], None],
        report: Callable[[Path, str], None],
        slot: Slot | None = None,
        scan_slot: Slot | None = None,
    ) -> None:
        """`slot`, `scan_slot`: the supervisor's records of the settle and scan threads, told what they look at."""
        self._slot = slot
        self.rules = rules
        self.config = config
        self._emit = emit
        self._report = report
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Path]] = []
        self._pending: dict[Path, _Settling] = {}
        #: The memories below are read and written by the settle thread, and `forget` (worker
        #: and main threads) takes from them: one lock, since an LRUCache is not thread-safe.
        self._memory = threading.Lock()
        self._seen: LRUCache[str, Signature] = LRUCache(_SEEN_MEMORY)
        self._taken_at_creation: LRUCache[str, Signature] = LRUCache(_SEEN_MEMORY)
        #: The version last handed over, per path, whichever way.
        self._handed: LRUCache[str, Signature] = LRUCache(_SEEN_MEMORY)
        #: Files under a frame's name that are no regular file, as reported: (inode, type, 0).
        self._special: LRUCache[str, Signature] = LRUCache(_SEEN_MEMORY)
        #: Each clip version's verdict (complete, still filling in): its boxes are walked once, not at every settle.
        self._clip_verdicts: LRUCache[str, tuple[Signature, tuple[bool | None, bool]]] = LRUCache(_SEEN_MEMORY)
        self._counter = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="depthwatch-settle", daemon=True)
        self._scanner = Scanner(rules, lambda path: self.poke(path, Mode.SETTLE, scanned=True), scan_slot)
        self._folders = WatchFolders(rules, config, EventHandler(self.on_event), self._scanner.scan_later)
        self._watchdog_log = WatchdogLog(self.events_lost)
        self._last_lost = 0.0
        #: Frames reported as never completed.
        self.incomplete = 0

    @property
    def waiting_for(self) -> list[Path]:
        """Watch folders that are gone (or not there yet): watched again once they are back."""
        return self._folders.waiting_for

    @property
    def unwatched(self) -> dict[Path, list[Path]]:
        """Recursive watch folders -> the folders under them inotify does not watch (scanned instead)."""
        return dict(self._folders.unwatched)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._watchdog_log.attach()
        self._folders.start()
        self._thread.start()
        self._scanner.start()

    def stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._scanner.stop()
        self._folders.stop(timeout)
        self._watchdog_log.detach()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self._scanner.join(timeout)

    # -- events (watchdog's thread) ---------------------------------------------------------

    def on_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if kind == "deleted" and event.is_directory:
            self._folders.lost(self._folders.as_watched(event.src_path))
            return
        if kind in ("opened", "closed_no_write", "deleted"):
            return
        raw = getattr(event, "dest_path", "") if kind == "moved" else event.src_path
        if not raw:
            return  # moved out of the watched folders
        path = self._folders.as_watched(raw)
        if event.is_directory:
            if kind in ("created", "moved"):
                self._folders.folder_came()
                if self.rules.is_frame(path) and not self.rules.recursive:
                    self.poke(path, Mode.NOW)  # a folder under a frame's name: the settler reports it (recursive: a folder to look in)
                if self.rules.recursive and not self.rules.is_own_file(path):  # not a sequence depthwatch writes
                    self.scan_later(path, moved_in=True)  # files moved in with a folder raise no events of their own
            return
        if not self.rules.is_frame(path):
            return
        if self._folders.trust_close:
            if kind in ("closed", "moved"):
                self.poke(path, Mode.NOW, moved=kind == "moved")
            elif kind == "created":
                self.poke(path, Mode.CREATED)
            return  # modified: the close event will follow
        self.poke(path, Mode.SETTLE, moved=kind == "moved")

    # -- the settler -----------------------------------------------------------------

    def poke(self, path: Path, mode: Mode = Mode.SETTLE, delay: float = 0.0, scanned: bool = False, moved: bool = False) -> None:
        """Check `path` soon; repeated pokes for one path collapse into one check."""
        now = time.monotonic()
        with self._cond:
            state = self._pending.get(path)
            if state is None:
                state = self._pending[path] = _Settling(mode, now + delay, now, scanned=scanned, moved=moved)
            else:
                state.moved = moved
                state.mode = max(mode, state.mode)
                state.due = min(state.due, now + delay)
                state.scanned = state.scanned and scanned
                state.late = state.late and mode == Mode.SETTLE
            state.event_ns = time.time_ns()
            heapq.heappush(self._heap, (state.due, next(self._counter), path))
            self._cond.notify()

    def events_lost(self) -> None:
        """The kernel dropped file events (watchdog's thread): scan every watch folder again, soon."""
        now = time.monotonic()
        if now - self._last_lost < _LOST_RESCAN_S:
            return
        self._last_lost = now
        log.warning("file events were lost (the kernel's inotify queue overflowed); rescanning the watch folders")
        for root in self.rules.roots:
            self.scan_later(root)

    def scan_later(self, folder: Path, moved_in: bool = False) -> None:
        """Scan `folder` on the scan thread (see `Scanner.scan_later`)."""
        self._scanner.scan_later(folder, moved_in)

    def scan_now(self, folder: Path | None = None, cancelled: Callable[[], bool] | None = None) -> int:
        """Queue every frame whose depth map is missing or older than it, before returning; how many.

        `cancelled` is asked between files (the daemon's start-up scan runs on the main
        thread, and a SIGTERM must not wait for a folder of a hundred thousand frames).
        """
        return self._scanner.scan_now(folder, cancelled)

    def _loop(self) -> None:
        name_this_thread()
        next_health = time.monotonic() + _HEALTH_INTERVAL
        while True:
            due: list[tuple[Path, _Settling]] = []
            with self._cond:
                while not self._stopping:
                    now = time.monotonic()
                    while self._heap and self._heap[0][0] <= now:
                        _, _, path = heapq.heappop(self._heap)
                        state = self._pending.get(path)
                        if state is not None and state.due <= now:
                            del self._pending[path]
                            due.append((path, state))
                    if due or now >= next_health:
                        break
                    wait = next_health - now
                    if self._heap:
                        wait = min(wait, self._heap[0][0] - now)
                    self._cond.wait(max(wait, 0.001))
                if self._stopping:
                    return
            for path, state in due:
                try:
                    self._check(path, state)
                except Exception:  # one odd file must not stop the watch
                    log.exception("error checking %s", shown(path))
            if time.monotonic() >= next_health:
                self._folders.check_health()
                next_health = time.monotonic() + _HEALTH_INTERVAL

    def _again(self, path: Path, state: _Settling, delay: float) -> None:
        with self._cond:
            current = self._pending.get(path)
            if current is not None:  # a newer event came in meanwhile: keep the earlier check
                current.since = min(current.since, state.since)
                current.first, current.told = min(current.first, state.first), current.told or state.told
                return
            state.due = time.monotonic() + delay
            self._pending[path] = state
            heapq.heappush(self._heap, (state.due, next(self._counter), path))

    def _check(self, path: Path, state: _Settling) -> None:
        if self._slot is not None:
            self._slot.working((path, ()), "settle")
        try:
            self._look(path, state)
        except PermissionError as exc:
            # Its folder cannot be searched for now (a share's permissions being fixed up, a
            # chmod): not a reason to drop the frame for good. Said once, looked at again
            # with growing pauses, mapped once it can be read.
            if not state.denied:
                log.warning(
                    "%s: cannot be looked at (%s; its folder's permissions?); looked at again until it can be",
                    shown(path), exc.strerror or "permission denied",
                )
            state.denied = min(_DENIED_LONGEST_S, max(_DENIED_FIRST_S, state.denied * 2))
            self._again(path, state, state.denied)
        finally:
            if self._slot is not None:
                self._slot.idle()

    def _look(self, path: Path, state: _Settling) -> None:
        if not self.rules.link_allowed(path):
            problem = link_problem(path)
            self._report(
                path, problem or "a symlink to outside the watch folder; not followed (set watch.follow_symlinks to allow it)"
            )
            return
        problem = (link_problem(path) or kernel_file(path)) if os.path.islink(path) else None
        if problem:  # a link that may be followed, to nothing, in a loop, or to a kernel file
            self._report(path, problem)
            return
        try:
            st = os.stat(path)
        except PermissionError:
            raise
        except OSError:
            return  # vanished: nothing to do
        if state.denied:
            log.info("%s: can be looked at again", shown(path))
            state.denied = 0.0
        if not stat.S_ISREG(st.st_mode):
            self._not_a_file(path, st)
            return
        signature = signature_from(st)
        settle = self.config.settle_ms / 1000
        now = time.monotonic()
        if st.st_size == 0 and state.mode in (Mode.CREATED, Mode.WAIT) and video.is_clip_name(path):
            # A clip's copy just begun (every copy starts empty): its close decides, as below.
            state.mode, state.signature, state.since = Mode.WAIT, signature, now
            self._again(path, state, self.config.incomplete_timeout_s)
            return
        if st.st_size == 0 and (state.mode != Mode.SETTLE or signature != state.signature):
            # Empty: most likely truncated for an in-place rewrite whose own event follows (this
            # event was for the version before). Only one that stays empty is a frame (a bad one).
            state.mode, state.signature = Mode.SETTLE, signature
            self._again(path, state, max(settle, 0.05))
            return
        if st.st_size == 0 and not state.moved and not video.is_clip_name(path):
            # Still empty, and not renamed into place whole: its writer may have truncated it,
            # closed it and opened it again to write it later (ImageMagick does, and encodes a 4K
            # plate for seconds in between: "the file is empty" would be a false failure). Its next
            # close decides; one that stays empty is reported at the incomplete timeout.
            waited = now - state.since
            if waited < self.config.incomplete_timeout_s:
                self._again(path, state, min(self.config.incomplete_timeout_s - waited, 1.0))
                return
            self.incomplete += 1
            self._report(
                path, f"the file is empty (0 bytes) {self.config.incomplete_timeout_s:g} s after it was written; "
                "not processed until it is written again",
            )
            return
        if state.mode in (Mode.SETTLE, Mode.WAIT) and signature != state.signature:
            if state.signature is not None and not state.told and now - state.first >= self.config.incomplete_timeout_s and video.is_clip_name(path):
                state.told = True  # a long copy, or a recording still going: say so once, keep waiting
                log.warning(
                    "%s: still growing after %.0f s; it becomes a clip job once it is complete", shown(path), now - state.first
                )
            state.signature = signature
            state.since = now  # it changed: the incomplete clock starts again
            self._again(path, state, settle if state.mode == Mode.SETTLE else self.config.incomplete_timeout_s)
            return
        if state.mode == Mode.NOW and st.st_mtime_ns > state.event_ns:
            # Written again after this close or move was reported (a busy machine checks late):
            # that write's own event follows and takes it. Taking it now as well would run one
            # version twice; if no event comes (a clock step), settling takes it instead.
            state.mode, state.signature, state.late = Mode.SETTLE, signature, True
            self._again(path, state, max(settle, 0.05))
            return
        if state.late and state.mode == Mode.SETTLE and self._handed_last(path) == signature:
            return  # the write's own event came and took it
        if video.is_clip_name(path):  # a whole clip: its boxes add up, with its index in them
            fmt, (complete, filling) = CLIP, self._clip_state(path, signature, st.st_size)
            renamed = state.mode == Mode.NOW and state.moved  # renamed into place: whole as it is
            if filling and not renamed and (state.mode != Mode.SETTLE or now - state.since < self.config.incomplete_timeout_s):
                # Whole in structure, its data still zeros where it is not written yet: a copy that set
                # the full size first and is filling it in, closing it after each piece as some copiers
                # do (a close is no end). Unchanged for the incomplete timeout, it is taken as it is: a
                # clip whose data ends in zeros is not refused.
                complete = False
        else:
            fmt, complete = probe(path, st.st_size)
        if state.mode == Mode.CREATED and complete is not True:
            # Being written: its close event decides; if none comes, report it at the timeout.
            state.mode, state.signature, state.since = Mode.WAIT, signature, now
            self._again(path, state, self.config.incomplete_timeout_s)
            return
        if complete is False:
            if signature != state.signature:
                state.since = now  # written since the last look: the incomplete clock starts again
            if state.mode == Mode.WAIT and fmt == CLIP:
                # No close yet: the copier still has it open (one that pauses, or fills in a file
                # it preallocated), and a copier that dies is closed by the kernel. Not a failure.
                if not state.told:
                    state.told = True
                    log.warning(
                        "%s: still being copied after %.0f s (not whole yet, still open for writing); "
                        "it becomes a clip job once it is complete", shown(path), now - state.first,
                    )
                state.signature = signature
                self._again(path, state, self.config.incomplete_timeout_s)
                return
            if now - state.since >= self.config.incomplete_timeout_s:
                self.incomplete += 1
                self._report(
                    path,
                    f"still incomplete after {self.config.incomplete_timeout_s:g} s ({what_is_missing(fmt)}); "
                    "not processed until it is written again",
                )
                return
            state.mode, state.signature = Mode.SETTLE, signature
            self._again(path, state, max(settle, 0.05))
            return
        if (state.scanned or state.mode == Mode.CREATED) and not needs_output(self.rules, path):
            # Found by a scan, its map written since; or "created" with a map of this very
            # version: watchdog reports each file of a folder moved in as created, and a
            # finished shot moved into the watch needs nothing. A file really created new
            # has no such map (its record names another inode or mtime).
            return
        if self._hand_over(str(path), state.mode, signature):
            self._emit(path, signature, fmt)  # outside the lock: a full queue has the daemon `forget` it

    def _hand_over(self, key: str, mode: Mode, signature: Signature) -> bool:
        """Whether this version of a complete file is handed over now (and remember it if so)."""
        with self._memory:
            if mode == Mode.NOW:
                if self._taken_at_creation.pop(key, None) == signature or self._seen.get(key) == signature:
                    # The close of the very write taken when it appeared, or a late event for a
                    # version a scan already took; that one had settled, so a rewrite since
                    # would carry a later mtime.
                    return False
            elif mode == Mode.CREATED:
                self._taken_at_creation[key] = signature
            elif self._seen.get(key) == signature:
                return False  # this exact version was already handed over
            else:
                self._seen[key] = signature
            self._handed[key] = signature
            return True

    def _clip_state(self, path: Path, signature: Signature, size: int) -> tuple[bool | None, bool]:
        """`probing.clip_state`, kept per version (settle thread only): a crafted clip costs one bounded walk, not one at every settle."""
        key = str(path)
        kept = self._clip_verdicts.get(key)
        if kept is not None and kept[0] == signature:
            return kept[1]
        verdict = clip_state(path, size)
        self._clip_verdicts[key] = (signature, verdict)
        return verdict

    def _not_a_file(self, path: Path, st: os.stat_result) -> None:
        """A FIFO, folder, socket or device under a frame's name: one report per file, never read."""
        if stat.S_ISDIR(st.st_mode) and self.rules.recursive:
            return  # in a recursive watch a folder is where frames go, never a frame
        key, what = str(path), (st.st_ino, stat.S_IFMT(st.st_mode), 0)
        if self._special.get(key) == what:
            return  # this very file was reported already (a write to a FIFO raises events too)
        self._special[key] = what  # settle thread only
        self._report(path, f"is {kind_of(st.st_mode)}, not an image file; not read")

    def forget(self, path: Path) -> None:
        """Let the next event for `path` through even if the file looks unchanged (retries)."""
        with self._memory:
            self._seen.pop(str(path), None)
            self._taken_at_creation.pop(str(path), None)
            self._handed.pop(str(path), None)

    def _handed_last(self, path: Path) -> Signature | None:
        """The version of `path` last handed over, if it is still remembered."""
        with self._memory:
            return self._handed.get(str(path))

