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
from pathlib import Path
from typing import TYPE_CHECKING

from depthwatch.errors import FrameError
from depthwatch.frames import provenance
from depthwatch.clips.job import ClipJob
from depthwatch.frames.errorrecords import write_error_record
from depthwatch.frames.job import Job, Signature, signature_of
from depthwatch.logtext import shown

if TYPE_CHECKING:
    from depthwatch.daemon.lifecycle import Daemon

log = logging.getLogger("depthwatch")



class Intake:
    """The watcher's callbacks (settle thread) and the one way a job enters the queue (any thread)."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self._last_overflow_scan = 0.0
        self._overflow_reported = False

    def on_complete(self, source: Path, signature: Signature, fmt: str | None = None) -> None:
        """A complete frame (settle thread): make its job, queue it, let the pipeline pull it."""
        daemon = self._daemon
        accounts = daemon.accounts
        rules = daemon.rules
        if not rules.is_clip(source) and provenance.read(source) is not None:
            accounts.count_own_map()
            log.warning(
                "%s carries depthwatch's record (a depth map, or an image saved from one); not taken as a frame",
                shown(source),
            )
            return
        if daemon.black_box.holds(source, signature):  # a version that ended runs of the daemon: said, not run
            self.on_unusable(source, daemon.black_box.refusal(source))
            return
        if rules.is_clip(source):  # a clip job, on the clip thread
            try:
                output = rules.clip_output_for(source)
            except FrameError as exc:
                accounts.count_failure(f"{shown(source)}: {exc}", clip=True)
                return
            if daemon.clips is not None:
                daemon.clips.submit(ClipJob(source, output, signature, rules.output_roots(source)))
                daemon.report.touch()
            return
        try:
            job = rules.job_for(source, signature, fmt)
        except FrameError as exc:
            accounts.count_failure(f"{shown(source)}: {exc}")
            return
        if daemon.api is None:
            self.enqueue(job)
            return
        with daemon.waiters.hold():
            if daemon.waiters.absorb(source, signature):
                log.debug("%s: the watcher found the version a request already queued", source.name)
                return
            if signature_of(source) != signature:
                return  # changed since: that newer version comes by its own event or request
            self.enqueue(job)

    def on_unusable(self, source: Path, reason: str) -> None:
        """A file the watcher will not hand over (never completed, forbidden link): report it."""
        self._daemon.accounts.count_failure(f"{shown(source)}: {reason}", clip=self._daemon.rules.is_clip(source))
        try:
            job = self._daemon.rules.job_for(source)
        except FrameError:
            return
        if job.error_record is not None:
            write_error_record(job.error_record, source, reason, job.output_roots)

    def enqueue(self, job: Job) -> bool:
        """Queue `job` and let the pipeline pull it; False if the queue is full (a rescan finds it later)."""
        daemon = self._daemon
        queued = daemon.queue.put(job)
        if queued and daemon.pipeline is not None:
            daemon.pipeline.pull()
        if not queued and not daemon.stopping:
            if daemon.watcher is not None:
                daemon.watcher.forget(job.source)  # so the rescan hands it over again
            if not self._overflow_reported:
                self._overflow_reported = True
                log.warning("queue full (%d frames); the frames beyond it will be picked up by a rescan", daemon.queue.maxsize)
        daemon.report.touch()
        return queued

    def rescan_after_overflow(self) -> None:
        """After the queue turned frames away, look for them once it has room again (main loop)."""
        queue, watcher = self._daemon.queue, self._daemon.watcher
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
        daemon = self._daemon
        pipeline = daemon.pipeline
        while pipeline is not None and not daemon.stopping and (len(daemon.queue) or pipeline.pending):
            pipeline.wait_idle(0.05)
