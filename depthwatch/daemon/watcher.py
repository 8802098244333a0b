"""From filesystem events to complete frames: the observer, the settle check, the watch's health.

The watchdog handler only records which path moved; it returns at once. A
"settler" thread then decides when a file is completely written: on Linux a
close-after-write or a move into the folder says so; elsewhere (FSEvents on
macOS merges events and has no close event; polling on network volumes) the
file must stop changing for `settle_ms` and carry its format's end marker.
A file that never completes is reported after `incomplete_timeout_s`, never
turned into a depth map. The same thread notices a watch folder that vanished
(unmounted volume, deleted and recreated) and re-establishes the watch.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from depthwatch.config import WatchConfig
from depthwatch.errors import DepthwatchError
from depthwatch.files import kind_of, link_problem
from depthwatch.frames.job import Signature, signature_from
from depthwatch.frames.reading import open_checked
from depthwatch.frames.rules import Rules, map_is_current
from depthwatch.imaging import formats, video
from depthwatch.logtext import shown
from depthwatch.threadnames import name_this_thread

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
#: Versions already handed over, remembered to drop a second event for the same one:
#: the "closed" that follows a "created" already taken, a repeated FSEvents event, or
#: an event that arrives after a rescan took the file. Such pairs arrive within
#: moments, so a short memory of plain strings keeps RSS flat. A close or move event
#: is never dropped against another close or move: an in-place rewrite of the same
#: size within one clock tick has the same (size, mtime, inode) but is new.
_SEEN_MEMORY = 1024


#: The "format" a clip is handed over with (its completeness judged by `video.is_complete`).
CLIP = "clip"


@dataclass
class _Pending:
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


def _observer_class(kind: str) -> Callable[..., Any]:
    return Observer if kind == "native" else PollingObserver


def _native_observer() -> Any:
    """watchdog's native observer; on Linux one that reports a file moved in from another
    folder as a move (complete at once), not as a creation (maybe still being written)."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux
        return Observer()
    return InotifyObserver(generate_full_events=True)


def trusts_close_events(observer: Any) -> bool:
    """inotify reports close-after-write and moves reliably; others need the settle check."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux
        return False
    return isinstance(observer, InotifyObserver)


class _Handler(FileSystemEventHandler):
    """Runs on watchdog's dispatcher thread: hand the path over and return."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.watcher.on_event(event)


#: watchdog's loggers for inotify: it says only there that the kernel dropped events.
_WATCHDOG_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")
#: A rescan for lost events at most this often.
_LOST_RESCAN_S = 5.0


class _WatchdogLog(logging.Handler):
    """watchdog's own warnings as depthwatch lines; one about lost events (inotify's queue
    overflowed: every event beyond it, a frame's among them, is gone) also starts a rescan."""

    def __init__(self, watcher: Watcher) -> None:
        super().__init__(logging.WARNING)
        self.watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "overflow" in message.lower():
            self.watcher.events_lost()
        else:
            log.log(record.levelno, "watchdog: %s", shown(message))



#: How many finished scans a folder's late subfolder events are checked against.
_SCANNED_KEPT = 64


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
    ) -> None:
        self.rules = rules
        self.config = config
        self._emit = emit
        self._report = report
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Path]] = []
        self._pending: dict[Path, _Pending] = {}
        self._seen: OrderedDict[str, Signature] = OrderedDict()
        self._taken_at_creation: OrderedDict[str, Signature] = OrderedDict()
        #: The version last handed over, per path, whichever way.
        self._handed: OrderedDict[str, Signature] = OrderedDict()
        #: Files under a frame's name that are no regular file, as reported: (inode, type, 0).
        self._special: OrderedDict[str, Signature] = OrderedDict()
        #: Each clip version's verdict (complete, still filling in): its boxes are walked once, not at every settle.
        self._clip_verdicts: OrderedDict[str, tuple[Signature, tuple[bool | None, bool]]] = OrderedDict()
        self._counter = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="depthwatch-settle", daemon=True)
        #: Folders to scan on their own thread (moved in, or watched again), in order.
        self._scans: dict[Path, bool] = {}
        self._scanning: tuple[Path, ...] = ()
        #: Folders moved in and scanned lately -> when their scan began (wall clock, ns).
        self._scanned: OrderedDict[Path, int] = OrderedDict()
        self._scan_cond = threading.Condition()
        self._scanner = threading.Thread(target=self._scan_loop, name="depthwatch-scan", daemon=True)
        self._observer: Any = None
        self._watches: dict[Path, tuple[Any, tuple[int, int]]] = {}
        #: Watch folders that are (or lie under) a symlink -> the folder watched for them: the
        #: observer watches a link itself, not its folder, so it is given the real one, and
        #: its events' paths are put back under the watch folder (see `_as_watched`).
        self._real: dict[Path, Path] = {}
        #: Watch folders whose own deletion was reported: their watch is dead even if a
        #: folder of the same name, and maybe the same inode number, is back.
        self._lost: set[Path] = set()
        self._trust_close = False
        self._handler = _Handler(self)
        self._watchdog_log = _WatchdogLog(self)
        self._last_lost = 0.0
        #: Frames reported as never completed.
        self.incomplete = 0

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        for name in _WATCHDOG_LOGGERS:
            logging.getLogger(name).addHandler(self._watchdog_log)
        self._new_observer()
        for root in self.rules.roots:
            self._watch(root)
        self._thread.start()
        self._scanner.start()

    def stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        with self._scan_cond:
            self._scan_cond.notify_all()
        self._stop_observer(timeout)
        for name in _WATCHDOG_LOGGERS:
            logging.getLogger(name).removeHandler(self._watchdog_log)
        for thread in (self._thread, self._scanner):
            if thread.ident is not None:
                thread.join(timeout)

    def _new_observer(self) -> None:
        cls = _observer_class(self.config.observer)
        if cls is PollingObserver:
            self._observer = PollingObserver(timeout=self.config.poll_interval_ms / 1000)
        else:
            self._observer = _native_observer()
        self._observer.name = "depthwatch-observer"
        self._trust_close = trusts_close_events(self._observer)
        self._observer.start()

    def _stop_observer(self, timeout: float | None = None) -> None:
        observer, self._observer = self._observer, None
        self._watches.clear()
        self._real.clear()
        if observer is not None:
            observer.stop()
            observer.join(timeout)

    def _watch(self, root: Path) -> bool:
        """Start watching `root`; False (and a warning) if it is not there."""
        if not root.is_dir():
            log.warning("watch folder %s does not exist; waiting for it to appear", shown(root))
            return False
        real = Path(os.path.realpath(root))
        self._real.pop(root, None)
        if real != root:
            self._real[root] = real  # before the first event can come
        try:
            watch = self._observer.schedule(self._handler, str(real), recursive=self.rules.recursive)
        except OSError as exc:
            log.warning("cannot watch %s (%s); will retry", shown(root), exc.strerror or exc)
            return False
        st = root.stat()
        self._watches[root] = (watch, (st.st_dev, st.st_ino))
        self._lost.discard(root)
        log.info(
            "watching %s%s for %s%s", shown(root), f" (a link to {shown(real)})" if real != root else "",
            ", ".join(self.rules.patterns), " (recursive)" if self.rules.recursive else "",
        )
        return True

    def _as_watched(self, raw: str | bytes) -> Path:
        """An event's path, under the watch folder it was seen through (a link's folder is watched as itself)."""
        path = Path(os.fsdecode(raw))
        for root, real in tuple(self._real.items()):  # a copy: the settle thread may watch a folder again meanwhile
            if path.is_relative_to(real):
                return root / path.relative_to(real)
        return path

    # -- events (watchdog's thread) ---------------------------------------------------------

    def on_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if kind == "deleted" and event.is_directory:
            folder = self._as_watched(event.src_path)
            if folder in self._watches:
                self._lost.add(folder)  # the health check watches it again once it is back
            return
        if kind in ("opened", "closed_no_write", "deleted"):
            return
        raw = getattr(event, "dest_path", "") if kind == "moved" else event.src_path
        if not raw:
            return  # moved out of the watched folders
        path = self._as_watched(raw)
        if event.is_directory:
            if kind in ("created", "moved"):
                if self.rules.is_frame(path):
                    self.poke(path, Mode.NOW)  # a folder under a frame's name: the settler reports it
                if self.rules.recursive:
                    self.scan_later(path, moved_in=True)  # files moved in with a folder raise no events of their own
            return
        if not self.rules.is_frame(path):
            return
        if self._trust_close:
            if kind in ("closed", "moved"):
                self.poke(path, Mode.NOW)
            elif kind == "created":
                self.poke(path, Mode.CREATED)
            return  # modified: the close event will follow
        self.poke(path, Mode.SETTLE)

    # -- the settler -----------------------------------------------------------------

    def poke(self, path: Path, mode: Mode = Mode.SETTLE, delay: float = 0.0, scanned: bool = False) -> None:
        """Check `path` soon; repeated pokes for one path collapse into one check."""
        now = time.monotonic()
        with self._cond:
            state = self._pending.get(path)
            if state is None:
                state = self._pending[path] = _Pending(mode, now + delay, now, scanned=scanned)
            else:
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
        """Scan `folder` on the scan thread: a big one must stall neither watchdog's
        thread (event delivery) nor the settler (frames dropped elsewhere meanwhile)."""
        changed_ns = _ctime_ns(folder) if moved_in else None
        with self._scan_cond:
            if any(folder.is_relative_to(f) for f in (*self._scans, *self._scanning)):
                return  # its subfolders' own events, for a folder whose scan covers them
            if changed_ns is not None and any(
                folder.is_relative_to(f) and changed_ns < began for f, began in self._scanned.items()
            ):
                return  # watchdog's late events for the subfolders of a folder scanned since they came
            self._scans[folder] = moved_in
            self._scan_cond.notify()

    def _scan_loop(self) -> None:
        name_this_thread()
        while True:
            with self._scan_cond:
                while not self._scans and not self._stopping:
                    self._scan_cond.wait()
                if self._stopping:
                    return
                folder, moved_in = next(iter(self._scans.items()))
                del self._scans[folder]
                self._scanning = (folder,)
            began_ns = time.time_ns()
            started = time.monotonic()
            try:
                count = self.scan_now(folder)
            except Exception:  # one odd folder must not end the scans
                log.exception("error scanning %s", shown(folder))
                continue
            finally:
                with self._scan_cond:
                    self._scanning = ()
                    if moved_in:  # a rescan of a watch folder vouches for no later arrival
                        self._scanned[folder] = began_ns
                        self._scanned.move_to_end(folder)
                        while len(self._scanned) > _SCANNED_KEPT:
                            self._scanned.popitem(last=False)
            if not self._stopping:
                how = "moved in" if moved_in else "scanned again"
                log.info("%s %s: %d frame(s) to map (scanned in %.1f s)", shown(folder), how, count, time.monotonic() - started)

    def scan_now(self, folder: Path | None = None, cancelled: Callable[[], bool] | None = None) -> int:
        """Queue every frame whose depth map is missing or older than it; returns how many.

        `cancelled` is asked between files (the daemon's start-up scan runs on the main
        thread, and a SIGTERM must not wait for a folder of a hundred thousand frames).
        """
        count = 0
        for root in [folder] if folder else self.rules.roots:
            for path in self._walk(root):
                if self._stopping or (cancelled is not None and cancelled()):
                    return count
                if self._needs_output(path):
                    self.poke(path, Mode.SETTLE, scanned=True)
                    count += 1
        return count

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

    def _needs_output(self, path: Path) -> bool:
        """Whether the map is missing or was made from another version of the frame (see `map_is_current`)."""
        try:
            output = self.rules.output_for(path)
        except Exception:  # an output outside the allowed folders is reported when processed
            return True
        return not map_is_current(path, output)

    def _loop(self) -> None:
        name_this_thread()
        next_health = time.monotonic() + _HEALTH_INTERVAL
        while True:
            due: list[tuple[Path, _Pending]] = []
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
                self._check_health()
                next_health = time.monotonic() + _HEALTH_INTERVAL

    def _again(self, path: Path, state: _Pending, delay: float) -> None:
        with self._cond:
            current = self._pending.get(path)
            if current is not None:  # a newer event came in meanwhile: keep the earlier check
                current.since = min(current.since, state.since)
                current.first, current.told = min(current.first, state.first), current.told or state.told
                return
            state.due = time.monotonic() + delay
            self._pending[path] = state
            heapq.heappush(self._heap, (state.due, next(self._counter), path))

    def _check(self, path: Path, state: _Pending) -> None:
        if not self.rules.link_allowed(path):
            problem = link_problem(path)
            self._report(
                path, problem or "a symlink to outside the watch folder; not followed (set watch.follow_symlinks to allow it)"
            )
            return
        problem = (link_problem(path) or _kernel_file(path)) if os.path.islink(path) else None
        if problem:  # a link that may be followed, to nothing, in a loop, or to a kernel file
            self._report(path, problem)
            return
        try:
            st = os.stat(path)
        except OSError:
            return  # vanished: nothing to do
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
        if state.late and state.mode == Mode.SETTLE and self._handed.get(str(path)) == signature:
            return  # the write's own event came and took it
        if video.is_clip_name(path):  # a whole clip: its boxes add up, with its index in them
            fmt, (complete, filling) = CLIP, self._clip_state(path, signature, st.st_size)
            if filling and state.mode != Mode.NOW and (state.mode != Mode.SETTLE or now - state.since < self.config.incomplete_timeout_s):
                # Whole in structure, its data still zeros at the end: a copy that set the full size
                # first and is filling it in. Closed (or moved in), or unchanged for the incomplete
                # timeout, it is taken as it is: a clip whose data ends in zeros is not refused.
                complete = False
        else:
            fmt, complete = _probe(path, st.st_size)
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
                    f"still incomplete after {self.config.incomplete_timeout_s:g} s ({_what_is_missing(fmt)}); "
                    "not processed until it is written again",
                )
                return
            state.mode, state.signature = Mode.SETTLE, signature
            self._again(path, state, max(settle, 0.05))
            return
        if (state.scanned or state.mode == Mode.CREATED) and not self._needs_output(path):
            # Found by a scan, its map written since; or "created" with a map of this very
            # version: watchdog reports each file of a folder moved in as created, and a
            # finished shot moved into the watch needs nothing. A file really created new
            # has no such map (its record names another inode or mtime).
            return
        key = str(path)
        if state.mode == Mode.NOW:
            if self._taken_at_creation.pop(key, None) == signature or self._seen.get(key) == signature:
                # The close of the very write taken when it appeared, or a late event for a
                # version a scan already took; that one had settled, so a rewrite since
                # would carry a later mtime.
                return
        elif state.mode == Mode.CREATED:
            _remember(self._taken_at_creation, key, signature)
        elif self._seen.get(key) == signature:
            return  # this exact version was already handed over
        else:
            _remember(self._seen, key, signature)
        _remember(self._handed, key, signature)
        self._emit(path, signature, fmt)

    def _clip_state(self, path: Path, signature: Signature, size: int) -> tuple[bool | None, bool]:
        """`_clip_state`, kept per version: a crafted clip costs one bounded walk, not one at every settle."""
        key = str(path)
        kept = self._clip_verdicts.get(key)
        if kept is not None and kept[0] == signature:
            return kept[1]
        verdict = _clip_state(path, size)
        self._clip_verdicts[key] = (signature, verdict)
        self._clip_verdicts.move_to_end(key)
        if len(self._clip_verdicts) > _SEEN_MEMORY:
            self._clip_verdicts.popitem(last=False)
        return verdict

    def _not_a_file(self, path: Path, st: os.stat_result) -> None:
        """A FIFO, folder, socket or device under a frame's name: one report per file, never read."""
        key, what = str(path), (st.st_ino, stat.S_IFMT(st.st_mode), 0)
        if self._special.get(key) == what:
            return  # this very file was reported already (a write to a FIFO raises events too)
        _remember(self._special, key, what)
        self._report(path, f"is {kind_of(st.st_mode)}, not an image file; not read")

    def forget(self, path: Path) -> None:
        """Let the next event for `path` through even if the file looks unchanged (retries)."""
        self._seen.pop(str(path), None)
        self._taken_at_creation.pop(str(path), None)
        self._handed.pop(str(path), None)

    def _check_health(self) -> None:
        observer = self._observer
        if observer is None or not observer.is_alive():
            log.warning("the file watcher stopped; restarting it")
            self._stop_observer(1.0)
            self._new_observer()
        for root in self.rules.roots:
            current = self._watches.get(root)
            try:
                st = root.stat()
                ino = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
            except OSError:
                ino = None
            if current is not None and current[1] == ino and root not in self._lost:
                continue
            if current is not None:
                log.warning("watch folder %s disappeared or was replaced; watching it again when it is back", shown(root))
                try:
                    self._observer.unschedule(current[0])
                except Exception:  # the emitter may already be gone with its folder
                    pass
                del self._watches[root]
                self._real.pop(root, None)
            if ino is not None and self._watch(root):
                self.scan_later(root)


#: Where the kernel's own files are (Linux): their size is no measure of what a read gives, so
#: a frame read from one would look as if it changed while being read, and go unreported.
_KERNEL_FOLDERS = ("/proc", "/sys")


def _kernel_file(link: Path) -> str | None:
    """Why a symlink to a kernel file (`/proc/cpuinfo`, `/sys/...`) is not read, or None."""
    real = os.path.realpath(link)
    if any(real == top or real.startswith(top + "/") for top in _KERNEL_FOLDERS):
        return f"a symlink to {real!r}, a file of the kernel's, not an image file; not read"
    return None


def _remember(memory: OrderedDict[str, Signature], key: str, signature: Signature) -> None:
    memory[key] = signature
    memory.move_to_end(key)
    if len(memory) > _SEEN_MEMORY:
        memory.popitem(last=False)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _what_is_missing(fmt: str | None) -> str:
    if fmt == CLIP:
        return "a clip cut short, or without its index"
    if fmt == formats.EXR:
        return "not every chunk its offset table lists is there"
    return "no end marker"


def _probe(path: Path, size: int) -> tuple[str | None, bool | None]:
    """The file's format by its magic bytes, and whether it carries the format's end marker
    (an EXR: every chunk its offset table lists).

    (None, None): not an image depthwatch reads (the pipeline says why); (None,
    True): unreadable, taken at once so the pipeline reports why. (fmt, None):
    the format has no end marker (TIFF): settled is all we know.
    """
    try:
        # Without blocking: a FIFO swapped in since the stat must not stall this thread.
        fd, _ = open_checked(path, max_bytes=1 << 62)
    except DepthwatchError:
        return None, True  # unreadable or not a file: let the pipeline report why
    try:
        fmt = formats.sniff(os.pread(fd, 16, 0))
        if fmt is None:
            return None, None
        # An EXR's header and offset table are read too (bounded), to see every chunk is there.
        return fmt, formats.is_complete_at(fmt, lambda offset, n: os.pread(fd, n, offset), size)
    except OSError:
        return None, True
    finally:
        os.close(fd)


def _clip_state(path: Path, size: int) -> tuple[bool | None, bool]:
    """`video.state_at` of a clip: whether its structure is whole, and whether its data still ends in zeros."""
    try:
        fd, _ = open_checked(path, max_bytes=1 << 62)  # without blocking, as `_probe`
    except DepthwatchError:
        return True, False  # unreadable or not a file: let the job report why
    try:
        return video.state_at(lambda offset, n: os.pread(fd, n, offset), size)
    except OSError:
        return True, False
    finally:
        os.close(fd)
