"""Clip jobs in the daemon: one at a time, on a thread of their own, after the live frames.

A clip dropped into a watched folder can take minutes; an editor dropping a
frame meanwhile is waiting on it now. So the clip thread does a clip's
decoding, rendering and encoding itself, hands its frames to the one
inference thread at BACKGROUND priority (behind every live frame queued), and
before each frame waits at the daemon's gate while any live frame is queued
or in flight. A live frame then waits for one clip inference at most.

Latest wins, as for frames, in the frames' own queue (`LatestWinsQueue`): a
newer version of a clip (rewritten in place, copied over) replaces the one
waiting, and cancels the job in progress for its output, which removes its
temporary file, and the new version starts over. A stop does the same and
leaves the clip for the next start's scan. Another clip that would get the
same depth clip is refused with one line; it never cancels the job in progress.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from depthwatch.clips import ClipJob, ClipResult, Progress, make_clip
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.rules import clips_sharing
from depthwatch.frames.settings import Settings
from depthwatch.logtext import shown
from depthwatch.model.engine import Engine
from depthwatch.threadnames import yield_to_inference

if TYPE_CHECKING:
    from depthwatch.daemon.supervisor import Slot

log = logging.getLogger("depthwatch.clips")

#: Why a clip job in progress was cancelled (its result's error): the daemon's shutdown, or a newer version.
STOPPED_BY_SHUTDOWN = "stopped by the daemon's shutdown; the clip is mapped again at the next start"
NEWER = "a newer version of the clip arrived; starting over with it"


class ClipRunner:
    """The clip thread: `submit` from any thread, `stop` on shutdown; `progress` for the status file."""

    def __init__(
        self,
        engine: Engine,
        settings: Callable[[], Settings],
        gate: Callable[[], None],
        on_result: Callable[[ClipJob, ClipResult], None],
        on_progress: Callable[[], None] = lambda: None,
        niceness: int = 0,
        slot: Slot | None = None,
        maxsize: int = 1000,
    ) -> None:
        """`niceness`: as the workers' (daemon.worker_niceness), below the inference thread. `slot`:
        the supervisor's record of this thread, told which clip it works on. `maxsize`: clips waiting
        at most (a clip turned away is found again by the rescan after an overflow)."""
        self._slot = slot
        self._engine = engine
        self._settings = settings
        self._gate = gate
        self._on_result = on_result
        self._on_progress = on_progress
        self._niceness = niceness
        self._queue: LatestWinsQueue[ClipJob] = LatestWinsQueue(maxsize)
        self._lock = threading.Lock()
        #: Why the job in progress is to end, and which job that is (a cancel outlives no job).
        self._cancel: tuple[ClipJob, str] | None = None
        self._current: ClipJob | None = None
        self._thread = threading.Thread(target=self._loop, name="depthwatch-clip", daemon=True)
        #: The job in progress (None when idle); read by the status file.
        self.progress: Progress | None = None

    def start(self) -> ClipRunner:
        self._thread.start()
        return self

    def submit(self, job: ClipJob) -> bool:
        """Queue a clip; a newer version of the one in progress cancels it, another clip for its output is refused.

        False: the queue is full (the clip is found again by the rescan after an overflow).
        """
        if self._queue.closed:
            return True
        rival = next((j for j in (self._queue.started_for(job.output), self._queue.waiting_for(job.output)) if _rival(j, job)), None)
        if rival is not None:  # the result's line is logged and counted
            self._on_result(job, ClipResult(job, error=clips_sharing(rival.source, job.final)))
            return True
        return self._queue.put(job, supersede=self._newer)

    def _newer(self, started: ClipJob) -> None:
        """Under the queue's lock: another version of the clip `started` arrived; it ends, and the new one starts over."""
        with self._lock:
            self._cancel = (started, NEWER)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def maxsize(self) -> int:
        return self._queue.maxsize

    def stop(self, timeout: float | None = None) -> bool:
        """Cancel the job in progress (its temporary file goes), drop the waiting ones, join; True if it ended."""
        self._queue.close()
        with self._lock:
            if self._current is not None:
                self._cancel = (self._current, STOPPED_BY_SHUTDOWN)
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _cancelled(self) -> str | None:
        with self._lock:
            cancel = self._cancel
            if cancel is not None and cancel[0] is self._current:
                return cancel[1]
            return STOPPED_BY_SHUTDOWN if self._queue.closed else None

    def _progress(self, progress: Progress) -> None:
        self.progress = progress
        self._on_progress()

    def _loop(self) -> None:
        yield_to_inference(self._niceness)
        while True:
            job = self._queue.get()
            if job is None:  # closed: the daemon stops
                return
            with self._lock:
                self._current = job
            log.info("clip %s -> %s: started", shown(job.source.name), shown(job.final.name))
            if self._slot is not None:
                self._slot.working((job.source, job.signature) if job.signature is not None else None, "clip")
            try:
                result = make_clip(
                    job, self._engine, self._settings(), cancelled=self._cancelled, gate=self._gate, on_progress=self._progress
                )
            except Exception as exc:  # a bug must not end the clip thread
                log.error("internal error on clip %s (a bug; please report it with this traceback)", shown(job.source), exc_info=exc)
                result = ClipResult(job, error=f"internal error: {type(exc).__name__}: {exc}")
            finally:
                if self._slot is not None:
                    self._slot.idle()
            with self._lock:
                self._current, self._cancel, self.progress = None, None, None
            self._queue.done(job)  # the same version found again is queued anew from here on
            try:
                self._on_result(job, result)
                self._on_progress()
            except Exception as exc:  # nor a bug in what is told of the result: the next clip still comes
                log.error("internal error reporting clip %s (a bug; please report it with this traceback)", shown(job.source), exc_info=exc)


def _rival(other: ClipJob | None, job: ClipJob) -> bool:
    """Whether `other` is another clip, still there, that gets `job`'s depth clip (A.mp4 and A.mov)."""
    if other is None or other.output != job.output or other.source == job.source:
        return False
    try:
        return not os.path.samefile(other.source, job.source)
    except OSError:
        return False  # gone (renamed, deleted): nothing left to replace
