"""What the daemon's status file says, kept current: the model in service, the queue, the clip in progress.

The parts of the daemon change the `Status` in memory and `touch` it; the
main loop writes the file (an fsync each time) only when something changed,
and when the file is gone (a state folder cleared, a tmp cleaner: the daemon's
own folder is made again): an idle daemon whose file went would say "not
running" for good. A clip's progress reaches it at most once a second (`CLIP_STATUS_S`).
A file that cannot be written is said once, not at every write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthwatch.daemon.clipthread import ClipRunner
from depthwatch.daemon.status import Status
from depthwatch.daemon.watcher import Watcher
from depthwatch.errors import OutputError
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.writer import atomic_write
from depthwatch.logtext import shown
from depthwatch.model.engine import Engine
from depthwatch.model.spec import ModelInfo

log = logging.getLogger("depthwatch")

#: A clip job's progress reaches the status file at most this often.
CLIP_STATUS_S = 1.0
#: How often an idle daemon looks whether its status file is still there.
_LOOK_FOR_FILE_S = 5.0


class StatusReport:
    """The daemon's `Status` in memory and when it goes to its file (main thread).

    It reads what it shows from the parts, through the callables it is given:
    the file's `path` (and whether its folder is the daemon's own, made again
    if it goes), the `queue`, the `parked` and `superseded` counts, the
    `watcher`, `engine` and `clips` in service, and the supervisor's `threads`.
    """

    def __init__(
        self,
        status: Status,
        *,
        path: Callable[[], Path],
        own_folder: Callable[[], bool],
        queue: LatestWinsQueue,
        parked: Callable[[], int],
        superseded: Callable[[], int],
        watcher: Callable[[], Watcher | None],
        engine: Callable[[], Engine | None],
        clips: Callable[[], ClipRunner | None],
        threads: Callable[[], dict[str, dict[str, Any]]],
    ) -> None:
        self.status = status
        self._path = path
        self._own_folder = own_folder
        self._queue = queue
        self._parked = parked
        self._superseded = superseded
        self._watcher = watcher
        self._engine = engine
        self._clips = clips
        self._threads = threads
        #: Guards the counts, which worker, clip and settle threads all change.
        self.lock = threading.Lock()
        self._dirty = True
        #: The model info last written to the status (a switch of engine shows as a new one).
        self.published: ModelInfo | None = None
        self._clip_status_at = 0.0
        self._clip_status_phase: str | None = None
        #: The last write failed (said once; said again once a write succeeds).
        self._failing = False
        self._checked_at = 0.0
        self._retry_at = 0.0  # when a status file that could not be written is tried again
        #: Frames reported incomplete by the watchers a reload replaced (each counts from zero).
        self.incomplete_before = 0
        #: Called (main thread) once another model serves: a reload's, or a faster engine's.
        self.on_new_model: Callable[[], None] = lambda: None

    def touch(self) -> None:
        """Something the status shows has changed: the main loop writes the file at its next look."""
        self._dirty = True

    def publish_model(self) -> None:
        """The engine's model, providers and precision into the status; a switch of engine logged."""
        engine = self._engine()
        assert engine is not None
        info = engine.info
        self.status.measuring = engine.measuring
        self.status.engine_switches = engine.switches
        self._dirty = True
        if info is None:
            return
        if self.published is not None and info.generation != self.published.generation and info.chosen_by == "measured":
            log.info("now using %s", info.describe())
        renewed = self.published is not None and info.generation != self.published.generation
        self.published = info
        if renewed:
            self.on_new_model()
        self.status.model = str(info.spec.path)
        self.status.profile = info.profile.name
        self.status.providers = list(info.providers)
        self.status.precision = info.arithmetic
        self.status.contract = info.contract.describe()

    def write(self) -> None:
        """The status file, rewritten atomically if anything changed since the last write, or if it is gone."""
        path = self._path()
        now = time.monotonic()
        if not self._dirty and now - self._checked_at >= _LOOK_FOR_FILE_S:
            self._checked_at = now
            self._dirty = not path.exists()
        if not self._dirty or (self._failing and now < self._retry_at):
            return
        self._dirty = False
        if self._own_folder() and not path.parent.is_dir():
            try:  # the default one lives in a folder of ours: made again, as at start
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                pass  # said below, by the write
        with self.lock:  # the counts and what the API's `health` reads, as one snapshot
            data = self.refresh().to_json()
        try:
            atomic_write(path, data)
        except OutputError as exc:
            if not self._failing:
                log.warning(
                    "status file: %s; `depthwatch status` shows what it last held (or nothing) until it can be written "
                    "again, tried every %.0f s", exc, _LOOK_FOR_FILE_S,
                )
            self._failing = True
            # Still to be written: a change taken as written would leave an idle daemon's status with the counts
            # of before the disk filled, for good, once space was back.
            self._dirty, self._retry_at = True, now + _LOOK_FOR_FILE_S
            return
        if self._failing:
            log.info("status file %s written again", shown(path))
            self._failing = False

    def refresh(self) -> Status:
        """The status with what the queue, the watcher, the engine and the clip thread say now."""
        status, queue, watcher = self.status, self._queue, self._watcher()
        status.queue_depth = len(queue)
        status.in_progress = queue.in_progress
        parked = self._parked()
        if parked != status.parked:  # a frame parked or taken back: its old map shows meanwhile
            status.parked = parked
            self.touch()
        status.counts.superseded = queue.superseded + self._superseded()
        status.counts.incomplete = self.incomplete_before + (watcher.incomplete if watcher else 0)
        # Only while running: a stopped watcher watches nothing, and its folders are not gone.
        watching = watcher is not None and status.state == "running"
        waiting = [str(folder) for folder in watcher.waiting_for] if watcher is not None and watching else []
        if waiting != status.waiting_for:  # a folder gone, or back: worth a write of its own
            status.waiting_for = waiting
            self.touch()
        unwatched = {str(root): len(folders) for root, folders in watcher.unwatched.items()} if watcher is not None and watching else {}
        if unwatched != status.unwatched:
            status.unwatched = unwatched
            self.touch()
        engine = self._engine()
        if engine is not None:
            status.model_loads = engine.load_count
            status.sessions_made = engine.sessions_made
        status.threads = self._threads()
        status.heartbeat_at = time.time()
        clips = self._clips()
        progress = clips.progress if clips is not None else None
        status.clip = progress.as_dict() if progress is not None else None
        status.clips_waiting = clips.waiting if clips is not None else 0
        return status

    def clip_progress(self) -> None:
        """A clip frame done (clip thread): the status file says so at most once a second.

        Rewriting it is an fsync; four a second of those would slow the live frames'
        own fsyncs, which share the filesystem's journal.
        """
        now = time.monotonic()
        clips = self._clips()
        progress = clips.progress if clips is not None else None
        phase = progress.phase if progress is not None else None
        if now - self._clip_status_at >= CLIP_STATUS_S or phase != self._clip_status_phase:
            self._clip_status_at, self._clip_status_phase = now, phase
            self._dirty = True
