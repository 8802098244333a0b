"""The one inference thread and the one session it serves from.

Sessions on GPU back-ends are bound to the thread and process that made them
(CoreML after fork() crashes; TensorFlow-style sessions hang when called from
another thread), and a model loaded lazily from concurrent callers gets loaded
many times. So: one thread creates the session, before any job, and makes
every `run()` call; other threads hand it tensors and get futures back. A
reload is a job like any other on the same queue, so two loads can never
overlap and no frame is lost across the swap.

With `providers: auto` the daemon is ready at once and measures the other
engines in idle time on this same thread, a step at a time, pre-empted by
every live frame (`choosing.idle`). Whatever goes wrong on this thread, it
completes the future it was given with an error and serves the next job; the
thread ending is itself reported (`failure`), so nobody is told "running" by
a daemon whose engine is gone.

This module holds the thread, its queue (`jobs`) and its jobs (run, load,
stop), and the session it serves from. Choosing and measuring engines lives
beside it in `choosing`, as parts the engine holds, which hand it sessions: a
`SessionMaker` makes every session, an `IdleMeasurement` the idle-time
measurement; neither holds the engine. What fails is said by `failures`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from depthwatch.errors import (
    BadPrediction,
    InferenceFailed,
    DepthwatchError,
    RunGivenUp,
    FrameError,
    ModelChanged,
    ModelError,
    Stopped,
    Superseded,
)
from depthwatch.model import providers
from depthwatch.model.choosing.idle import IDLE_S, IdleMeasurement
from depthwatch.model.choosing.making import SessionMaker, Tally
from depthwatch.model.choosing.sideruns import SideRuns
from depthwatch.model.contract import depth_map
from depthwatch.model.failures import EngineStopped, first_line, internal, unusable
from depthwatch.model.inference import BACKGROUND, LIVE, Inference, SessionFactory
from depthwatch.model.jobs import STOP, Jobs
from depthwatch.model.sessions import Session, ort
from depthwatch.model.spec import ModelInfo, ModelSpec
from depthwatch.threadnames import name_this_thread

log = logging.getLogger("depthwatch.model.engine")

__all__ = ["BACKGROUND", "LIVE", "Engine", "Inference", "SessionFactory"]


class Engine:
    """Owns the inference thread; thread-safe to call from anywhere.

    `start()` begins loading on the inference thread and returns at once;
    `infer()` may be called before the load finishes (work waits in order).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        session_factory: SessionFactory | None = None,
        available_providers: Callable[[], Sequence[str]] | None = None,
        measure_providers: str = "remembered",
    ) -> None:
        """`available_providers` stands for providers.available (tests offer stand-in accelerators
        through it); `measure_providers`: "remembered", "background" or "always" (see `SessionMaker`)."""
        if session_factory is None:
            session_factory = ort.factory()
        self._spec = spec
        self._tally = Tally()  # what the engine's parts did: read by the properties below
        self._sides = SideRuns()  # the runs that are not a frame's, which a stop or a live frame ends
        self._maker = SessionMaker(
            session_factory, available_providers or providers.available, measure_providers, self._sides, self._tally
        )
        self._idle = IdleMeasurement(self._maker, self._tally, self._now_serving)
        self._jobs = Jobs()
        self._thread = threading.Thread(target=self._serve, name="depthwatch-inference", daemon=True)
        self._ready = threading.Event()
        self._lock = threading.Lock()
        #: Reloads no longer asked for (`withdraw`), while they load: they never swap in.
        self._withdrawn: set[Future[Any]] = set()
        self._closed = False
        self._info: ModelInfo | None = None
        self._error: DepthwatchError | None = None
        self._cpu_rebuilt = False
        self._running: tuple[Future[Any], Any] | None = None
        #: The frame run now (its `label`, None for an image in memory) and since when (monotonic),
        #: None between runs: what the daemon's supervisor times against its stall bound.
        self._run_since: tuple[Any, float] | None = None
        #: Why the run in progress was given up (`give_up_running`), for its future's error.
        self._given_up: str | None = None
        #: Seconds of the last runs that gave a prediction: what the stall bound is derived from.
        self.run_seconds: collections.deque[float] = collections.deque(maxlen=32)
        #: The running inference is BACKGROUND work, and a LIVE job came for it to make way.
        self._running_background = False
        self._preempted = False
        self._interrupted = False
        #: Frames run through the model.
        self.run_count = 0
        #: When the last live job ended (monotonic), which an idle-time measurement step waits IDLE_S after.
        self._live_at = 0.0
        #: Why the inference thread ended while the engine was not being stopped (None: it did not).
        self.failure: str | None = None
        #: Called on the inference thread with a run's `label` just before the model runs on it, and with
        #: None after (the daemon's supervisor, which notes it in `blackbox`: a crash inside the runtime names its frame at the next start).
        self.note_run: Callable[[Any], None] | None = None

    # -- the public side, called from any thread ---------------------------------

    def start(self) -> Engine:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        """Block until the first load is done; raise its error if it failed."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the model is still loading")
        if self._error is not None:
            raise self._error
        assert self._info is not None
        return self._info

    @property
    def info(self) -> ModelInfo | None:
        """The model loaded now, or None before the first load."""
        return self._info

    @property
    def busy(self) -> bool:
        """Whether a session.run is in progress right now."""
        return self._running is not None

    @property
    def running(self) -> tuple[Any, float] | None:
        """The run in progress as (its label, when it began, monotonic); None between runs (any thread)."""
        return self._run_since

    def give_up_running(self, run: tuple[Any, float], why: str) -> bool:
        """Give up `run` (what `running` returned) through its RunOptions; its future fails with `why`.

        False if that run is over already. onnxruntime looks at the flag between
        operators, so a run inside one long operator ends only when it does.
        """
        with self._lock:
            if self._run_since is not run or self._running is None:
                return False
            self._given_up = why
            self._running[1].terminate = True
            return True

    @property
    def measuring(self) -> bool:
        """Whether an idle-time measurement is still to be made or under way."""
        return self._idle.measuring

    # What the engine's parts did: the sessions loaded for the model asked for (first load, reloads,
    # CPU rebuild: not the measurement's, nor the one it may switch to), every session made (the
    # measurement's too), the provider measurements made, and the measurement's switches of engine.
    load_count = property(lambda self: self._tally.loads)
    sessions_made = property(lambda self: self._tally.sessions_made)
    measurements = property(lambda self: self._tally.measurements)
    switches = property(lambda self: self._tally.switches)

    @property
    def alive(self) -> bool:
        """False once the inference thread has ended (stopped, or failed: see `failure`)."""
        return self._thread.is_alive() or self._thread.ident is None

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def infer(self, tensor: np.ndarray, generation: int, priority: int = LIVE, label: Any = None) -> Future[Inference]:
        """Queue one tensor prepared for model `generation`; the future gets the prediction.

        If the model was swapped since the tensor was prepared the future fails
        with ModelChanged and the caller prepares it again for the new model.
        `priority` BACKGROUND (a clip's frames) waits behind every LIVE job queued,
        so a frame dropped meanwhile waits for one inference at most. `label`:
        what the run is of, handed to `note_run` just before the model runs on it.
        """
        return self._put(("run", tensor, generation, priority, label), priority)

    def abort(self, future: Future[Inference], running_too: bool = True) -> None:
        """Give up on an inference whose frame has a newer version.

        A queued one is cancelled. A running one (if `running_too`) is told to
        stop through its RunOptions (onnxruntime checks between operators) and
        fails with Superseded. Either way the inference thread moves on.
        """
        if future.cancel() or not running_too:
            return
        with self._lock:
            running = self._running
            if running is not None and running[0] is future:
                running[1].terminate = True

    @property
    def interrupted(self) -> bool:
        """A stop out of time dropped the queued work and stopped the run (`stop(interrupt=True)`)."""
        return self._interrupted

    def reload(self, spec: ModelSpec) -> Future[ModelInfo]:
        """Load `spec` on the inference thread after the work already queued, then swap.

        On failure the old model stays in service and the future carries the error.
        """
        return self._put(("load", spec))

    def withdraw(self, load: Future[ModelInfo]) -> bool:
        """A reload nobody asks for any more (the config went back, or on to another model): never swap it in.

        Queued, it is dropped; loading, it finishes (a load is not cut short: it
        is never two at a time anyway) and its session is let go, the model in
        service staying. False if it came too late: the swap has happened (or the
        load failed), and the caller must ask for the model it wants again.
        """
        if load.cancel():
            return True
        with self._lock:
            if load.done():
                return False
            self._withdrawn.add(load)
            return True

    def stop(self, timeout: float | None = None, interrupt: bool = False) -> bool:
        """Finish the queued work, release the session, join the thread; True if it ended.

        `interrupt`: the shutdown has run out of time, so the queued work is
        dropped and a running inference is told to stop, rather than waited for.
        """
        with self._lock:
            self._sides.stop()  # neither a warm-up nor a measurement holds a stop
            if interrupt:
                self._interrupted = True
                if self._running is not None:
                    self._running[1].terminate = True
            if not self._closed:
                self._closed = True
                self._jobs.put_stop()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _put(self, job: tuple[Any, ...], priority: int = LIVE) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                future.set_exception(self._error or EngineStopped("the inference engine has stopped"))
                return future
            self._jobs.put(priority, (future, job))
            if priority == LIVE and self._running is not None and self._running_background:
                # A clip's frame is running: stop it between operators and run it again after.
                self._preempted = True
                self._running[1].terminate = True
            if priority == LIVE:
                self._sides.make_way()  # a measured run makes way, and is run again later
        return future

    # -- the inference thread ----------------------------------------------------

    def _serve(self) -> None:
        name_this_thread()  # before the session exists: its operator threads take this name
        session: Session | None = None
        in_hand: Future[Any] | None = None  # the job being served: the one that failed, if the thread ends
        try:
            try:
                session, self._info = self._load(self._spec, generation=1)
                self._live_at = time.monotonic()  # the measurement waits IDLE_S after ready, too
            except DepthwatchError as exc:
                self._error = exc
                return
            except Exception as exc:  # a fault of depthwatch's own: one line, not a bare traceback
                self._error = ModelError(internal(f"loading {self._spec.path.name}", exc))
                return
            finally:
                self._ready.set()
            while True:
                entry = self._take()
                if entry is None:  # no job: a step of the idle-time measurement
                    session = self._measure_step(session)
                    continue
                priority, item = entry
                if item is STOP:
                    return
                future, job = item
                in_hand = future
                if future.running():  # a preempted background inference, back for its turn
                    if self._interrupted:
                        future.set_exception(EngineStopped("the inference engine has stopped"))
                        continue
                else:
                    if self._interrupted:
                        future.cancel()
                    if not future.set_running_or_notify_cancel():
                        continue
                try:
                    if job[0] == "load":
                        session = self._swap(session, future, job[1])
                    else:
                        session = self._run(session, future, job[1], job[2], job[3], job[4])
                except Exception as exc:  # whatever it was, this job fails and the next one is served
                    line = internal("in the inference thread", exc)
                    if not future.done():
                        future.set_exception(ModelError(line) if job[0] == "load" else FrameError(line))
                finally:
                    if priority == LIVE:
                        self._live_at = time.monotonic()
        except BaseException as exc:  # not even this ends the thread unseen: `failure` says why
            if not self._closed:
                self.failure = internal("that stopped the inference thread", exc)
                if in_hand is not None and not in_hand.done():
                    # Its frame is named by its own line; the others were only waiting (see `_drain`).
                    in_hand.set_exception(FrameError(f"the inference thread stopped while running the model on it: {self.failure}"))
        finally:
            self._end_measurement()
            session = None  # release the model before the thread ends
            self._drain()

    def _take(self) -> tuple[int, Any] | None:
        """The next job as (priority, item), or None when it is time for a measurement step instead (see `jobs`)."""
        return self._jobs.take(self._live_at + IDLE_S if self._idle.pending else None)

    # -- the parts' hands on the inference thread --------------------------------
    def _load(self, spec: ModelSpec, generation: int) -> tuple[Session, ModelInfo]:
        """A serving session of `spec` from the session maker; the idle-time measurement it plans is the next one."""
        session, info, plan = self._maker.load(spec, generation)
        self._idle.planned(plan)
        return session, info

    def _measure_step(self, session: Session) -> Session:
        """One step of the idle-time measurement; the session to serve from after it."""
        assert self._info is not None
        return self._idle.step(session, self._info)

    def _end_measurement(self) -> None:
        self._idle.end()

    def _now_serving(self, info: ModelInfo, switched: bool) -> None:
        """What the idle-time measurement puts in service: `info`, of a new session when `switched`."""
        self._info = info
        if switched:
            self._cpu_rebuilt = False

    def _drain(self) -> None:
        with self._lock:
            stopping = self._closed
            self._closed = True
        if not stopping and self._error is None and self.failure is None:
            self.failure = "the inference thread ended unexpectedly"
        if self.failure is not None and self._error is None:
            self._error = EngineStopped(f"the inference engine has stopped: {self.failure}")
        reason: Exception = self._error or EngineStopped("the inference engine has stopped")
        if self.failure is not None:
            # The jobs waiting behind the one that ended the thread were never tried: dropped, as by a
            # stop, for the next start to map (failed, each would be logged and counted, and none of
            # those lines would name the frame at fault).
            reason = Stopped(f"not mapped: the inference engine stopped on another frame before it ran ({self.failure})")
        for future, _ in self._jobs.drain():
            if future.running() or future.set_running_or_notify_cancel():
                future.set_exception(reason)

    def _swap(self, session: Session, future: Future[Any], spec: ModelSpec) -> Session:
        assert self._info is not None
        self._end_measurement()  # it was of the old model; the new one plans its own
        try:
            new_session, info, plan = self._maker.load(spec, generation=self._info.generation + 1)
        except Exception as exc:
            error = exc if isinstance(exc, DepthwatchError) else ModelError(internal(f"loading {spec.path.name}", exc))
            log.error("keeping %s: %s", self._info.spec.path.name, error)
            with self._lock:
                self._withdrawn.discard(future)
            future.set_exception(error)
            return session
        with self._lock:  # with `withdraw`: a reload withdrawn is never swapped in, one swapped in is not withdrawn
            withdrawn = future in self._withdrawn
            self._withdrawn.discard(future)
            if not withdrawn:
                self._info = info
                self._cpu_rebuilt = False
                self._idle.planned(plan)  # a measurement of the model swapped in, never of one withdrawn
                future.set_result(info)
        if withdrawn:
            log.info("not using %s: the config no longer names it; keeping %s", spec.path.name, self._info.spec.path.name)
            future.set_exception(Superseded("the config no longer names this model"))
            return session  # the new session is let go here, before the next job
        return new_session  # the old session is released as its last reference goes

    def _run(
        self, session: Session, future: Future[Any], tensor: np.ndarray, generation: int, priority: int = LIVE, label: Any = None
    ) -> Session:
        info = self._info
        assert info is not None
        if generation != info.generation:
            future.set_exception(ModelChanged())
            return session
        feed = {info.contract.input_name: tensor}
        names = [info.contract.output_name]
        for attempt in (1, 2):
            options = ort.run_options()
            with self._lock:
                self._running = (future, options)
                self._running_background, self._preempted = priority != LIVE, False
                self._run_since, self._given_up = (label, time.monotonic()), None
            noted = label is not None and self.note_run is not None
            try:
                if noted:
                    self.note_run(label)  # type: ignore[misc]  # a crash inside the run names this frame
                start = time.perf_counter()
                output = session.run(names, feed, options)[0]
                seconds = time.perf_counter() - start
                prediction = depth_map(output)
            except Exception as exc:  # onnxruntime raises its own exception types
                if options.terminate and self._given_up is not None and not self._interrupted:
                    future.set_exception(RunGivenUp(self._given_up))
                    return session
                if options.terminate and self._preempted and not self._interrupted:
                    self._requeue(future, tensor, generation, priority, label)
                    return session
                if options.terminate:
                    if self._interrupted:
                        future.set_exception(Stopped("the daemon stopped during inference"))
                    else:
                        future.set_exception(Superseded("a newer version arrived during inference"))
                    return session
                on_accelerator = any(p != providers.CPU for p in info.providers)
                if attempt == 1 and on_accelerator and not self._cpu_rebuilt:
                    session, info = self._rebuild_on_cpu(session, info, exc)
                    continue
                future.set_exception(InferenceFailed(f"inference failed: {first_line(exc)}"))
                return session
            finally:
                if noted:
                    self.note_run(None)  # type: ignore[misc]  # the run is over, however it ended
                with self._lock:
                    self._running = None
                    self._running_background = False
                    self._run_since = None
            self.run_count += 1
            self.run_seconds.append(seconds)
            problem = unusable(prediction, tensor, info.providers)
            if problem:
                future.set_exception(BadPrediction(problem))
            else:
                future.set_result(Inference(prediction, seconds, info))
            return session
        return session

    def _requeue(self, future: Future[Any], tensor: np.ndarray, generation: int, priority: int, label: Any = None) -> None:
        """A preempted background inference back in the queue, behind the live job that stopped it and
        before the stop marker; its future, already running, goes back as it was: the caller sees only a later result."""
        self._jobs.put(priority, (future, ("run", tensor, generation, priority, label)))

    def _rebuild_on_cpu(self, session: Session, info: ModelInfo, exc: Exception) -> tuple[Session, ModelInfo]:
        self._cpu_rebuilt = True
        log.warning("%s failed at run time (%s); rebuilding the session on CPU", info.providers[0], first_line(exc))
        try:
            session, self._info = self._load(dataclasses.replace(info.spec, providers=(providers.CPU,)), info.generation)
        except DepthwatchError as load_exc:
            log.error("could not rebuild the session on CPU: %s", load_exc)
        return session, self._info or info
