"""The daemon's lifecycle: startup -> main loop -> shutdown, and the signals, in one process, never forked.

Threads, and what each one does:
  main          acts on the signals (their handlers only record them), writes the status file
  inference     owns the ONNX Runtime session (see `engine`)
  observer      watchdog's; hands paths to the settler and returns
  settle        decides when a dropped file is complete, queues its job, watches the folders' health
  scan          scans a folder moved in, or watched again, for frames whose maps are missing
  workers (N)   read, decode, render, encode, write; the pipeline pulls queued jobs as slots free
  clip          one clip job at a time, after the live frames (see `daemon.clipthread`)
  api           only with `api.enabled`: waitress's loop and its request threads (see `api`)
Every one of them is joined on shutdown, which is bounded by
`daemon.shutdown_timeout_s`; the service definitions give it 5 s more before SIGKILL.
A second SIGTERM/SIGINT cuts that wait short but still unwinds: the status file
says "stopped", the threads that can end are joined.

`Daemon` builds the parts and wires them, in one place, as uvicorn's `Server`
does (the signals, the checks and lines before the watch, and the API's
listener are modules of their own: `signals`, `preflight`, `apistart`): the watcher, the intake (the way work gets in), the queue and the
pipeline, the engine, the clip runner, the API and its backend, the accounts
(what becomes of each result), the reporter (the status file kept current),
the config reload, and the supervisor (what each thread does, and health).
Each part is handed the callables, queues and parts it needs; none holds the
daemon or imports this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from depthwatch.config import Config
from depthwatch.daemon.accounting import Accounts
from depthwatch.daemon.apistart import start_api
from depthwatch.daemon.backend import ApiBackend
from depthwatch.daemon.blackbox import BlackBox
from depthwatch.daemon.clipthread import ClipRunner
from depthwatch.daemon.intake import Intake
from depthwatch.daemon.locks import FolderLocks
from depthwatch.daemon.modelhealth import ModelHealth
from depthwatch.daemon.notify import notify, watchdog_interval
from depthwatch.daemon.preflight import announce, sweep_leftovers, warn_of_clashes, writing
from depthwatch.daemon.reload import ConfigReload, make_watch_folders
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.retries import Retries
from depthwatch.daemon.signals import Signals
from depthwatch.daemon.status import Status, path_for
from depthwatch.daemon.supervisor import HEARTBEAT_S, Supervisor
from depthwatch.daemon.waiters import MapWaiters
from depthwatch.daemon.watcher import Watcher
from depthwatch.errors import EX_SOFTWARE, DepthwatchError
from depthwatch.frames.job import Job
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.rules import Rules
from depthwatch.frames.settings import Settings
from depthwatch.model import catalogue
from depthwatch.model.engine import Engine, SessionFactory
from depthwatch.model.spec import ModelInfo

if TYPE_CHECKING:
    from depthwatch.daemon.apiserver import ApiServer

log = logging.getLogger("depthwatch")

#: How long a reload waits for the old watcher's threads to end (a settle thread stuck in a `stat`
#: on a dead volume is left behind: the main loop, and with it SIGTERM, never waits on it).
WATCHER_STOP_S = 1.0
#: How often the lock files are touched (see `locks`).
_LOCK_REFRESH_S = 3600.0


class Daemon:
    """`depthwatch run`: call `run()` from the main thread; `request_stop()` from any thread.

    `loader` reads the config again for a live reload (the config file changed,
    or SIGHUP); without one the daemon keeps the config it was given.

    This is the one place the parts are built and wired (`__init__`, and
    `startup` for those that need the model): each is handed the callables,
    queues and parts it needs, and none holds the daemon.
    """

    def __init__(
        self,
        config: Config,
        *,
        loader: Callable[[], Config] | None = None,
        session_factory: SessionFactory | None = None,
        catch_crashes: bool = False,
    ) -> None:
        """`catch_crashes`: this process is the daemon itself, so a native crash may be written down (`blackbox`)."""
        self.config = config
        self._catch_crashes = catch_crashes
        self._session_factory = session_factory
        self._signals = Signals()
        self.locks = FolderLocks()
        self._locks_touched = time.monotonic()
        self._stop = threading.Event()
        #: A second stop request: shorten every remaining wait of the shutdown.
        self._force = threading.Event()
        self.settings = Settings.from_config(config, watching=True)
        self.engine: Engine | None = None
        self.pipeline: Pipeline | None = None
        self.queue: LatestWinsQueue[Job] = LatestWinsQueue(config.daemon.queue_size)
        self.rules = Rules(config.watch, config.output)
        self.watcher: Watcher | None = None
        #: Set by run(): a thread was still running after the shutdown's time bound.
        self.stuck = False
        #: The inference thread died, or a run could not be given up: the daemon stopped and exits
        #: EX_SOFTWARE (see `_watch_engine`).
        self.engine_failed = False
        self._heartbeat_at = 0.0
        self._watchdog_at = 0.0
        #: A reload's sweeps of dead writers' leftovers, each on a thread of its own (joined, bounded, at shutdown).
        self._sweeps: list[threading.Thread] = []
        #: Requests of the HTTP API waiting for a frame's map.
        self.waiters = MapWaiters()
        self.api: ApiServer | None = None
        #: The clip thread (clips matching watch.patterns become clip jobs).
        self.clips: ClipRunner | None = None
        #: What each thread works on, on disk beside the status: a frame that ends the process is named
        #: at the next start, and set aside if it ends a run again (`blackbox`).
        self.black_box = BlackBox(path_for(config))
        #: What every thread does and since when; health is read off it (`supervisor`).
        self.supervisor = Supervisor(self.black_box, lambda: self.config.daemon.stall_timeout_s)
        # The parts, wired: each gets what it reads as callables (what a reload replaces is read anew).
        self.retries: Retries
        self.accounts: Accounts
        self.report = StatusReport(
            Status(config=str(config.source) if config.source else None),
            path=lambda: path_for(self.config),
            own_folder=lambda: self.config.daemon.status_file is None,
            queue=self.queue,
            parked=lambda: self.retries.parked,
            superseded=lambda: self.accounts.superseded_in_flight,
            watcher=lambda: self.watcher,
            engine=lambda: self.engine,
            clips=lambda: self.clips,
            threads=self.supervisor.threads,
        )
        self.status = self.report.status
        self.report.on_new_model = self._new_model
        self.retries = Retries(
            report=self.report,
            waiters=self.waiters,
            watcher=lambda: self.watcher,
            stopping=lambda: self.stopping,
            retries=lambda: self.config.daemon.retries,
        )
        self.model_health = ModelHealth(self.report)
        self.accounts = Accounts(
            report=self.report,
            waiters=self.waiters,
            queue=self.queue,
            answering=lambda: self.api is not None,
            retries=self.retries,
            health=self.model_health,
        )
        self.intake = Intake(
            queue=self.queue,
            pipeline=lambda: self.pipeline,
            clips=lambda: self.clips,
            accounts=self.accounts,
            waiters=self.waiters,
            answering=lambda: self.api is not None,
            black_box=self.black_box,
            rules=lambda: self.rules,
            watcher=lambda: self.watcher,
            report=self.report,
            stopping=lambda: self.stopping,
        )
        self.reloads = ConfigReload(
            loader,
            config=lambda: self.config,
            engine=lambda: self.engine,
            report=self.report,
            locks=self.locks,
            queue=self.queue,
            rewatch=self._rewatch,
            adopt=self._adopt,
        )
        #: What the HTTP API asks of the daemon.
        self.backend = ApiBackend(
            rules=lambda: self.rules,
            black_box=self.black_box,
            waiters=self.waiters,
            enqueue=self.intake.enqueue,
            pipeline=lambda: self.pipeline,
            settings=lambda: self.settings,
            report=self.report,
            supervisor=self.supervisor,
            stopping=lambda: self.stopping,
        )

    # -- lifecycle ----------------------------------------------------------------

    def run(self) -> int:
        """The whole life of the daemon; 0 after a requested stop (one signal or two).

        Signals are captured only while this runs (from the main thread) and the
        previous handlers are put back when it returns. `stuck` says afterwards
        whether a thread could not be joined.
        """
        with self._signals.captured():
            if not self.startup():
                return 0  # stopped by a signal before it was ready: nothing was watched yet
            try:
                self.main_loop()
            finally:
                self.stuck = not self.shutdown()
        return EX_SOFTWARE if self.engine_failed else 0

    def _take_signals(self) -> None:
        """Act on what the signal handlers recorded since the last look (main thread only)."""
        stop, reload = self._signals.take()
        if stop:
            self.request_stop()
        if reload:
            self.reloads.ask()

    def _stop_asked(self) -> bool:
        """Whether a stop has been asked for, SIGTERM included (main thread: it takes the signals)."""
        if threading.current_thread() is threading.main_thread():
            self._take_signals()
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Stop (from another thread, or the main loop for SIGTERM/SIGINT). A second request forces a quick exit."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    def request_reload(self) -> None:
        """Reload the config at the main loop's next look (what SIGHUP asks for)."""
        self.reloads.ask()

    def reload_config(self, why: str) -> bool:
        """Read the config again and apply it now (main thread); on any error keep the last good config."""
        return self.reloads.reload_config(why)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _rewatch(self, rules: Rules, config: Config) -> None:
        """A reload's new watch: the old watcher stopped (bounded), the new one started, scanned on its own thread."""
        if self.watcher is not None:
            # Bounded: a settle thread stuck on a dead network volume is left behind, never waited for.
            self.watcher.stop(WATCHER_STOP_S)
        self.start_watching(rules, config, scan_now=False)

    def _adopt(self, config: Config, settings: Settings) -> None:
        """A reload's config and settings, read by the next frame."""
        self.settings = settings
        self.config = config

    def startup(self) -> bool:
        """Everything up to `ready`; False if a stop was asked for before then (it is then undone)."""
        config = self.config
        make_watch_folders(self.rules.roots)  # ConfigError (78): one it cannot make
        self.locks.hold(self.rules.roots, recursive=config.watch.recursive)  # AlreadyRunning: another daemon has one of them
        spec = catalogue.resolve(config.model, config.base)
        announce(config)
        # What the last run ended on, said before anything is mapped; a slot per thread that works on frames.
        self.black_box.open(self.supervisor.slots_on_disk(config.daemon.workers), crashes=self._catch_crashes)
        # `starting`, in the status file from now: a large model's first load takes a while, and
        # `depthwatch status` would meanwhile say "not running" (or show the last run's pid, stopped).
        self.report.touch()
        self.report.write()
        # The engine measurement never holds the start: it runs in idle time once frames are served.
        self.engine = Engine(spec, session_factory=self._session_factory, measure_providers="background")
        self.engine.note_run = self.supervisor.inference_note
        self.supervisor.watch(self.engine, self._hung)
        self.engine.start()
        try:
            info = self._wait_for_model()  # loaded exactly once, before the first job
        except BaseException as exc:
            self.engine.stop(self.config.daemon.shutdown_timeout_s, interrupt=True)
            self.locks.release()
            self._stopped_before_ready(str(exc) if isinstance(exc, DepthwatchError) else None)
            raise
        if info is None:
            log.info("stopped before the model was ready")
            # A session still being made cannot be stopped: leave without it (`stuck`), rather than
            # let the interpreter's exit tear the runtime down under it.
            self.stuck = not self.engine.stop(self.config.daemon.shutdown_timeout_s, interrupt=True)
            self.locks.release()
            self._stopped_before_ready(None)
            return False
        log.info("%s", info.describe())
        self.pipeline = Pipeline(
            self.engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness, on_stage=self.supervisor.worker
        )
        self.pipeline.feed(self.queue, lambda: self.settings, self.accounts.finished)
        self.clips = ClipRunner(
            self.engine, lambda: self.settings, self.intake.clip_gate, self.accounts.clip_finished, self.report.clip_progress,
            niceness=config.daemon.worker_niceness, slot=self.supervisor.slot("clip"), maxsize=config.daemon.queue_size,
        ).start()
        if config.api.enabled:
            try:
                self._start_api()  # before the watch, so a taken port stops nothing but the engine
            except BaseException as exc:
                self.clips.stop(1.0)
                self.pipeline.close(0.1)
                self.engine.stop()
                self.locks.release()
                if isinstance(exc, DepthwatchError):
                    self.status.config_error = str(exc)
                self._stopped_before_ready(None)  # not `starting` for good
                raise
        self.start_watching(self.rules, config)
        self.status.state = "running"
        self.status.config_loads = 1
        self.report.publish_model()
        self.report.write()
        log.info("ready: watching %d folder(s), writing %s", len(self.rules.roots), writing(self.rules.patterns, config.output))
        # systemd (Type=notify) holds `systemctl start` until now: the model is loaded, the API
        # listens and the folders are watched, so a bad model fails the start itself.
        notify("READY=1", f"STATUS=watching {len(self.rules.roots)} folder(s)")
        return True

    def _stopped_before_ready(self, error: str | None) -> None:
        """The status file says the start ended (and why, where the model failed), not `starting` for good."""
        self.status.state = "stopped"
        if error is not None:
            self.status.model_error = error
        self.report.touch()
        self.report.write()

    def _wait_for_model(self) -> ModelInfo | None:
        """The first load's result, or None if SIGTERM/SIGINT came while it loaded (main thread)."""
        assert self.engine is not None
        while True:
            self._take_signals()
            if self._stop.is_set():
                return None
            try:
                return self.engine.wait_ready(0.1)
            except TimeoutError:
                continue

    def _start_api(self) -> None:
        """The HTTP listener, once the model is ready."""
        api = start_api(self.backend, self.config.api, beat=self.supervisor.slot("api").beat)
        self.api = api
        self.status.api = api.url
        log.info("HTTP API on %s", api.url)

    def main_loop(self) -> None:
        while True:
            self._take_signals()
            if self._stop.wait(0.25):
                return
            self._take_signals()
            if not self._watch_engine():
                return
            self.reloads.poll()
            self.reloads.report_swap()
            self.intake.rescan_after_overflow()
            self.retries.retry_parked()
            self.accounts.report_superseded()
            self._beat()
            self.report.write()
            if time.monotonic() >= self._locks_touched + _LOCK_REFRESH_S:
                self._locks_touched = time.monotonic()
                self.locks.refresh()

    def start_watching(self, rules: Rules, config: Config, scan_now: bool = True) -> None:
        """Sweep the leftovers of dead writers, then watch `rules`' folders and scan them (startup, reload).

        `scan_now`: the start-up sweep and scan run here (before `ready`, cut short by a
        stop); a reload's run on threads of their own, so neither a large folder nor a
        dead volume holds the main loop (and with it SIGTERM).
        """
        if scan_now:
            sweep_leftovers(rules)
        else:
            sweep = threading.Thread(target=sweep_leftovers, args=(rules,), name="depthwatch-sweep", daemon=True)
            sweep.start()
            self._sweeps = [t for t in self._sweeps if t.is_alive()] + [sweep]
        warn_of_clashes(rules)
        self.rules = rules
        if self.watcher is not None:  # its count goes on in the new watcher's: counts never go backwards
            self.report.incomplete_before += self.watcher.incomplete
        self.watcher = Watcher(
            rules, config.watch, self.intake.on_complete, self.intake.on_unusable,
            slot=self.supervisor.slot("settle"), scan_slot=self.supervisor.slot("scan"),
        )
        self.watcher.start()
        self.status.watching = [str(r) for r in rules.roots]
        if not scan_now:
            for root in rules.roots:
                self.watcher.scan_later(root)
            return
        pending = self.watcher.scan_now(cancelled=self._stop_asked)
        if pending:
            log.info("%d frame(s) or clip(s) are waiting for their depth maps", pending)

    def _watch_engine(self) -> bool:
        """Say what the engine does now (a switch to a faster engine); False if it can serve no more.

        The supervisor gives up a run past the stall bound. A daemon whose
        inference thread is gone, or whose run could not be given up, maps
        nothing: it must not go on saying "running". The status and /health say
        why, and the process exits non-zero so its service manager restarts it.
        """
        engine = self.engine
        assert engine is not None
        self.supervisor.check()
        why = self.supervisor.stalled
        if why is None:
            if engine.info is not self.report.published or self.status.measuring != engine.measuring:
                self.report.publish_model()
            return True
        self.engine_failed = True
        if engine.alive:  # a run that cannot be given up: the supervisor said so; leave without waiting for it
            self._force.set()
            state = "stalled"
        else:
            log.error("%s; stopping, so that the service manager starts depthwatch again", why)
            state = "failed"
        with self.report.lock:
            self.status.health_error = why
            self.status.state = state
        self.report.touch()
        self.report.write()
        self._stop.set()
        return False

    def _new_model(self) -> None:
        """Another model serves: the model faults of the last one are not held against it, nor against the frames."""
        self.model_health.model_changed()
        forgotten = self.black_box.forget_hung()
        if forgotten:
            log.info("%d frame(s) the last model hung on may be mapped again (they are, once they change or are asked for)", forgotten)

    def _hung(self, label: object) -> None:
        """The model hangs on this frame (its run is being given up): set aside now, for this run and the next."""
        frame, version = label  # type: ignore[misc]
        self.black_box.hung(Path(frame), version)

    def _beat(self) -> None:
        """The heartbeat: the status rewritten every HEARTBEAT_S, idle or not; systemd's watchdog told all is well."""
        self.supervisor.slot("main").beat()
        now = time.monotonic()
        if now - self._heartbeat_at >= HEARTBEAT_S:
            self._heartbeat_at = now
            self.report.touch()
        interval = watchdog_interval()
        if interval is not None and now - self._watchdog_at >= interval / 2 and self.supervisor.stalled is None:
            self._watchdog_at = now
            notify("WATCHDOG=1")

    def shutdown(self) -> bool:
        """Stop taking work, finish the frames in flight (time-bounded), join every thread.

        Every wait is bounded by `daemon.shutdown_timeout_s` in all, and a second
        stop request cuts the rest short. False if a thread could not be joined (a
        write hung on a dead network volume, say): the caller must then leave
        without waiting for it.
        """
        deadline = time.monotonic() + self.config.daemon.shutdown_timeout_s

        def left() -> float:
            self._take_signals()  # a second SIGTERM cuts the rest short
            if self._force.is_set():
                return 0.1
            return max(0.1, deadline - time.monotonic())

        self.status.state = "stopping"
        self.report.touch()
        self.report.write()
        notify("STOPPING=1")
        self._stop.set()  # from now on the API answers 503 to new requests; it listens until api.close
        if self.watcher is not None:
            self.watcher.stop(left())
        dropped = self.queue.close()
        if dropped:
            log.info("%d queued frame(s) left for the next start", len(dropped))
        if self.clips is not None:
            self._wait(self.clips.stop, left)  # its temporary file goes; the clip is done again next start
        idle = True
        if self.pipeline is not None:
            idle = self._wait(self.pipeline.wait_idle, left)
            if not idle:
                why = "a second signal" if self._force.is_set() else f"{self.config.daemon.shutdown_timeout_s:g} s"
                log.warning("frames still in flight after %s; stopping anyway (the next start picks them up)", why)
        self.waiters.close()  # requests whose frames were left in the queue: 503
        if self.api is not None:
            self.api.close(left())
        if self.engine is not None:
            self.engine.stop(left(), interrupt=not idle)
        self.black_box.close()  # a stop, not a crash: no frame ended this run
        if self.pipeline is not None:
            self.pipeline.close(0.1)
        for sweep in self._sweeps:
            sweep.join(min(0.5, left()))
        self.accounts.report_superseded(final=True)
        stalled = self.supervisor.stalled is not None and self.engine is not None and self.engine.alive
        self.status.state = ("stalled" if stalled else "failed") if self.engine_failed else "stopped"
        self.report.touch()
        self.report.write()
        self.locks.release()
        ours = [t.name for t in threading.enumerate() if t.name.startswith("depthwatch") and t.is_alive()]
        if ours:
            log.warning("threads still running after shutdown: %s", ", ".join(ours))
        log.info("stopped")
        return not ours

    def _wait(self, until: Callable[[float], bool], left: Callable[[], float]) -> bool:
        """`until(timeout)` in short slices, so a second signal shortens the wait at once."""
        while True:
            remaining = left()
            if until(min(0.1, remaining)):
                return True
            if remaining <= 0.1:
                return False
