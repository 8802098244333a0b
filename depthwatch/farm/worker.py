"""`depthwatch worker`: one Dask worker in this very process, one session, loaded once.

The model is loaded on the engine's inference thread before the worker even
connects to the scheduler (a bad model exits 78 and never shows up on the
farm), and frames go through the daemon's `Pipeline`: decoding and encoding on
its worker threads, `session.run` on the one inference thread. Dask runs the
tasks on a few executor threads that only hand frames to the pipeline and wait.

No nanny: Dask's nanny starts the worker as a child process, and a process
that forks after loading a GPU session is what depthwatch exists to avoid. The
worker here is started from Python, in this process, and nothing forks.

Stopping: SIGTERM or SIGINT only set a flag on the event loop. The worker then
pauses (the scheduler sends it nothing new), lets the tasks it holds finish
(bounded by `daemon.shutdown_timeout_s`), retires through the scheduler (so
results not yet collected move to another worker) and exits 0. A second signal
exits at once. Tasks it never finished are rescheduled by the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthwatch.config import Config
from depthwatch.daemon.status import Status
from depthwatch.errors import OutputError
from depthwatch.farm import require_distributed
from depthwatch.farm.tasks import PLUGIN, RESOURCE, FrameTask, FrameReport
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.frames.rules import map_is_current
from depthwatch.frames.writer import atomic_write
from depthwatch.logtext import shown
from depthwatch.model import catalogue
from depthwatch.model.engine import Engine

log = logging.getLogger("depthwatch")
frames_log = logging.getLogger("depthwatch.frames")


class FrameRunner:
    """The per-worker state tasks use: the engine (loaded once), the pipeline, the counts."""

    def __init__(self, engine: Engine, pipeline: Pipeline, status: Status, status_file: Path | None) -> None:
        self.engine = engine
        self.pipeline = pipeline  # bounds the frames in flight (decoded frames in memory) across tasks
        self.status = status
        self._status_file = status_file
        self._lock = threading.Lock()
        self._status_lock = threading.Lock()
        #: The model file's name, as maps' records name it: a map made with another model is not up to date here.
        self.model_name = Path(status.model).name if status.model else None

    def render(self, frames: Sequence[FrameTask], settings: Settings, force: bool, collect: bool = False) -> list[FrameReport]:
        """Run one task's frames through the pipeline (a Dask executor thread) and wait for them.

        `collect`: a shot-stable sequence's first pass; each frame stops after the
        model and its outcome carries what the client plans the shot from.
        """
        counts = self.status.counts
        address = self.status.address or ""
        outcomes: list[FrameReport] = []
        submitted = []
        with self._lock:
            counts.tasks += 1
        for frame in frames:
            source, output = Path(frame.source), Path(frame.output)
            if not force and map_is_current(source, output, settings.made_with, self.model_name):
                frames_log.info("%s -> %s up to date", source.name, output.name)
                outcomes.append(FrameReport(frame.index, up_to_date=True, line=f"{source.name}: up to date", worker=address))
                with self._lock:
                    counts.up_to_date += 1
                continue
            with self._lock:
                self.status.in_progress += 1
            future = self.pipeline.submit(frame.job(collect), settings)  # waits while the pipeline is full
            submitted.append((frame, future, time.monotonic()))
        for frame, future, started in submitted:
            result = future.result()
            if result.gone == "vanished" and not os.path.isdir(os.path.dirname(frame.source)):
                # Never there on this worker (farm.path_map, a storage not mounted here), not "vanished":
                # named as this worker sees it, since the client's line names the client's path.
                result.error = (
                    f"not found on this worker as {shown(frame.source)}: its folder is not there here; "
                    "check farm.path_map, and that the storage is mounted on every worker"
                )
            line = result.describe()
            changed = result.superseded and frame.signature is not None  # not the version its first pass saw
            with self._lock:
                self.status.in_progress -= 1
                if not result.ok and not changed:
                    counts.failed += 1
                    counts.last_error = line
                elif not collect and not changed:
                    counts.done += 1
                    counts.last_frame = str(frame.source)  # as the daemon's status says it
            if changed:
                frames_log.info("%s, since its first pass: not mapped from that pass", line)
            elif not result.ok:
                log.error("%s", line)
            elif collect:
                frames_log.debug("%s (first pass of a shot-stable sequence)", line)
            else:
                frames_log.info("%s total %.1f", line, (time.monotonic() - started) * 1000)
            if collect and result.ok:
                kind = self.engine.wait_ready().profile.predicts
                outcomes.append(
                    FrameReport(
                        frame.index, line=line, worker=address, summary=result.summary, prediction=result.prediction,
                        kind=kind, signature=result.signature,
                    )
                )
            else:
                outcomes.append(FrameReport(frame.index, result.error, line=line, worker=address, changed=changed))
        self.write_status()
        return sorted(outcomes, key=lambda o: o.index)

    def metrics(self, worker: Any = None) -> dict[str, Any]:
        """Sent to the scheduler with each heartbeat: the dashboard's worker pages show it."""
        with self._lock:
            return self.status.as_dict()

    def write_status(self, state: str | None = None) -> None:
        if state is not None:
            self.status.state = state
        if self._status_file is None:
            return
        with self._status_lock:  # snapshot and write as one, so an older snapshot never lands last
            with self._lock:
                data = self.status.to_json()
            try:
                atomic_write(self._status_file, data)
            except OutputError as exc:
                log.warning("status file: %s", exc)


def serve(config: Config, scheduler: str, *, threads: int | None = None, name: str | None = None, status_file: Path | None = None) -> int:
    """Load the model, join the farm, run tasks until stopped; the process's exit code."""
    require_distributed()
    import dask

    # Nothing here may start a process: no nanny, and Dask's own helpers told so too.
    dask.config.set({"distributed.worker.daemon": False, "distributed.worker.profile.enabled": False})
    logging.getLogger("distributed").setLevel(logging.WARNING)
    _before_the_model()
    spec = catalogue.resolve(config.model, config.base)
    engine = Engine(spec).start()
    try:
        info = engine.wait_ready()  # loaded exactly once, before the worker joins the farm
    except BaseException:
        engine.stop()
        raise
    loaded_at = time.time()
    log.info("%s", info.describe())
    pipeline = Pipeline(engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)
    status = Status(
        scheduler=scheduler,
        model=str(info.spec.path),
        profile=info.profile.name,
        providers=list(info.providers),
        precision=info.arithmetic,
        contract=info.contract.describe(),
        model_loads=engine.load_count,
        loaded_at=loaded_at,
    )
    runner = FrameRunner(engine, pipeline, status, status_file)
    runner.write_status()
    threads = threads or max(2, config.daemon.workers)
    try:
        return asyncio.run(_run_worker(runner, scheduler, threads, name, config.daemon.shutdown_timeout_s))
    finally:
        pipeline.close(config.daemon.shutdown_timeout_s)
        engine.stop(config.daemon.shutdown_timeout_s)
        status.model_loads = engine.load_count
        runner.write_status("stopped")
        log.info("stopped")


def _before_the_model() -> None:
    """What Dask would otherwise do by starting a process once the model is loaded.

    When a worker registers, Dask sends the scheduler its versions, which ask
    `platform.uname().processor`: on Linux that runs `uname -p` in a child
    process, once, then caches it. Done here, before the session exists, so the
    worker never forks after its model is loaded.
    """
    from distributed.versions import get_versions

    get_versions()


async def _run_worker(runner: FrameRunner, scheduler: str, threads: int, name: str | None, shutdown_timeout: float) -> int:
    from distributed import Worker
    from distributed.core import Status
    from distributed.diagnostics.plugin import WorkerPlugin

    class DepthwatchPlugin(WorkerPlugin):
        """How tasks find this process's runner: `get_worker().plugins['depthwatch'].runner`."""

        name = PLUGIN

        def __init__(self, frame_runner: FrameRunner) -> None:
            self.runner = frame_runner

        def setup(self, worker: Worker) -> None:
            self.runner.status.address = worker.address

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            os.write(2, b"depthwatch: second signal, exiting at once\n")
            os._exit(0)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    worker = Worker(
        scheduler,
        nthreads=threads,
        name=name,
        plugins=(DepthwatchPlugin(runner),),
        metrics={"depthwatch": runner.metrics},
        resources={RESOURCE: threads},
        memory_limit=0,  # no memory monitor: it would pause and unpause the worker on its own
        dashboard=False,
        nanny=None,
    )
    log.info("joining the farm at %s", scheduler)
    started = asyncio.ensure_future(worker.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({started, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        log.info("stopped before the scheduler at %s answered", scheduler)
        started.cancel()
        await worker.close(reason="stopped before it connected")
        return 0
    started.result()
    runner.write_status("running")
    log.info("ready: worker %s on scheduler %s, %d task threads", worker.address, scheduler, threads)
    finished = asyncio.ensure_future(worker.finished())
    await asyncio.wait({finished, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if finished.done():
        stopped.cancel()
        runner.write_status("disconnected")
        log.error("lost the scheduler at %s; exiting (start the worker again, or let the service manager, to rejoin)", scheduler)
        return 1
    runner.write_status("stopping")
    log.info("stopping: finishing the tasks in hand")
    worker.status = Status.paused  # the scheduler sends nothing new; what it queued here moves elsewhere
    deadline = loop.time() + shutdown_timeout
    while worker.state.executing_count and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if worker.state.executing_count:
        log.warning("tasks still running after %.0f s; stopping anyway (the scheduler runs them elsewhere)", shutdown_timeout)
    try:
        await asyncio.wait_for(worker.close_gracefully(reason="depthwatch worker stopped"), shutdown_timeout)
    except Exception as exc:  # the scheduler went away meanwhile: close without it
        log.warning("could not retire through the scheduler (%s); closing", exc or type(exc).__name__)
        await worker.close(reason="depthwatch worker stopped")
    return 0
