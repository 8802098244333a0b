"""What the HTTP API asks of the daemon (`api.Backend`): a frame's map, an image's map, giving up, health.

A small object of its own, built by the daemon with what it needs and no
more: the rules in force, the black box, the waiters, the one way into the
queue (`enqueue`), the pipeline, the settings, the status and the
supervisor's verdict. A frame's request goes the watcher's own way into the
queue (`intake`); an image in memory goes straight to the pipeline and is
written nowhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from depthwatch.daemon.blackbox import BlackBox
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.supervisor import Supervisor
from depthwatch.daemon.waiters import MapWaiters, Ticket
from depthwatch.errors import FrameError
from depthwatch.frames.job import Job, signature_of
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.result import Result
from depthwatch.frames.rules import Rules
from depthwatch.frames.settings import Settings


class ApiBackend:
    """The API's side of the daemon (see `api.Backend`); every method may be called from any thread."""

    def __init__(
        self,
        *,
        rules: Callable[[], Rules],
        black_box: BlackBox,
        waiters: MapWaiters,
        enqueue: Callable[[Job], bool],
        pipeline: Callable[[], Pipeline | None],
        settings: Callable[[], Settings],
        report: StatusReport,
        supervisor: Supervisor,
        stopping: Callable[[], bool],
    ) -> None:
        self._rules = rules
        self._black_box = black_box
        self._waiters = waiters
        self._enqueue = enqueue
        self._pipeline = pipeline
        self._settings = settings
        self._report = report
        self._supervisor = supervisor
        self._stopping = stopping

    @property
    def rules(self) -> Rules:
        return self._rules()

    @property
    def stopping(self) -> bool:
        return self._stopping()

    def request_map(self, source: Path) -> Ticket:
        """A ticket released once the map of `source` as on disk now (or of a newer version) is written.

        The job goes through the watcher's own path; a version already queued,
        in flight or done is attached to, never run twice. FrameError if the
        frame's output would leave the allowed folders; FileNotFoundError if
        there is no such frame.
        """
        job = self._rules().job_for(source)  # the watcher's own job, roots and all
        with self._waiters.hold():
            signature = signature_of(source)
            if signature is None:
                raise FileNotFoundError(source)
            if self._black_box.holds(source, signature):
                raise FrameError(self._black_box.refusal(source))
            return self._waiters.attach(replace(job, signature=signature), self._enqueue)

    def give_up(self, waited: Ticket | Future[Result]) -> None:
        """A request stopped waiting (out of time, its client gone, the daemon stopping).

        A frame's job goes on: it is the watcher's job too, and its map is
        wanted on disk. An image's job is stopped where it is: nobody else
        wants its map, and the model should move on to work someone waits for.
        """
        pipeline = self._pipeline()
        if isinstance(waited, Ticket):
            self._waiters.give_up(waited)
        elif pipeline is not None:
            pipeline.cancel(waited)

    def render_image(self, data: bytes, ext: str, png_bits: int | None = None, timeout: float | None = None) -> Future[Result]:
        """The depth map of image bytes in memory, encoded for `ext` (in `Result.data`); written nowhere.

        TimeoutError if it found no slot in the pipeline within `timeout`.
        """
        pipeline = self._pipeline()
        assert pipeline is not None
        settings = self._settings()
        if png_bits is not None:
            settings = replace(settings, png_bits=png_bits)
        return pipeline.submit(Job.held(data, ext), settings, timeout=timeout)

    def health(self) -> tuple[bool, bytes]:
        """(serving, the status as JSON) as of now, as the supervisor judges it (`supervisor.verdict`).

        Read under the report's lock, and changes nothing: the status is the main loop's to change.
        """
        with self._report.lock:
            status = self._report.refresh()
            verdict = self._supervisor.verdict(status.state, status.health_error, self._stopping())
            data = status.as_dict()
        data["state"] = verdict.state
        if verdict.reason is not None:
            data["health_error"] = verdict.reason
        return verdict.serving, json.dumps(data, indent=2).encode() + b"\n"
