"""What the HTTP API asks of the daemon (`api.Backend`): a frame's map, an image's map, giving up, health.

A mixin of `Daemon`, not a part of its own: the API, and a program that
embeds the daemon, ask these of the daemon itself. A frame's request goes
the watcher's own way into the queue (`intake`); an image in memory goes
straight to the pipeline and is written nowhere.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from depthwatch.daemon.waiters import MapWaiters, Ticket
from depthwatch.errors import FrameError
from depthwatch.frames.job import Job, signature_of
from depthwatch.frames.result import Result
from depthwatch.frames.rules import Rules
from depthwatch.frames.settings import Settings

if TYPE_CHECKING:
    from depthwatch.daemon.blackbox import BlackBox
    from depthwatch.daemon.intake import Intake
    from depthwatch.daemon.reporting import StatusReport
    from depthwatch.daemon.supervisor import Supervisor
    from depthwatch.frames.pipeline import Pipeline
    from depthwatch.model.engine import Engine


class ApiBackend:
    """The API's side of `Daemon` (see `api.Backend`); every method may be called from any thread."""

    rules: Rules
    black_box: BlackBox
    waiters: MapWaiters
    intake: Intake
    pipeline: Pipeline | None
    engine: Engine | None
    report: StatusReport
    supervisor: Supervisor
    settings: Settings
    stopping: bool

    def request_map(self, source: Path) -> Ticket:
        """A ticket released once the map of `source` as on disk now (or of a newer version) is written.

        The job goes through the watcher's own path; a version already queued,
        in flight or done is attached to, never run twice. FrameError if the
        frame's output would leave the allowed folders; FileNotFoundError if
        there is no such frame.
        """
        job = self.rules.job_for(source)  # the watcher's own job, roots and all
        with self.waiters.hold():
            signature = signature_of(source)
            if signature is None:
                raise FileNotFoundError(source)
            if self.black_box.holds(source, signature):
                raise FrameError(self.black_box.refusal(source))
            return self.waiters.attach(replace(job, signature=signature), self.intake.enqueue)

    def give_up(self, waited: Ticket | Future[Result]) -> None:
        """A request stopped waiting (out of time, its client gone, the daemon stopping).

        A frame's job goes on: it is the watcher's job too, and its map is
        wanted on disk. An image's job is stopped where it is: nobody else
        wants its map, and the model should move on to work someone waits for.
        """
        if isinstance(waited, Ticket):
            self.waiters.give_up(waited)
        elif self.pipeline is not None:
            self.pipeline.cancel(waited)

    def render_image(self, data: bytes, ext: str, png_bits: int | None = None, timeout: float | None = None) -> Future[Result]:
        """The depth map of image bytes in memory, encoded for `ext` (in `Result.data`); written nowhere.

        TimeoutError if it found no slot in the pipeline within `timeout`.
        """
        assert self.pipeline is not None
        settings = self.settings if png_bits is None else replace(self.settings, png_bits=png_bits)
        return self.pipeline.submit(Job.held(data, ext), settings, timeout=timeout)

    def health(self) -> tuple[bool, bytes]:
        """(serving, the status as JSON) as of now, as the supervisor judges it (`supervisor.verdict`).

        Read under the report's lock, and changes nothing: the status is the main loop's to change.
        """
        with self.report.lock:
            status = self.report.refresh()
            verdict = self.supervisor.verdict(status.state, status.health_error, self.stopping)
            data = status.as_dict()
        data["state"] = verdict.state
        if verdict.reason is not None:
            data["health_error"] = verdict.reason
        return verdict.serving, json.dumps(data, indent=2).encode() + b"\n"
