"""What the daemon does with each result: its counts and its log line, the rest handed to the part whose job it is.

An output error goes to `retries` (tried again, then parked), every
result to `modelhealth` (unusable predictions in a row are the model's
fault), a request waiting for the map to `waiters`. Frames that a newer
version replaced are summarised in one line every `SUPERSEDED_SUMMARY_S`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from depthwatch.clips import ClipJob, ClipResult
from depthwatch.daemon.modelhealth import ModelHealth
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.retries import Retries
from depthwatch.daemon.waiters import MapWaiters
from depthwatch.frames.frameline import STAGES
from depthwatch.frames.job import Job
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.result import Result
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")
frames_log = logging.getLogger("depthwatch.frames")

#: Superseded frames are summarised in one log line at most this often.
SUPERSEDED_SUMMARY_S = 5.0
_SUPERSEDED_STAGES = ("replaced while queued", "before inference", "after inference had started")


class Accounts:
    """The daemon's results, counted and logged (worker and clip threads), each handed on where it must go.

    Given the `report` it counts into, the `waiters` it releases (while
    `answering`: the API is on), the `queue` it settles jobs in, the
    `retries` an output error goes to, and the model's `health`.
    """

    def __init__(
        self,
        *,
        report: StatusReport,
        waiters: MapWaiters,
        queue: LatestWinsQueue,
        answering: Callable[[], bool],
        retries: Retries,
        health: ModelHealth,
    ) -> None:
        self._report = report
        self._status = report.status
        self._lock = report.lock
        self._waiters = waiters
        self._queue = queue
        self._answering = answering
        self._retries = retries
        self._health = health
        self.superseded_in_flight = 0
        #: Superseded frames since the last summary line, by how far they got, and when
        #: the first of them came (monotonic; None: none unreported).
        self._superseded_unreported = dict.fromkeys(_SUPERSEDED_STAGES, 0)
        self._superseded_since: float | None = None
        self._queue_superseded_seen = 0

    def finished(self, job: Job, result: Result) -> None:
        """A job's result (worker thread): count it, log its line, retry an output error later."""
        # One step for a request (see waiters): the job in flight, or its result known and let go by the queue.
        with self._waiters.hold():
            retrying = not result.ok and not result.superseded and result.retryable and self._retries.retry(job, result)
            if self._answering():
                self._waiters.finished(job, result, final=not retrying)
            self._queue.settled(job)
        counts = self._status.counts
        if result.unchanged:  # one version handed over twice: its map is on disk already
            frames_log.debug("%s: its map is already made from these very bytes; not made again", shown(job.source))
            return
        self._health.judge(result)
        if result.ok:
            latency_ms = (time.monotonic() - job.queued_at) * 1000
            with self._lock:
                counts.done += 1
                counts.last_latency_ms = round(latency_ms, 2)
                counts.last_stage_ms = {stage: round(result.ms.get(stage, 0.0), 2) for stage in STAGES}
                counts.last_frame = str(job.source)
                if result.started:
                    counts.shots += 1
                if result.started == "cut":
                    counts.cuts += 1
                    counts.last_cut = f"{job.source} -> {job.output}:{result.shot_note()}"
            frames_log.info("%s total %.1f queue %d%s", result.describe(), latency_ms, len(self._queue), result.shot_note())
        elif result.gone == "vanished":  # no newer version: said as it is, naming the frame
            frames_log.info("%s; nothing to map", result.describe())
        elif result.gone == "stopped":  # the stop's own line says the next start maps them
            frames_log.debug("%s", result.describe())
        elif result.superseded:
            with self._lock:
                self.superseded_in_flight += 1
                stage = "after inference had started" if result.inferred else "before inference"
                self._superseded_unreported[stage] += 1
                if self._superseded_since is None:
                    self._superseded_since = time.monotonic()
            frames_log.debug("%s", result.describe())  # summarised by report_superseded
        elif retrying:
            pass
        elif result.retryable and self._retries.park(job):
            if self._retries.parked_again(job):
                log.debug("%s; still cannot be written, looked at again later", result.describe())
            else:
                self.count_failure(f"{result.describe()}; made again once {shown(job.output.parent)} can be written")
        else:
            self.count_failure(result.describe())
        if result.ok:
            self._retries.written(job)
        self._report.touch()

    def clip_finished(self, job: ClipJob, result: ClipResult) -> None:
        """A clip job's end (clip thread): its log line and counts."""
        if result.ok:
            with self._lock:
                self._status.counts.clips += 1
            log.info("clip %s", result.describe())
            self._retries.clip_written(job)
        elif result.superseded:
            log.info("clip %s: %s", shown(job.source.name), result.error)
        elif result.retryable and self._retries.park_clip(job):
            self.count_failure(f"clip {result.describe()}; made again once {shown(job.final.parent)} can be written", clip=True)
        else:
            self.count_failure(f"clip {result.describe()}", clip=True)
        self._report.touch()

    def count_failure(self, line: str, *, clip: bool = False) -> None:
        """A frame or clip that failed for good: counted (as a frame or as a clip), its line logged, last in the status."""
        with self._lock:
            if clip:
                self._status.counts.clips_failed += 1
            else:
                self._status.counts.failed += 1
            self._status.counts.last_error = line
        log.error("%s", line)
        self._report.touch()

    def count_own_map(self) -> None:
        """A file taken for a frame that carries depthwatch's own record: counted, never mapped."""
        with self._lock:
            self._status.counts.own_maps += 1
        self._report.touch()

    def report_superseded(self, final: bool = False) -> None:
        """One info line for the frames a newer version replaced, every SUPERSEDED_SUMMARY_S at most.

        While scrubbing, dozens a second are normal and not worth a line each;
        the line says how far each got, so none reads as if it had been inferred.
        """
        now = time.monotonic()
        with self._lock:
            unreported = self._superseded_unreported
            queued = self._queue.superseded
            if queued > self._queue_superseded_seen:
                unreported["replaced while queued"] += queued - self._queue_superseded_seen
                self._queue_superseded_seen = queued
                if self._superseded_since is None:
                    self._superseded_since = now
            since = self._superseded_since
            if since is None or (now - since < SUPERSEDED_SUMMARY_S and not final):
                return
            self._superseded_unreported = dict.fromkeys(unreported, 0)
            self._superseded_since = None
        count = sum(unreported.values())
        how = ", ".join(f"{n} {stage}" for stage, n in unreported.items() if n)
        frames = "frame" if count == 1 else "frames"
        log.info("%d %s superseded by newer versions in the last %.0f s (%s)", count, frames, max(1.0, now - since), how)
