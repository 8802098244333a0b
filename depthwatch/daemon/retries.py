"""A result that could not be written, tried again: a few quick tries, then parked until its folder can be written.

A frame's output error (a full disk, no permission) is tried again a few
times with growing pauses (`daemon.retries`), each time handed back to the
watcher; once its tries run out it is parked until its folder looks writable
(see `parked`). A clip is parked at once: it is minutes of work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from depthwatch.clips import ClipJob
from depthwatch.daemon.parked import MOST_PARKED, Parked
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.waiters import MapWaiters
from depthwatch.daemon.watcher import Watcher
from depthwatch.frames.job import Job
from depthwatch.frames.result import Result

log = logging.getLogger("depthwatch")

_RETRY_MAX_DELAY = 60.0


class Retries:
    """Output errors tried again and parked, and the parked frames and clips handed back.

    Given the `report` it counts retries into, the `waiters` that forget a frame
    handed back, the `watcher` in service (retries go back through it), whether
    the daemon is `stopping`, and `retries` (daemon.retries as it is now).
    """

    def __init__(
        self,
        *,
        report: StatusReport,
        waiters: MapWaiters,
        watcher: Callable[[], Watcher | None],
        stopping: Callable[[], bool],
        retries: Callable[[], int],
    ) -> None:
        self._report = report
        self._status = report.status
        self._lock = report.lock
        self._waiters = waiters
        self._watcher = watcher
        self._stopping = stopping
        self._retries = retries
        self._attempts: dict[Path, int] = {}
        #: Frames whose tries ran out on an output error, by output folder (see `Parked`).
        self._parked = Parked()
        #: The version of each parked frame already counted and logged as failed: one that comes
        #: back from the lot and fails again is neither (it would be +1 failed and three lines
        #: every few seconds, for good), and gets no quick retries of its own.
        self._parked_versions: dict[Path, object] = {}

    def retry(self, job: Job, result: Result) -> bool:
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

    def park(self, job: Job) -> bool:
        """Keep a frame whose tries ran out (disk full, no permission) for when its folder can be written."""
        if self._stopping() or self._watcher() is None:
            return False
        return self._parked.park(job.output.parent, job.source)

    def parked_again(self, job: Job) -> bool:
        """Whether this very version of a frame just parked was parked before (counted and logged then); noted if not."""
        with self._lock:
            again = self._parked_versions.get(job.source) == job.signature
            if not again and len(self._parked_versions) >= MOST_PARKED:
                # Frames parked and deleted since (taken back, then gone before their turn): forgotten, or
                # once this is full every parked frame is counted failed again at every look, for good.
                self._parked_versions = {s: v for s, v in self._parked_versions.items() if os.path.lexists(s)}
            if not again and len(self._parked_versions) < MOST_PARKED:
                self._parked_versions[job.source] = job.signature
        return again

    def park_clip(self, job: ClipJob) -> bool:
        """Keep a clip whose depth clip could not be written (a full disk) for when its folder can be.

        No quick retries first, as a frame gets: a clip is minutes of work, so it waits
        until its folder looks writable; `retry_parked` hands it back to the watcher.
        """
        if self._watcher() is None or self._stopping():
            return False
        return self._parked.park(job.final.parent, job.source)

    def written(self, job: Job) -> None:
        """A frame's map was written: its tries start over, and its folder is writable again."""
        with self._lock:
            self._attempts.pop(job.output, None)
            self._parked_versions.pop(job.source, None)
        self._parked.written(job.output.parent, job.source)

    def clip_written(self, job: ClipJob) -> None:
        """A depth clip was written: its folder is writable again."""
        self._parked.written(job.final.parent, job.source)

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

    def _hand_back(self, source: Path, delay: float = 0.0) -> None:
        """`source` back to the watcher, let through even if unchanged, checked after `delay`."""
        watcher = self._watcher()
        if watcher is None:
            return
        watcher.forget(source)
        self._waiters.forget(source)
        watcher.poke(source, delay=delay)
