"""What the daemon does with each result: counts and log lines, retries, parking, the model's health.

A frame's output error (a full disk, no permission) is tried again a few
times with growing pauses (`daemon.retries`), then parked until its folder
looks writable (see `parked`); a clip is parked at once. Frames that a newer
version replaced are summarised in one line every `SUPERSEDED_SUMMARY_S`,
and several unusable predictions in a row put a health error in the status.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from depthwatch.clips.job import ClipJob, ClipResult
from depthwatch.daemon.parked import MOST_PARKED, Parked
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.waiters import MapWaiters
from depthwatch.daemon.watcher import Watcher
from depthwatch.frames.frameline import STAGES
from depthwatch.frames.job import Job
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.result import Result
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")
frames_log = logging.getLogger("depthwatch.frames")

_RETRY_MAX_DELAY = 60.0
#: Unusable predictions in a row (NaN, a constant) after which the status shows a health error.
BAD_PREDICTIONS_UNHEALTHY = 5
#: Superseded frames are summarised in one log line at most this often.
SUPERSEDED_SUMMARY_S = 5.0
_SUPERSEDED_STAGES = ("replaced while queued", "before inference", "after inference had started")


class Accounts:
    """The daemon's results, counted (worker and clip threads) and acted on: retried, parked, reported.

    Given the `report` it counts into, the `waiters` it releases (while
    `answering`: the API is on), the `queue` it settles jobs in, the `watcher`
    in service (retries go back through it), whether the daemon is `stopping`,
    and `retries` (daemon.retries as it is now).
    """

    def __init__(
        self,
        *,
        report: StatusReport,
        waiters: MapWaiters,
        queue: LatestWinsQueue,
        watcher: Callable[[], Watcher | None],
        answering: Callable[[], bool],
        stopping: Callable[[], bool],
        retries: Callable[[], int],
    ) -> None:
        self._report = report
        self._status = report.status
        self._lock = report.lock
        self._waiters = waiters
        self._queue = queue
        self._watcher = watcher
        self._answering = answering
        self._stopping = stopping
        self._retries = retries
        self._attempts: dict[Path, int] = {}
        #: Unusable predictions since the last good map (see BAD_PREDICTIONS_UNHEALTHY).
        self._bad_predictions = 0
        #: Frames whose tries ran out on an output error, by output folder (see `Parked`).
        self._parked = Parked()
        #: The version of each parked frame already counted and logged as failed: one that comes
        #: back from the lot and fails again is neither (before: +1 failed and three lines every
        #: few seconds, for good), and gets no quick retries of its own.
        self._parked_versions: dict[Path, object] = {}
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
            retrying = not result.ok and not result.superseded and result.retryable and self._retry(job, result)
            if self._answering():
                self._waiters.finished(job, result, final=not retrying)
            self._queue.settled(job)
        counts = self._status.counts
        if result.unchanged:  # one version handed over twice: its map is on disk already
            frames_log.debug("%s: its map is already made from these very bytes; not made again", shown(job.source))
            return
        self._model_health(result)
        if result.ok:
            latency_ms = (time.monotonic() - job.queued_at) * 1000
            with self._lock:
                self._attempts.pop(job.output, None)
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
        elif result.retryable and not self._stopping() and self._park(job):
            with self._lock:
                again = self._parked_versions.get(job.source) == job.signature
                if not again and len(self._parked_versions) >= MOST_PARKED:
                    # Frames parked and deleted since (taken back, then gone before their turn): forgotten, or
                    # once this is full every parked frame is counted failed again at every look, for good.
                    self._parked_versions = {s: v for s, v in self._parked_versions.items() if os.path.lexists(s)}
                if not again and len(self._parked_versions) < MOST_PARKED:
                    self._parked_versions[job.source] = job.signature
            if again:
                log.debug("%s; still cannot be written, looked at again later", result.describe())
            else:
                self.count_failure(f"{result.describe()}; made again once {shown(job.output.parent)} can be written")
        else:
            self.count_failure(result.describe())
        if result.ok:
            with self._lock:
                self._parked_versions.pop(job.source, None)
            self._parked.written(job.output.parent, job.source)
        self._report.touch()

    def clip_finished(self, job: ClipJob, result: ClipResult) -> None:
        """A clip job's end (clip thread): its log line and counts."""
        if result.ok:
            with self._lock:
                self._status.counts.clips += 1
            log.info("clip %s", result.describe())
            self._parked.written(job.final.parent, job.source)
        elif result.superseded:
            log.info("clip %s: %s", shown(job.source.name), result.error)
        elif result.retryable and self._watcher() is not None and not self._stopping() and self._park_clip(job):
            self.count_failure(f"clip {result.describe()}; made again once {shown(job.final.parent)} can be written", clip=True)
        else:
            self.count_failure(f"clip {result.describe()}", clip=True)
        self._report.touch()

    def _model_health(self, result: Result) -> None:
        """Several unusable predictions in a row are the model's fault, not the frames': say so in the status."""
        if result.superseded:
            return
        status = self._status
        with self._lock:
            if result.ok:
                if status.health_error is not None:
                    log.info("the model's predictions are usable again; health error cleared")
                self._bad_predictions = 0
                status.health_error = None
                return
            if not result.bad_prediction:
                return
            self._bad_predictions += 1
            count = self._bad_predictions
            if count < BAD_PREDICTIONS_UNHEALTHY:
                return
            first = status.health_error is None
            status.health_error = (
                f"the model's last {count} predictions were unusable ({result.error}); "
                "check the model file and model.providers (try providers: [cpu])"
            )
        if first:
            log.error("%s", status.health_error)

    def model_changed(self) -> None:
        """Another model serves: the last one's failures say nothing of it (main thread)."""
        with self._lock:
            self._bad_predictions = 0
            cleared, self._status.health_error = self._status.health_error, None
        if cleared is not None:
            log.info("another model is in service; the health error of the last one is cleared")
            self._report.touch()

    def _retry(self, job: Job, result: Result) -> bool:
        """Try an output error again later (the disk may free up); False once out of tries."""
        retries = self._retries()
        watcher = self._watcher()
        with self._lock:
            attempt = self._attempts.get(job.output, 0) + 1
            back = self._parked_versions.get(job.source) == job.signature  # from the lot: parked again at once
            if attempt > retries or watcher is None or self._stopping() or back:
                self._attempts.pop(job.output, None)
                return False
            self._attempts[job.output] = attempt
            self._status.counts.retried += 1
        delay = min(_RETRY_MAX_DELAY, 2.0 ** (attempt - 1))
        log.warning("%s; try %d of %d in %.0f s", result.describe(), attempt, retries, delay)
        self._hand_back(job.source, delay)
        return True

    def _hand_back(self, source: Path, delay: float = 0.0) -> None:
        """`source` back to the watcher, let through even if unchanged, checked after `delay`."""
        watcher = self._watcher()
        if watcher is None:
            return
        watcher.forget(source)
        self._waiters.forget(source)
        watcher.poke(source, delay=delay)

    def _park(self, job: Job) -> bool:
        """Keep a frame whose tries ran out (disk full, no permission) for when its folder can be written."""
        if self._watcher() is None:
            return False
        return self._parked.park(job.output.parent, job.source)

    def _park_clip(self, job: ClipJob) -> bool:
        """Keep a clip whose depth clip could not be written (a full disk) for when its folder can be.

        No quick retries first, as a frame gets: a clip is minutes of work, so it waits
        until its folder looks writable; `retry_parked` hands it back to the watcher.
        """
        return self._parked.park(job.final.parent, job.source)

    @property
    def parked(self) -> int:
        """Frames waiting for their folder to be writable (their old map still shows)."""
        return len(self._parked)

    def retry_parked(self) -> None:
        """Hand the parked frames of each folder that can be written again back to the watcher (main loop)."""
        if self._watcher() is None:
            return
        taken, gone = self._parked.due()
        if gone:
            with self._lock:
                for source in gone:
                    self._parked_versions.pop(source, None)
            self._report.touch()
        for source in taken:
            self._hand_back(source)

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
