"""The daemon's lifecycle: startup -> main loop -> shutdown, in one process, never forked.

Threads, and what each one does:
  main          acts on the signals (their handlers only record them), writes the status file
  inference     owns the ONNX Runtime session (see `engine`)
  observer      watchdog's; hands paths to the settler and returns
  settle        decides when a dropped file is complete, queues its job, watches the folders' health
  scan          scans a folder moved in, or watched again, for frames whose maps are missing
  workers (N)   read, decode, render, encode, write; the pipeline pulls queued jobs as slots free
  clip          one clip job at a time, after the live frames (see `daemon.clips`)
  api           only with `api.enabled`: waitress's loop and its request threads (see `api`)
Every one of them is joined on shutdown, which is bounded by
`daemon.shutdown_timeout_s`; the service definitions give it 5 s more before SIGKILL.
A second SIGTERM/SIGINT cuts that wait short but still unwinds: the status file
says "stopped", the threads that can end are joined.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from depthwatch.clips.job import ClipJob, ClipResult
from depthwatch.config import Config, ModelConfig
from depthwatch.daemon.clips import ClipRunner
from depthwatch.daemon.locks import FolderLocks
from depthwatch.daemon.notify import notify
from depthwatch.daemon.parked import Parked
from depthwatch.daemon.status import (
    Status,
    is_running,
    path_for,
    read_status,
    write_status,
)
from depthwatch.daemon.waiters import MapWaiters, Ticket
from depthwatch.daemon.watcher import Watcher
from depthwatch.errors import EX_SOFTWARE, ConfigError, DepthwatchError, FrameError, OutputError
from depthwatch.frames import provenance
from depthwatch.frames.job import Job, Signature, signature_of
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.errorrecords import write_error_record
from depthwatch.frames.frameline import STAGES
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.result import Result
from depthwatch.frames.settings import Settings
from depthwatch.frames.rules import Rules, template_clashes
from depthwatch.frames.writer import sweep_temp_files_below
from depthwatch.logtext import shown
from depthwatch.model import catalogue
from depthwatch.model.engine import Engine, SessionFactory
from depthwatch.model.spec import ModelInfo

if TYPE_CHECKING:
    from depthwatch.daemon.api import ApiServer

log = logging.getLogger("depthwatch")
frames_log = logging.getLogger("depthwatch.frames")

_RETRY_MAX_DELAY = 60.0
#: Unusable predictions in a row (NaN, a constant) after which the status shows a health error.
BAD_PREDICTIONS_UNHEALTHY = 5
#: How often the lock files are touched (see `locks`).
_LOCK_REFRESH_S = 3600.0
#: Superseded frames are summarised in one log line at most this often.
SUPERSEDED_SUMMARY_S = 5.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_NONE = object()
#: A clip job's progress reaches the status file at most this often.
CLIP_STATUS_S = 1.0
_SUPERSEDED_STAGES = ("replaced while queued", "before inference", "after inference had started")


def _stamp_of(path: Path) -> tuple[int, ...] | None:
    """The config file as given and what it leads to: relinking a symlink, or replacing
    the link or its target, changes one of the two. (A frame's version is its `signature`.)"""
    try:
        link, st = os.lstat(path), os.stat(path)
    except OSError:
        return None
    return link.st_ino, link.st_mtime_ns, link.st_ctime_ns, st.st_ino, st.st_mtime_ns, st.st_size


def _make_folders(roots: Iterable[Path]) -> None:
    """Make each watch folder whose parent is there (a folder on a volume not mounted yet is
    waited for instead); ConfigError, one line, for one that cannot be made."""
    for root in roots:
        if root.exists() or not root.parent.is_dir():
            continue
        try:
            root.mkdir()
        except FileExistsError:
            pass  # made meanwhile, or a dangling link: the watcher says which
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            raise ConfigError(
                f"cannot make the watch folder {shown(root)}: {reason}; make it yourself or fix the permissions of {shown(root.parent)}"
            ) from None


#: The output settings `Rules` is made from (besides the watch section): a change to any of
#: them makes new Rules, or a frame or clip would still get yesterday's name or format.
_RULES_OUTPUT = ("template", "clip_template", "png_bits", "error_sidecar")


def _rules_of(config: Config) -> tuple[object, ...]:
    """What `Rules(config.watch, config.output)` depends on."""
    return (config.watch, *(getattr(config.output, name) for name in _RULES_OUTPUT))


def _model_file_key(model: ModelConfig, base: Path) -> tuple[object, ...] | None:
    """The model file a section names, as it is on disk now: path, device, inode, size, mtime.

    A model fixed in place, or fetched again, has another key, so a reload
    loads it again even if the config text did not change. None: no such file.
    """
    try:
        path = catalogue.configured_file(model, base)
        st = os.stat(path)
    except (OSError, DepthwatchError):
        return None
    return str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Daemon:
    """`depthwatch run`: call `run()` from the main thread; `request_stop()` from any thread.

    `loader` reads the config again for a live reload (the config file changed,
    or SIGHUP); without one the daemon keeps the config it was given.
    """

    def __init__(
        self,
        config: Config,
        *,
        loader: Callable[[], Config] | None = None,
        session_factory: SessionFactory | None = None,
    ) -> None:
        self.config = config
        self._loader = loader
        self._session_factory = session_factory
        self._reload = threading.Event()
        #: Signal number -> the frame it interrupted, as left by the handlers (see `_capture_signals`).
        self._caught: dict[int, object] = {}
        self._config_stamp = _stamp_of(config.source) if config.source else None
        self._config_settling: tuple[int, ...] | None = None
        self._locks = FolderLocks()
        self._locks_touched = time.monotonic()
        self._swap: Future[ModelInfo] | None = None
        #: The model section in service and its file's key when it was loaded (see
        #: `_model_file_key`); and those of the swap under way.
        self._serving: tuple[ModelConfig, tuple[object, ...] | None] = (config.model, _model_file_key(config.model, config.base))
        self._swap_for = self._serving
        self._stop = threading.Event()
        #: A second stop request: shorten every remaining wait of the shutdown.
        self._force = threading.Event()
        self._lock = threading.Lock()
        self.status = Status(config=str(config.source) if config.source else None)
        self._status_dirty = True
        self._attempts: dict[Path, int] = {}
        #: Unusable predictions since the last good map (see BAD_PREDICTIONS_UNHEALTHY).
        self._bad_predictions = 0
        #: Frames whose tries ran out on an output error, by output folder (see `Parked`).
        self._parked = Parked()
        self._settings = Settings.from_config(config, watching=True)
        self.engine: Engine | None = None
        self.pipeline: Pipeline | None = None
        self.queue = LatestWinsQueue(config.daemon.queue_size)
        self.rules = Rules(config.watch, config.output)
        self.watcher: Watcher | None = None
        self._last_overflow_scan = 0.0
        self._overflow_reported = False
        self._superseded_in_flight = 0
        #: Superseded frames since the last summary line, by how far they got, and when
        #: the first of them came (monotonic; None: none unreported).
        self._superseded_unreported = dict.fromkeys(_SUPERSEDED_STAGES, 0)
        self._superseded_since: float | None = None
        self._queue_superseded_seen = 0
        #: Set by run(): a thread was still running after the shutdown's time bound.
        self.stuck = False
        #: The inference thread died: the daemon stopped and exits EX_SOFTWARE (see `_watch_engine`).
        self.engine_failed = False
        #: The model info last written to the status (a switch of engine shows as a new one).
        self._published: ModelInfo | None = None
        #: Requests of the HTTP API waiting for a frame's map.
        self.waiters = MapWaiters()
        self.api: ApiServer | None = None
        #: The clip thread (clips matching watch.patterns become clip jobs).
        self.clips: ClipRunner | None = None
        self._clip_status_at = 0.0
        self._clip_status_phase: str | None = None

    # -- lifecycle ----------------------------------------------------------------

    def run(self) -> int:
        """The whole life of the daemon; 0 after a requested stop (one signal or two).

        Signals are captured only while this runs (from the main thread) and the
        previous handlers are put back when it returns. `stuck` says afterwards
        whether a thread could not be joined.
        """
        with self._capture_signals():
            if not self.startup():
                return 0  # stopped by a signal before it was ready: nothing was watched yet
            try:
                self.main_loop()
            finally:
                self.stuck = not self.shutdown()
        return EX_SOFTWARE if self.engine_failed else 0

    @contextmanager
    def _capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # embedded in a test or another program: its owner stops us
            return
        # The handler is a builtin (dict.__setitem__), not Python code: no frame of ours runs
        # per signal, so a flood of them can neither nest handlers (RecursionError, "lost
        # sys.stderr") nor re-enter a lock a handler holds (a deadlock of the main thread).
        # It only records that the signal came; the main loop acts on it (`_take_signals`),
        # so a thousand SIGHUPs between two looks are one reload.
        handler = self._caught.__setitem__
        previous = {sig: signal.signal(sig, handler) for sig in (*_STOP_SIGNALS, signal.SIGHUP)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            self._caught.clear()

    def _take_signals(self) -> None:
        """What the signal handlers recorded since the last look (main thread only)."""
        caught = self._caught
        if not caught:
            return
        for sig in _STOP_SIGNALS:
            if caught.pop(sig, _NONE) is not _NONE:
                self.request_stop()
        if caught.pop(signal.SIGHUP, _NONE) is not _NONE:
            self._reload.set()

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
        self._reload.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def startup(self) -> bool:
        """Everything up to `ready`; False if a stop was asked for before then (it is then undone)."""
        config = self.config
        _make_folders(self.rules.roots)  # ConfigError (78): one it cannot make
        self._locks.hold(self.rules.roots, recursive=config.watch.recursive)  # AlreadyRunning: another daemon has one of them
        spec = catalogue.resolve(config.model, config.base)
        self._announce(config)
        # The engine measurement never holds the start: it runs in idle time once frames are served.
        self.engine = Engine(spec, session_factory=self._session_factory, measure_providers="background").start()
        try:
            info = self._wait_for_model()  # loaded exactly once, before the first job
        except BaseException:
            self.engine.stop(self.config.daemon.shutdown_timeout_s, interrupt=True)
            self._locks.release()
            raise
        if info is None:
            log.info("stopped before the model was ready")
            # A session still being made cannot be stopped: leave without it (`stuck`), rather than
            # let the interpreter's exit tear the runtime down under it.
            self.stuck = not self.engine.stop(self.config.daemon.shutdown_timeout_s, interrupt=True)
            self._locks.release()
            return False
        log.info("%s", info.describe())
        self.pipeline = Pipeline(self.engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)
        self.pipeline.feed(self.queue, lambda: self._settings, self._finished)
        self.clips = ClipRunner(
            self.engine, lambda: self._settings, self._clip_gate, self._clip_finished, self._clip_progress,
            niceness=config.daemon.worker_niceness,
        ).start()
        if config.api.enabled:
            try:
                self._start_api()  # before the watch, so a taken port stops nothing but the engine
            except BaseException:
                self.clips.stop(1.0)
                self.pipeline.close(0.1)
                self.engine.stop()
                raise
        self._start_watching(self.rules, config)
        self.status.state = "running"
        self.status.config_loads = 1
        self._publish_model()
        self._write_status()
        log.info("ready: watching %d folder(s), writing %s", len(self.rules.roots), config.output.template)
        # systemd (Type=notify) holds `systemctl start` until now: the model is loaded, the API
        # listens and the folders are watched, so a bad model fails the start itself.
        notify("READY=1", f"STATUS=watching {len(self.rules.roots)} folder(s)")
        return True

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
        """The HTTP listener, once the model is ready (imported only when enabled: an extra)."""
        try:
            from depthwatch.daemon.api import ApiServer
        except ImportError as exc:
            raise ConfigError(
                f"api.enabled needs the api extra ({exc.name} is missing); run: pip install 'depthwatch[api]'"
            ) from None
        api = ApiServer(self, self.config.api)
        try:
            api.start()
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {self.config.api.host}:{self.config.api.port}: {exc.strerror or exc}; "
                "stop whatever uses that port (the old server?) or change api.port"
            ) from None
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
            self._poll_config()
            self._report_swap()
            self._rescan_after_overflow()
            self._retry_parked()
            self._report_superseded()
            self._write_status()
            if time.monotonic() >= self._locks_touched + _LOCK_REFRESH_S:
                self._locks_touched = time.monotonic()
                self._locks.refresh()

    def _announce(self, config: Config) -> None:
        """Which config and which status file, first thing: the answers to "why is it doing that?"."""
        path = path_for(config)
        log.info("config %s; status file %s", config.source or "built-in defaults", path)
        if config.daemon.status_file is None:  # the default one lives in a folder of ours
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.warning("status file: cannot create %s: %s", path.parent, exc.strerror or exc)
        try:
            previous = read_status(path)
        except OSError:
            return  # none yet (or unreadable: writing it says so)
        except ValueError as exc:
            log.warning("status file %s is not one depthwatch wrote (%s); it is replaced by this daemon's", shown(path), exc)
            return
        if previous.get("pid") != os.getpid() and is_running(previous):
            log.warning(
                "another depthwatch (pid %s) is running with this config and writes %s; "
                "both would process the same frames: stop one (see `depthwatch status`)",
                previous.get("pid"), path,
            )

    def _start_watching(self, rules: Rules, config: Config) -> None:
        for folder in rules.output_folders():  # the watch folders and the folders outputs go to
            swept, left = sweep_temp_files_below([folder], recursive=rules.recursive and folder in rules.roots)
            if swept:
                log.info("removed %d temporary file(s) left in %s", swept, shown(folder))
            if left:
                log.warning("cannot remove %d temporary file(s) left in %s (is the folder writable?)", left, shown(folder))
        for pattern in template_clashes(rules.patterns, rules.template):
            log.warning(
                "watch.patterns %s and output.template %s clash: every %s file looks like a depth map, so none "
                "is mapped, and a map may take the name of one; depthwatch never replaces a file it did not make "
                "(it logs an error instead): change output.template or the patterns",
                pattern, rules.template, pattern,
            )
        self.rules = rules
        self.watcher = Watcher(rules, config.watch, self._on_complete, self._on_unusable)
        self.watcher.start()
        self.status.watching = [str(r) for r in rules.roots]
        pending = self.watcher.scan(cancelled=self._stop_asked)
        if pending:
            log.info("%d frame(s) are waiting for their depth maps", pending)

    # -- live reload --------------------------------------------------------------

    def _poll_config(self) -> None:
        """Reload on SIGHUP, or once the config file has changed and stopped changing."""
        if self._reload.is_set():
            self._reload.clear()
            self.reload("SIGHUP")
            return
        path = self.config.source
        if path is None or self._loader is None:
            return
        stamp = _stamp_of(path)
        if stamp == self._config_stamp:
            self._config_settling = None
        elif stamp != self._config_settling:
            self._config_settling = stamp  # an editor may still be writing: look again next time
        else:
            self._config_stamp, self._config_settling = stamp, None
            self.reload(f"{path.name} changed")

    def reload(self, why: str) -> bool:
        """Read the config again and apply it; on any error keep the last good config."""
        if self._loader is None:
            return False
        try:
            new = self._loader()
        except ConfigError as exc:
            self.status.config_error = str(exc)
            self._status_dirty = True
            log.error("%s; keeping the last good config", exc)
            return False
        log.info("reloading the config (%s)", why)
        self.apply(new)
        return True

    def apply(self, new: Config) -> None:
        """Apply a valid config: watch and output settings for the next frame, a new model by swap."""
        old = self.config
        self.status.config_error = None
        self._apply_model(new)
        if _rules_of(new) != _rules_of(old):
            rules = Rules(new.watch, new.output)
            try:
                _make_folders(rules.roots)
                self._locks.hold(rules.roots, recursive=new.watch.recursive)
            except DepthwatchError as exc:
                log.error("%s; keeping the watch folders of the last good config", exc)
                self.status.config_error = str(exc)
                new = replace(new, watch=old.watch, output=replace(new.output, **{name: getattr(old.output, name) for name in _RULES_OUTPUT}))
        if _rules_of(new) != _rules_of(old):
            if self.watcher is not None:
                self.watcher.stop()
            self._start_watching(Rules(new.watch, new.output), new)
        if (new.daemon.workers, new.daemon.worker_niceness) != (old.daemon.workers, old.daemon.worker_niceness):
            log.warning("daemon.workers and daemon.worker_niceness take effect at the next start")
        if new.daemon.queue_size != old.daemon.queue_size:
            self.queue.maxsize = new.daemon.queue_size  # read under the queue's lock by each put
            log.info("daemon.queue_size is now %d", new.daemon.queue_size)
        if new.api != old.api:
            log.warning("the api settings take effect at the next start")
            new = replace(new, api=old.api)
        self._settings = Settings.from_config(new, watching=True)
        logging.getLogger("depthwatch").setLevel(new.daemon.log_level.upper())
        self.config = new
        self.status.config_loads += 1
        self._status_dirty = True

    def _apply_model(self, new: Config) -> None:
        """Swap the model in if the config names another one, or its file changed since it was loaded.

        A model that failed to load is tried again at every reload once its
        file has changed (fixed in place, fetched again), even when the config
        text is the same: the status keeps the reason (`model_error`) until a
        load succeeds or the config goes back to the model in service.
        """
        serving, serving_key = self._serving
        key = _model_file_key(new.model, new.base)
        if (new.model, key) == (serving, serving_key):
            self.status.model_error = None  # the model in service is the one asked for
            return
        if self._swap is not None and self._swap_for == (new.model, key):
            return  # that very load is under way
        if new.model == serving and self._swap is None and self.status.model_error is None and key is not None:
            log.info("model file %s changed; loading it again", shown(new.model.path))
        try:
            spec = catalogue.resolve(new.model, new.base)
        except DepthwatchError as exc:
            log.error("%s; keeping model %s", exc, serving.path)
            self.status.config_error = self.status.model_error = str(exc)
            return
        assert self.engine is not None
        self._swap = self.engine.reload(spec)  # the main loop reports it when done
        self._swap_for = (new.model, key)

    def _watch_engine(self) -> bool:
        """Say what the engine does now (a switch to a faster engine); False if its thread has died.

        A daemon whose inference thread is gone maps nothing: it must not go on
        saying "running". The status and /health say why, and the process exits
        non-zero so its service manager restarts it.
        """
        engine = self.engine
        assert engine is not None
        if engine.alive:
            if engine.info is not self._published or self.status.measuring != engine.measuring:
                self._publish_model()
            return True
        self.engine_failed = True
        why = engine.failure or "the inference thread ended"
        log.error("%s; stopping, so that the service manager starts depthwatch again", why)
        self.status.health_error = why
        self.status.state = "failed"
        self._status_dirty = True
        self._write_status()
        self._stop.set()
        return False

    def _report_swap(self) -> None:
        """Once a model swap has finished on the inference thread, say so (main thread)."""
        swap = self._swap
        if swap is None or not swap.done():
            return
        self._swap = None
        if swap.exception() is not None:
            # The engine logged it and kept the old model.
            self.status.config_error = self.status.model_error = str(swap.exception())
        else:
            self._serving = self._swap_for
            self.status.model_error = None
            log.info("now using %s", swap.result().describe())
            self._publish_model()
        self._status_dirty = True

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
        self._status_dirty = True
        self._write_status()
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
        if self.pipeline is not None:
            self.pipeline.close(0.1)
        self._report_superseded(final=True)
        self.status.state = "failed" if self.engine_failed else "stopped"
        self._status_dirty = True
        self._write_status()
        self._locks.release()
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

    # -- frames -------------------------------------------------------------------

    def _on_complete(self, source: Path, signature: Signature, fmt: str | None = None) -> None:
        """A complete frame (settle thread): make its job, queue it, let the pipeline pull it."""
        rules = self.rules
        if not rules.is_clip(source) and provenance.read(source) is not None:
            with self._lock:
                self.status.counts.own_maps += 1
            self._status_dirty = True
            log.warning(
                "%s carries depthwatch's record (a depth map, or an image saved from one); not taken as a frame",
                shown(source),
            )
            return
        if rules.is_clip(source):  # a clip job, on the clip thread
            try:
                output = rules.clip_output_for(source)
            except FrameError as exc:
                self._count_failure(f"{shown(source)}: {exc}")
                return
            if self.clips is not None:
                self.clips.submit(ClipJob(source, output, signature, rules.output_roots(source)))
                self._status_dirty = True
            return
        try:
            job = rules.job_for(source, signature, fmt)
        except FrameError as exc:
            self._count_failure(f"{shown(source)}: {exc}")
            return
        if self.api is None:
            self._enqueue(job)
            return
        with self.waiters.hold():
            if self.waiters.absorb(source, signature):
                log.debug("%s: the watcher found the version a request already queued", source.name)
                return
            if signature_of(source) != signature:
                return  # changed since: that newer version comes by its own event or request
            self._enqueue(job)

    def _enqueue(self, job: Job) -> bool:
        queued = self.queue.put(job)
        if queued and self.pipeline is not None:
            self.pipeline.pull()
        if not queued and not self._stop.is_set():
            if self.watcher is not None:
                self.watcher.forget(job.source)  # so the rescan hands it over again
            if not self._overflow_reported:
                self._overflow_reported = True
                log.warning("queue full (%d frames); the frames beyond it will be picked up by a rescan", self.queue.maxsize)
        self._status_dirty = True
        return queued

    # -- what the HTTP API asks for ------------------------------------------------

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
            return self.waiters.attach(replace(job, signature=signature), self._enqueue)

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
        settings = self._settings if png_bits is None else replace(self._settings, png_bits=png_bits)
        return self.pipeline.submit(Job.held(data, ext), settings, timeout=timeout)

    def health(self) -> tuple[bool, bytes]:
        """(serving, the status file's JSON) as of now; not serving once the inference thread is gone."""
        self._refresh_status()
        engine_ok = self.engine is not None and self.engine.alive
        if not engine_ok and self.status.health_error is None and self.engine is not None:
            self.status.health_error = self.engine.failure or "the inference thread ended"
        return self.status.state == "running" and engine_ok and not self._stop.is_set(), self.status.to_json()

    def _on_unusable(self, source: Path, reason: str) -> None:
        """A file the watcher will not hand over (never completed, forbidden link): report it."""
        self._count_failure(f"{shown(source)}: {reason}")
        try:
            job = self.rules.job_for(source)
        except FrameError:
            return
        if job.error_record is not None:
            write_error_record(job.error_record, source, reason, job.output_roots)

    def _finished(self, job: Job, result: Result) -> None:
        """A job's result (worker thread): count it, log its line, retry an output error later."""
        # One step for a request (see waiters): the job in flight, or its result known and let go by the queue.
        with self.waiters.hold():
            retrying = not result.ok and not result.superseded and result.retryable and self._retry(job, result)
            if self.api is not None:
                self.waiters.finished(job, result, final=not retrying)
            self.queue.settled(job)
        counts = self.status.counts
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
            frames_log.info("%s total %.1f queue %d%s", result.describe(), latency_ms, len(self.queue), result.shot_note())
        elif result.superseded:
            with self._lock:
                self._superseded_in_flight += 1
                stage = "after inference had started" if result.inferred else "before inference"
                self._superseded_unreported[stage] += 1
                if self._superseded_since is None:
                    self._superseded_since = time.monotonic()
            frames_log.debug("%s", result.describe())  # summarised by _report_superseded
        elif retrying:
            pass
        elif result.retryable and not self._stop.is_set() and self._park(job):
            self._count_failure(f"{result.describe()}; made again once {shown(job.output.parent)} can be written")
        else:
            self._count_failure(result.describe())
        if result.ok:
            self._parked.written(job.output.parent, job.source)
        self._status_dirty = True

    # -- clips --------------------------------------------------------------------

    def _clip_gate(self) -> None:
        """Live frames first (clip thread): a clip's next frame waits while a frame is queued or in flight."""
        pipeline = self.pipeline
        while pipeline is not None and not self._stop.is_set() and (len(self.queue) or pipeline.pending):
            pipeline.wait_idle(0.05)

    def _clip_progress(self) -> None:
        """A clip frame done (clip thread): the status file says so at most once a second.

        Rewriting it is an fsync; four a second of those would slow the live frames'
        own fsyncs, which share the filesystem's journal.
        """
        now = time.monotonic()
        progress = self.clips.progress if self.clips is not None else None
        phase = progress.phase if progress is not None else None
        if now - self._clip_status_at >= CLIP_STATUS_S or phase != self._clip_status_phase:
            self._clip_status_at, self._clip_status_phase = now, phase
            self._status_dirty = True

    def _clip_finished(self, job: ClipJob, result: ClipResult) -> None:
        """A clip job's end (clip thread): its log line and counts."""
        if result.ok:
            with self._lock:
                self.status.counts.clips += 1
            log.info("clip %s", result.describe())
            self._parked.written(job.final.parent, job.source)
        elif result.superseded:
            log.info("clip %s: %s", shown(job.source.name), result.error)
        elif result.retryable and self.watcher is not None and not self._stop.is_set() and self._park_clip(job):
            self._count_failure(f"clip {result.describe()}; made again once {shown(job.final.parent)} can be written")
        else:
            self._count_failure(f"clip {result.describe()}")
        self._status_dirty = True

    def _model_health(self, result: Result) -> None:
        """Several unusable predictions in a row are the model's fault, not the frames': say so in the status."""
        if result.superseded:
            return
        with self._lock:
            if result.ok:
                if self.status.health_error is not None:
                    log.info("the model's predictions are usable again; health error cleared")
                self._bad_predictions = 0
                self.status.health_error = None
                return
            if not result.bad_prediction:
                return
            self._bad_predictions += 1
            count = self._bad_predictions
            if count < BAD_PREDICTIONS_UNHEALTHY:
                return
            first = self.status.health_error is None
            self.status.health_error = (
                f"the model's last {count} predictions were unusable ({result.error}); "
                "check the model file and model.providers (try providers: [cpu])"
            )
        if first:
            log.error("%s", self.status.health_error)

    def _retry(self, job: Job, result: Result) -> bool:
        """Try an output error again later (the disk may free up); False once out of tries."""
        with self._lock:
            attempt = self._attempts.get(job.output, 0) + 1
            if attempt > self.config.daemon.retries or self.watcher is None or self._stop.is_set():
                self._attempts.pop(job.output, None)
                return False
            self._attempts[job.output] = attempt
            self.status.counts.retried += 1
        delay = min(_RETRY_MAX_DELAY, 2.0 ** (attempt - 1))
        log.warning("%s; try %d of %d in %.0f s", result.describe(), attempt, self.config.daemon.retries, delay)
        self.watcher.forget(job.source)
        self.waiters.forget(job.source)
        self.watcher.poke(job.source, delay=delay)
        return True

    def _park(self, job: Job) -> bool:
        """Keep a frame whose tries ran out (disk full, no permission) for when its folder can be written."""
        if self.watcher is None:
            return False
        return self._parked.park(job.output.parent, job.source)

    def _park_clip(self, job: ClipJob) -> bool:
        """Keep a clip whose depth clip could not be written (a full disk) for when its folder can be.

        No quick retries first, as a frame gets: a clip is minutes of work, so it waits
        until its folder looks writable; `_retry_parked` hands it back to the watcher.
        """
        return self._parked.park(job.final.parent, job.source)

    def _retry_parked(self) -> None:
        """Hand the parked frames of each folder that can be written again back to the watcher."""
        watcher = self.watcher
        if watcher is None:
            return
        for source in self._parked.due():
            watcher.forget(source)
            self.waiters.forget(source)
            watcher.poke(source)

    def _count_failure(self, line: str) -> None:
        with self._lock:
            self.status.counts.failed += 1
            self.status.counts.last_error = line
        log.error("%s", line)
        self._status_dirty = True

    def _rescan_after_overflow(self) -> None:
        """After the queue turned frames away, look for them once it has room again."""
        if not self.queue.overflowed or self.watcher is None:
            return
        if len(self.queue) > self.queue.maxsize // 2 or time.monotonic() - self._last_overflow_scan < 1.0:
            return
        self.queue.overflowed = False
        self._overflow_reported = False
        self._last_overflow_scan = time.monotonic()
        self.watcher.scan()

    def _report_superseded(self, final: bool = False) -> None:
        """One info line for the frames a newer version replaced, every SUPERSEDED_SUMMARY_S at most.

        While scrubbing, dozens a second are normal and not worth a line each;
        the line says how far each got, so none reads as if it had been inferred.
        """
        now = time.monotonic()
        with self._lock:
            unreported = self._superseded_unreported
            queued = self.queue.superseded
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

    # -- status -------------------------------------------------------------------

    def _publish_model(self) -> None:
        assert self.engine is not None
        info = self.engine.info
        self.status.measuring = self.engine.measuring
        self.status.engine_switches = self.engine.switches
        self._status_dirty = True
        if info is None:
            return
        if self._published is not None and info.generation != self._published.generation and info.chosen_by == "measured":
            log.info("now using %s", info.describe())
        self._published = info
        self.status.model = str(info.spec.path)
        self.status.profile = info.profile.name
        self.status.providers = list(info.providers)
        self.status.precision = info.precision
        self.status.contract = info.contract.describe()

    def _write_status(self) -> None:
        path = path_for(self.config)
        status = self._refresh_status()
        if not self._status_dirty:
            return
        self._status_dirty = False
        try:
            write_status(path, status)
        except OutputError as exc:
            log.warning("status file: %s", exc)

    def _refresh_status(self) -> Status:
        status = self.status
        status.queue_depth = len(self.queue)
        status.in_progress = self.queue.in_progress
        status.counts.superseded = self.queue.superseded + self._superseded_in_flight
        status.counts.incomplete = self.watcher.incomplete if self.watcher else 0
        if self.engine is not None:
            status.model_loads = self.engine.load_count
        clips = self.clips
        progress = clips.progress if clips is not None else None
        status.clip = progress.as_dict() if progress is not None else None
        status.clips_waiting = clips.waiting if clips is not None else 0
        return status

