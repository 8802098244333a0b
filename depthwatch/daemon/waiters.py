"""Requests waiting for a frame's depth map to be on disk (the HTTP API's `POST /predict`).

A request names a frame and the version of it on disk when the request came
(its signature: size, mtime_ns, inode). It is answered once a map of that
version, or of a newer one, has been written. The daemon reports every
finished job here; a waiter is released by a job for its frame that either has
its very signature or was made after the waiter registered (a job re-checks
the file's signature when it reads it, so such a job's map is of a version on
disk after the request came, which is what "newer" means). A superseded job
releases nobody: the newer job that superseded it will.

Jobs are queued through the daemon's own path, under this module's lock, so a
version the watcher already queued, started or finished is never run twice:
the queue drops a second job for a version it holds, and a finished version
is answered from `_last` at once (why it has no map, or DONE if its map is still on
disk with that version's record: a map deleted since is made again). The daemon
reports a job here and has the queue let go of it (`settled`) as one step under
this lock, so a request never finds a job finished yet still held by the queue,
which would drop the job that makes a deleted map again. The watcher's own event for a version a
request queued first is dropped once (`absorb`). With two producers (the
watcher, requests) the daemon also queues under `hold()` and looks at the file
again there, so an older version can never be queued after a newer one and
replace it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cachetools import LRUCache

from depthwatch.frames import provenance
from depthwatch.frames.job import Job, Signature
from depthwatch.frames.result import Result


#: Outputs and sources remembered (the least recently used forgotten first).
_MEMORY = 1024

DONE, FAILED, STOPPING, REFUSED, TIMEOUT = "done", "failed", "stopping", "refused", "timeout"


@dataclass(frozen=True)
class Release:
    """How a wait ended: `kind` is one of DONE, FAILED, STOPPING, REFUSED, TIMEOUT."""

    kind: str
    error: str | None = None
    #: For FAILED: whether the frame itself was unusable (decode) rather than its map unwritable (a file
    #: at the map's name that is not depthwatch's, a folder it may not write): only the frame's own fault
    #: stays until the frame changes; the map's side is tried again at the next request.
    frame_error: bool = True
    #: For FAILED: the model failed on it (NaN, a provider's error, a run given up); never remembered, since
    #: the next request may meet another model, or the same one working again.
    model_fault: bool = False


@dataclass(eq=False)
class Ticket:
    """One request's wait for one frame's map."""

    source: Path
    output: Path
    signature: Signature
    since: float = field(default_factory=time.monotonic)
    outcome: Release | None = None
    _event: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float) -> Release:
        self._event.wait(timeout)
        return self.outcome or Release(TIMEOUT)

    def _release(self, outcome: Release) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._event.set()


def _map_on_disk(output: Path, signature: Signature) -> bool:
    """Whether `output` is still the map made from the frame version `signature` (its record says so)."""
    record = provenance.read(output)
    return record is not None and provenance.same_version(record, signature)


class MapWaiters:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._waiting: dict[Path, list[Ticket]] = {}
        #: The (source, signature, outcome) of the last job finished, per output.
        self._last: LRUCache[Path, tuple[Path, Signature | None, Release]] = LRUCache(_MEMORY)
        #: Versions a request queued, per source, so the watcher's event for them is dropped once.
        self._taken: LRUCache[Path, Signature] = LRUCache(_MEMORY)
        self._closed = False

    def hold(self) -> threading.RLock:
        """The lock, for a caller that checks the file and queues as one step."""
        return self._lock

    def attach(self, job: Job, enqueue: Callable[[Job], bool]) -> Ticket:
        """A ticket for `job`'s map; `enqueue` queues the job unless it is already done.

        `enqueue` runs under the lock, so a job finishing meanwhile cannot slip
        between "not written yet" and "queued" and be run a second time.
        """
        assert job.signature is not None
        ticket = Ticket(job.source, job.output, job.signature)
        with self._lock:
            if self._closed:
                ticket._release(Release(STOPPING, "the daemon is stopping"))
                return ticket
            last = self._last.get(job.output)
            if last is not None and last[:2] == (job.source, job.signature):
                outcome = last[2]
                if outcome.kind == FAILED:
                    still = outcome.frame_error  # the frame's own fault stays until the frame changes
                else:
                    still = outcome.kind != DONE or _map_on_disk(job.output, job.signature)
                if still:
                    ticket._release(outcome)
                    return ticket
                # A map deleted or replaced since, or one that could not be written (the file in its way
                # may be gone now): make it again, rather than answer from memory what may be so no more.
                del self._last[job.output]
            self._waiting.setdefault(job.output, []).append(ticket)
            if enqueue(job):
                self._taken[job.source] = job.signature
            else:
                self._drop(ticket)
                ticket._release(Release(REFUSED, "the queue is full; try again shortly"))
        return ticket

    def give_up(self, ticket: Ticket) -> None:
        """The request stopped waiting (timeout)."""
        with self._lock:
            self._drop(ticket)

    def absorb(self, source: Path, signature: Signature) -> bool:
        """True (once) if a request already queued this very version of `source`."""
        with self._lock:
            if self._taken.get(source) == signature:
                del self._taken[source]
                return True
            return False

    def forget(self, source: Path) -> None:
        """A retry of `source` is on its way through the watcher: let it through."""
        with self._lock:
            self._taken.pop(source, None)

    def finished(self, job: Job, result: Result, final: bool = True) -> None:
        """A job has its result; `final` is False when it will be tried again."""
        with self._lock:
            if result.superseded or not (result.ok or final):
                return
            if result.ok:
                outcome = Release(DONE)
            else:
                outcome = Release(
                    FAILED, result.error, frame_error=bool(getattr(result, "frame_at_fault", False)),
                    model_fault=bool(getattr(result, "bad_prediction", False)),
                )
            self._last[job.output] = (job.source, job.signature, outcome)
            tickets = self._waiting.get(job.output, [])
            for ticket in list(tickets):
                if ticket.source != job.source:
                    continue
                if job.signature != ticket.signature and not job.queued_at > ticket.since:
                    continue  # an older version's job
                ticket._release(outcome)
                self._drop(ticket)

    def close(self) -> None:
        """The daemon is stopping: release every waiter, refuse new ones."""
        with self._lock:
            self._closed = True
            for tickets in self._waiting.values():
                for ticket in tickets:
                    ticket._release(Release(STOPPING, "the daemon stopped before the depth map was written"))
            self._waiting.clear()

    def _drop(self, ticket: Ticket) -> None:
        tickets = self._waiting.get(ticket.output)
        if tickets and ticket in tickets:
            tickets.remove(ticket)
            if not tickets:
                del self._waiting[ticket.output]
