"""Waiting jobs keyed by output path: latest wins, arrival order otherwise, bounded.

An editor scrubbing rewrites frame.jpg many times a second; only the newest
version is worth a depth map, so a newer job for an output replaces the one
waiting for it. A job whose output is already being produced waits until that
one is written, so an older frame can never land after a newer one. The queue
holds paths, not pixels, and has a bound: a job that finds it full is dropped
and `overflowed` tells the owner to rescan the folders later (their outputs
are missing, so nothing is lost).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from depthwatch.pipeline import Job


class LatestWinsQueue:
    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._waiting: OrderedDict[Path, Job] = OrderedDict()
        self._busy: dict[Path, Job] = {}
        self._cond = threading.Condition()
        self._closed = False
        #: Jobs replaced by a newer one for the same output before they started.
        self.superseded = 0
        #: Set when a job was turned away because the queue was full.
        self.overflowed = False

    def put(self, job: Job) -> bool:
        """Queue `job`, replacing a waiting job for the same output; False if full or closed.

        The very same version (source and signature) already waiting or in progress
        is not queued twice: a rescan may find a frame the queue already holds.
        """
        with self._cond:
            if self._closed:
                return False
            key = job.output
            current = self._waiting.get(key) or self._busy.get(key)
            if current is not None and (current.source, current.signature) == (job.source, job.signature):
                return True
            if key in self._waiting:
                del self._waiting[key]
                self.superseded += 1
            elif len(self._waiting) >= self.maxsize:
                self.overflowed = True
                return False
            self._waiting[key] = job
            self._cond.notify()
            return True

    def get(self, timeout: float | None = None) -> Job | None:
        """The oldest job whose output is not in progress; None on timeout or when closed."""
        with self._cond:
            job = None

            def ready() -> bool:
                nonlocal job
                if self._closed:
                    return True
                for key in self._waiting:
                    if key not in self._busy:
                        job = self._busy[key] = self._waiting.pop(key)
                        return True
                return False

            self._cond.wait_for(ready, timeout)
            return job

    def done(self, job: Job) -> None:
        """The job's output is written (or failed): the next job for it may start."""
        with self._cond:
            self._busy.pop(job.output, None)
            self._cond.notify_all()

    def close(self) -> list[Job]:
        """Stop handing out jobs; returns the ones still waiting."""
        with self._cond:
            self._closed = True
            left = list(self._waiting.values())
            self._waiting.clear()
            self._cond.notify_all()
            return left

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def in_progress(self) -> int:
        with self._cond:
            return len(self._busy)
