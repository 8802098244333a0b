"""Waiting jobs keyed by output path: latest wins, arrival order otherwise, bounded; a frame's and a clip's alike.

An editor scrubbing rewrites frame.jpg many times a second; only the newest
version is worth a depth map, so a newer job for an output replaces the one
waiting for it (a job already started is abandoned by the pipeline when its
successor starts). The queue holds paths, not pixels, and has a bound: a job
that finds it full is dropped and `overflowed` tells the owner to rescan the
folders later (their outputs are missing, so nothing is lost).

Latest wins per output at each stage of a frame's way, each where its state
is: waiting here; in flight in `pipeline` (`_newest`: an older job for the
output is abandoned, its inference aborted); written in `pipeline`
(`_written`: an older version's map never replaces a newer one's); and a
clip's job, waiting and started, in this same queue (the clip thread's, where a
newer version of the clip started cancels it: `put`'s `supersede`). Each tells a
newer version from the same one found again by `job.same_source_version`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from depthwatch.frames.job import Signature, same_source_version


class _Keyed(Protocol):
    """A frame's job or a clip's: the output it is for, and the version of its source found."""

    @property
    def output(self) -> Path | None: ...

    @property
    def source(self) -> Path: ...

    @property
    def signature(self) -> Signature | None: ...


J = TypeVar("J", bound=_Keyed)


class LatestWinsQueue(Generic[J]):
    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._waiting: OrderedDict[Path | None, J] = OrderedDict()
        #: The newest job started for each output, until it is done.
        self._started: dict[Path | None, J] = {}
        self._in_progress = 0
        self._cond = threading.Condition()
        self._closed = False
        #: Jobs replaced by a newer one for the same output before they started.
        self.superseded = 0
        #: Set when a job was turned away because the queue was full.
        self.overflowed = False

    def put(self, job: J, supersede: Callable[[J], None] | None = None) -> bool:
        """Queue `job`, replacing a waiting job for the same output; False if full or closed.

        The very same version (source and signature) already waiting or started
        is not queued twice: a rescan may find a frame the queue already holds.
        `supersede`: called, under the queue's lock, with the job started for the
        output when `job` is another version of it (the clip thread cancels it).
        """
        with self._cond:
            if self._closed:
                return False
            key = job.output
            current = self._waiting.get(key) or self._started.get(key)
            if same_source_version(current, job):
                return True
            if key in self._waiting:
                del self._waiting[key]
                self.superseded += 1
            elif len(self._waiting) >= self.maxsize:
                self.overflowed = True
                return False  # turned away: the job started for the output goes on
            started = self._started.get(key)
            if supersede is not None and started is not None:
                supersede(started)
            self._waiting[key] = job
            self._cond.notify()
            return True

    def waiting_for(self, output: Path) -> J | None:
        """The job waiting for `output`, if one is."""
        with self._cond:
            return self._waiting.get(output)

    def started_for(self, output: Path) -> J | None:
        """The job started for `output` and not done yet, if one is."""
        with self._cond:
            return self._started.get(output)

    def get(self, timeout: float | None = None) -> J | None:
        """The oldest waiting job; None on timeout or when closed."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._waiting or self._closed, timeout) or self._closed:
                return None
            _, job = self._waiting.popitem(last=False)
            self._started[job.output] = job
            self._in_progress += 1
            return job

    def settled(self, job: J) -> None:
        """The owner has acted on the job's result (before `done`): the same version is queued anew from now on.

        A producer that queues under the lock its owner settles under sees the
        job either in flight (its result still to come) or settled, never
        finished yet "started", which would drop a put meant to make the map
        again (its map deleted since) with nothing left to make it.
        """
        with self._cond:
            if self._started.get(job.output) is job:
                del self._started[job.output]

    def done(self, job: J) -> None:
        """The job has its result (written, failed or abandoned)."""
        with self._cond:
            if self._started.get(job.output) is job:
                del self._started[job.output]
            self._in_progress -= 1

    def close(self) -> list[J]:
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
            return self._in_progress
