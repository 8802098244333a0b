"""How work gets into the daemon: the watcher's complete files become frame or clip jobs, one way into the queue.

Two producers queue frames, the watcher and the HTTP API's requests (see
`backend`); with the API on, both queue under the waiters' lock and look at
the file again there, so an older version is never queued after a newer one
(see `waiters`). A queue that turned frames away is looked through again once
it has room. Clips go to the clip thread, which waits at `clip_gate` while
any live frame is queued or in flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from depthwatch.clips import ClipJob
from depthwatch.daemon.accounting import Accounts
from depthwatch.daemon.blackbox import BlackBox
from depthwatch.daemon.clipthread import ClipRunner
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.waiters import MapWaiters
from depthwatch.daemon.watcher import Watcher
from depthwatch.errors import FrameError
from depthwatch.frames import ownership
from depthwatch.frames.errorrecords import write_error_record
from depthwatch.frames.job import Job, Signature, signature_of
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.rules import Rules
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")



class Intake:
    """The watcher's callbacks (settle thread) and the one way a job enters the queue (any thread).

    Given what it hands work to and counts with: the `queue`, the `pipeline`
    and `clips` in service, the `accounts`, the `waiters` (while `answering`:
    the API is on), the `black_box` (frames set aside), the `rules` and
    `watcher` in force, the `report`, and whether the daemon is `stopping`.
    """

    def __init__(
        self,
        *,
        queue: LatestWinsQueue,
        pipeline: Callable[[], Pipeline | None],
        clips: Callable[[], ClipRunner | None],
        accounts: Accounts,
        waiters: MapWaiters,
        answering: Callable[[], bool],
        black_box: BlackBox,
        rules: Callable[[], Rules],
        watcher: Callable[[], Watcher | None],
        report: StatusReport,
        stopping: Callable[[], bool],
    ) -> None:
        self._queue = queue
        self._pipeline = pipeline
        self._clips = clips
        self._accounts = accounts
        self._waiters = waiters
        self._answering = answering
        self._black_box = black_box
        self._rules = rules
        self._watcher = watcher
        self._report = report
        self._stopping = stopping
        self._last_overflow_scan = 0.0
        self._overflow_reported = False

    def on_complete(self, source: Path, signature: Signature, fmt: str | None = None) -> None:
        """A complete frame (settle thread): make its job, queue it, let the pipeline pull it."""
        accounts = self._accounts
        rules = self._rules()
        if not rules.is_clip(source) and ownership.is_depth_map(source):
            accounts.count_own_map()
            log.warning(
                "%s carries depthwatch's record (a depth map, or an image saved from one); not taken as a frame",
                shown(source),
            )
            return
        if self._black_box.holds(source, signature):  # a version that ended runs of the daemon: said, not run
            self.on_unusable(source, self._black_box.refusal(source))
            return
        if rules.is_clip(source):  # a clip job, on the clip thread
            try:
                output = rules.clip_output_for(source)
            except FrameError as exc:
                accounts.count_failure(f"{shown(source)}: {exc}", clip=True)
                return
            clips = self._clips()
            if clips is not None:
                if not clips.submit(ClipJob(source, output, signature, rules.output_roots(source))) and not self._stopping():
                    self._overflowed(source, "clips", clips.maxsize)
                self._report.touch()
            return
        try:
            job = rules.job_for(source, signature, fmt)
        except FrameError as exc:
            accounts.count_failure(f"{shown(source)}: {exc}")
            return
        if not self._answering():
            self.enqueue(job)
            return
        with self._waiters.hold():
            if self._waiters.absorb(source, signature):
                log.debug("%s: the watcher found the version a request already queued", source.name)
                return
            if signature_of(source) != signature:
                return  # changed since: that newer version comes by its own event or request
            self.enqueue(job)

    def on_unusable(self, source: Path, reason: str) -> None:
        """A file the watcher will not hand over (never completed, forbidden link): report it."""
        rules = self._rules()
        self._accounts.count_failure(f"{shown(source)}: {reason}", clip=rules.is_clip(source))
        try:
            job = rules.job_for(source)
        except FrameError:
            return
        if job.error_record is not None:
            write_error_record(job.error_record, source, reason, job.output_roots)

    def enqueue(self, job: Job) -> bool:
        """Queue `job` and let the pipeline pull it; False if the queue is full (a rescan finds it later)."""
        queue, pipeline = self._queue, self._pipeline()
        queued = queue.put(job)
        if queued and pipeline is not None:
            pipeline.pull()
        if not queued and not self._stopping():
            self._overflowed(job.source, "frames", queue.maxsize)
        self._report.touch()
        return queued

    def _overflowed(self, source: Path, what: str, maxsize: int) -> None:
        """A frame or a clip turned away by its full queue: the rescan after an overflow hands it over again."""
        self._queue.overflowed = True
        watcher = self._watcher()
        if watcher is not None:
            watcher.forget(source)
        if not self._overflow_reported:
            self._overflow_reported = True
            log.warning("queue full (%d %s); the %s beyond it will be picked up by a rescan", maxsize, what, what)

    def rescan_after_overflow(self) -> None:
        """After the queue turned frames away, look for them once it has room again (main loop)."""
        queue, watcher = self._queue, self._watcher()
        if not queue.overflowed or watcher is None:
            return
        if len(queue) > queue.maxsize // 2 or time.monotonic() - self._last_overflow_scan < 1.0:
            return
        queue.overflowed = False
        self._overflow_reported = False
        self._last_overflow_scan = time.monotonic()
        for root in watcher.rules.roots:  # on the scan thread: a large folder never holds the main loop
            watcher.scan_later(root)

    def clip_gate(self) -> None:
        """Live frames first (clip thread): a clip's next frame waits while a frame is queued or in flight."""
        pipeline = self._pipeline()
        while pipeline is not None and not self._stopping() and (len(self._queue) or pipeline.pending):
            pipeline.wait_idle(0.05)
