"""The one inference thread and the one ONNX Runtime session it owns.

Sessions on GPU back-ends are bound to the thread and process that made them
(CoreML after fork() crashes; TensorFlow-style sessions hang when called from
another thread), and a model loaded lazily from concurrent callers gets loaded
many times. So: one thread creates the session, before any job, and makes
every `run()` call; other threads hand it tensors and get futures back. A
reload is a job like any other on the same queue, so two loads can never
overlap and no frame is lost across the swap.

With `providers: auto` the daemon is ready at once: it serves from the
remembered choice, or from the reference (onnxruntime's CPU provider at fp32)
when nothing is remembered, and measures the other engines in idle time on
this same thread, a step at a time, pre-empted by every live frame. When a
faster faithful engine is found it swaps to it as a reload does.

Whatever goes wrong on this thread, it completes the future it was given
with an error and serves the next job; the thread ending is itself reported
(`failure`), so nobody is told "running" by a daemon whose engine is gone.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import queue
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.errors import (
    BadPrediction,
    DepthwatchError,
    FrameError,
    ModelChanged,
    ModelError,
    Superseded,
)
from depthwatch.files import why_not_a_file
from depthwatch.model import caches, choice, providers, quantize
from depthwatch.model import precision as precisions
from depthwatch.model.choice import Measurement, Preempted, Trial, Variant
from depthwatch.model.contract import (
    Contract,
    depth_map,
    model_input_size,
    read_contract,
)
from depthwatch.model.profiles import Profile
from depthwatch.model.sessions import Session, ort
from depthwatch.model.spec import ModelInfo, ModelSpec
from depthwatch.threadnames import name_this_thread

log = logging.getLogger("depthwatch.model.engine")

#: Called as onnxruntime.InferenceSession is: (path, sess_options=..., providers=[(name, options), ...]).
SessionFactory = Callable[..., Session]


class EngineStopped(DepthwatchError):
    """Work was handed to an engine that has stopped (or never loaded)."""


@dataclass(frozen=True)
class Inference:
    """A prediction as [H, W] floats, the seconds `session.run` took, and the model that made it.

    The model travels with the prediction because a swap may finish before the
    prediction is rendered: its profile (depth or inverse depth) must be the one
    that produced it, or the map comes out inverted.
    """

    prediction: np.ndarray
    seconds: float
    model: ModelInfo

    @property
    def generation(self) -> int:
        return self.model.generation


_STOP = object()

#: Queue priorities: lower runs first. A live frame (an editor waiting on it), a model
#: load and the HTTP API's images go before the frames of a clip job, which only
#: fill the time the live frames leave; the stop marker goes after everything.
LIVE = 0
BACKGROUND = 1
_LAST = 2
#: Seconds without a live frame before the idle-time measurement takes a step.
IDLE_S = 1.0
#: Seconds of work the idle-time measurement may take in all (see choice.Measurement).
BACKGROUND_BUDGET_S = 45.0
_FIX_MODEL = "; the file is damaged or not an ONNX model: fetch it again or point model.path at a working .onnx file"


def unusable(prediction: np.ndarray, tensor: np.ndarray | None = None, applied: Sequence[str] = ()) -> str | None:
    """Why a prediction is no depth map, in one line, or None: checked as it leaves the engine.

    Cheap at model resolution (a few hundred thousand values): finite
    everywhere, and more than one value unless the input `tensor` was one
    flat colour (a black frame in a fade may well get a flat map).
    """
    finite = np.isfinite(prediction)
    if not finite.all():
        bad = int(prediction.size - np.count_nonzero(finite))
        where = f" on {applied[0]}" if applied and applied[0] != providers.CPU else ""
        return (
            f"the model returned NaN or infinite values ({bad} of {prediction.size}; a float16 overflow{where}?); "
            "no map written"
        )
    if prediction.size == 0:
        return "the model returned an empty map; no map written"
    low, high = float(prediction.min()), float(prediction.max())
    if not high > low and (tensor is None or tensor.min() != tensor.max()):
        return f"the model returned the same value ({low:g}) at every pixel of a frame that is not one flat colour; no map written"
    return None


def _with_cpu(provider: str) -> list[str]:
    return [provider] if provider == providers.CPU else [provider, providers.CPU]


def _at(precision: str, variants: list[Variant]) -> str:
    """" at bf16" where precision was part of the choice; nothing where every variant ran fp32."""
    return "" if all(p == precisions.FP32 for _, p in variants) else f" at {precision}"


def _openvino_session(spec: ModelSpec, precision: str) -> Session:
    from depthwatch.model.sessions.openvino import OpenVINOSession

    return OpenVINOSession(spec.path, precision, threads=max(0, spec.intra_op_threads))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _internal(what: str, exc: BaseException) -> str:
    """One line for an error of depthwatch's own (not the model's, not the frame's), its traceback logged."""
    log.error("internal error %s: %s\n%s", what, _first_line(exc), "".join(traceback.format_exception(exc)).rstrip())
    return f"internal error {what}: {type(exc).__name__}: {_first_line(exc)}"


@dataclass
class _Plan:
    """An idle-time measurement to make once the serving session is up: what to measure, where to remember it."""

    spec: ModelSpec
    variants: list[Variant]
    notes: dict[str, str]
    key: str
    decisions: choice.Decisions
    #: Why: "never measured", or "measured on a busy machine".
    why: str


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
        """`available_providers` stands for providers.available, onnxruntime's list and OpenVINO
        where it is installed (tests offer stand-in accelerators through it). `measure_providers`:
        "remembered" measures `auto` before the first load only when no earlier measurement is on
        record (batch work: `once`, a farm worker); "background" serves at once from the remembered
        choice or the reference and measures in idle time (the daemon); "always" measures afresh,
        with profiling, even CPU alone (`depthwatch check --providers`)."""
        if session_factory is None:
            session_factory = ort.factory()
        self._spec = spec
        self._factory = session_factory
        self._available = available_providers or providers.available
        self._measure = measure_providers
        # (priority, order, item): FIFO within a priority (`order` never ties, so items never compare).
        self._jobs: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._serve, name="depthwatch-inference", daemon=True)
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._info: ModelInfo | None = None
        self._error: DepthwatchError | None = None
        self._cpu_rebuilt = False
        self._running: tuple[Future[Any], Any] | None = None
        #: The running inference is BACKGROUND work, and a LIVE job came for it to make way.
        self._running_background = False
        self._preempted = False
        self._interrupted = False
        #: Serving sessions loaded for the model asked for (first load, reloads, CPU rebuild); the
        #: sessions the measurement makes, and the one it may switch to, are not counted here.
        self.load_count = 0
        #: Frames run through the model.
        self.run_count = 0
        #: Provider measurements made (each times every candidate once).
        self.measurements = 0
        #: The idle-time measurement to make (`_plan`) or under way (inference thread only),
        #: and when the last live job ended (monotonic), which a step waits IDLE_S after.
        self._measurement: Measurement | None = None
        self._plan: _Plan | None = None
        self._live_at = 0.0
        #: A run in progress that is not a frame's (a warm-up, a measured run): its RunOptions,
        #: which a stop always stops, and whether a live job stops it too (a measured run).
        self._side_run: tuple[Any, bool] | None = None
        #: Why the inference thread ended while the engine was not being stopped (None: it did not).
        self.failure: str | None = None
        #: Seconds the last serving session's warm-up run took (the measurement's estimate).
        self._warm_s: float | None = None
        #: A model's contract and the seconds of one run, as an fp32 session of it showed: what
        #: the int8 calibration feeds, and how many images it can afford (see `_int8_file`).
        self._seen: tuple[Path, Contract, float] | None = None
        #: Times the idle-time measurement moved serving to a faster engine (not counted in load_count).
        self.switches = 0
        #: A measured session the measurement kept to serve from: (session, its trial, the serving one's ms).
        self._kept: tuple[Session, Trial, float] | None = None

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
    def measuring(self) -> bool:
        """Whether an idle-time measurement is still to be made or under way."""
        return self._plan is not None or self._measurement is not None

    @property
    def alive(self) -> bool:
        """False once the inference thread has ended (stopped, or failed: see `failure`)."""
        return self._thread.is_alive() or self._thread.ident is None

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def infer(self, tensor: np.ndarray, generation: int, priority: int = LIVE) -> Future[Inference]:
        """Queue one tensor prepared for model `generation`; the future gets the prediction.

        If the model was swapped since the tensor was prepared the future fails
        with ModelChanged and the caller prepares it again for the new model.
        `priority` BACKGROUND (a clip's frames) waits behind every LIVE job queued,
        so a frame dropped meanwhile waits for one inference at most.
        """
        return self._put(("run", tensor, generation, priority), priority)

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

    def reload(self, spec: ModelSpec) -> Future[ModelInfo]:
        """Load `spec` on the inference thread after the work already queued, then swap.

        On failure the old model stays in service and the future carries the error.
        """
        return self._put(("load", spec))

    def stop(self, timeout: float | None = None, interrupt: bool = False) -> bool:
        """Finish the queued work, release the session, join the thread; True if it ended.

        `interrupt`: the shutdown has run out of time, so the queued work is
        dropped and a running inference is told to stop, rather than waited for.
        """
        with self._lock:
            if self._side_run is not None:
                self._side_run[0].terminate = True  # neither a warm-up nor a measurement holds a stop
            if interrupt:
                self._interrupted = True
                if self._running is not None:
                    self._running[1].terminate = True
            if not self._closed:
                self._closed = True
                self._jobs.put((_LAST, next(self._order), _STOP))
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
            self._jobs.put((priority, next(self._order), (future, job)))
            if priority == LIVE and self._running is not None and self._running_background:
                # A clip's frame is running: stop it between operators and run it again after.
                self._preempted = True
                self._running[1].terminate = True
            if priority == LIVE and self._side_run is not None and self._side_run[1]:
                self._side_run[0].terminate = True  # a measured run makes way, and is run again later
        return future

    # -- the inference thread ----------------------------------------------------

    def _serve(self) -> None:
        name_this_thread()  # before the session exists: its operator threads take this name
        session: Session | None = None
        try:
            try:
                session, self._info = self._load(self._spec, generation=1)
                self._live_at = time.monotonic()  # the measurement waits IDLE_S after ready, too
            except DepthwatchError as exc:
                self._error = exc
                return
            except Exception as exc:  # a fault of depthwatch's own: one line, not a bare traceback
                self._error = ModelError(_internal(f"loading {self._spec.path.name}", exc))
                return
            finally:
                self._ready.set()
            while True:
                entry = self._take()
                if entry is None:  # no job: a step of the idle-time measurement
                    session = self._measure_step(session)
                    continue
                priority, item = entry
                if item is _STOP:
                    return
                future, job = item
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
                        session = self._run(session, future, job[1], job[2], job[3])
                except Exception as exc:  # whatever it was, this job fails and the next one is served
                    line = _internal("in the inference thread", exc)
                    if not future.done():
                        future.set_exception(ModelError(line) if job[0] == "load" else FrameError(line))
                finally:
                    if priority == LIVE:
                        self._live_at = time.monotonic()
        except BaseException as exc:  # not even this ends the thread unseen: `failure` says why
            if not self._closed:
                self.failure = _internal("that stopped the inference thread", exc)
        finally:
            self._end_measurement()
            session = None  # release the model before the thread ends
            self._drain()

    def _take(self) -> tuple[int, Any] | None:
        """The next job as (priority, item), or None when it is time for a measurement step instead.

        A measurement step waits until no live frame has come for IDLE_S; it goes
        before a clip's frames (BACKGROUND), which would otherwise never leave it
        a moment, and after every live frame.
        """
        while True:
            if self._plan is None and self._measurement is None:
                priority, _, item = self._jobs.get()
                return priority, item
            wait = self._live_at + IDLE_S - time.monotonic()
            try:
                priority, order, item = self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
            except queue.Empty:
                if wait <= 0:
                    return None
                continue
            if priority == BACKGROUND and wait <= 0:
                self._jobs.put((priority, order, item))  # its own place again: clip frames keep their order
                return None
            return priority, item

    def _drain(self) -> None:
        with self._lock:
            stopping = self._closed
            self._closed = True
        if not stopping and self._error is None and self.failure is None:
            self.failure = "the inference thread ended unexpectedly"
        if self.failure is not None and self._error is None:
            self._error = EngineStopped(f"the inference engine has stopped: {self.failure}")
        reason = self._error or EngineStopped("the inference engine has stopped")
        while True:
            try:
                item = self._jobs.get_nowait()[2]
            except queue.Empty:
                return
            if item is not _STOP and (item[0].running() or item[0].set_running_or_notify_cancel()):
                item[0].set_exception(reason)

    def _swap(self, session: Session, future: Future[Any], spec: ModelSpec) -> Session:
        assert self._info is not None
        self._end_measurement()  # it was of the old model; the new one plans its own
        try:
            new_session, info = self._load(spec, generation=self._info.generation + 1)
        except DepthwatchError as exc:
            log.error("keeping %s: %s", self._info.spec.path.name, exc)
            future.set_exception(exc)
            return session
        except Exception as exc:
            error = ModelError(_internal(f"loading {spec.path.name}", exc))
            log.error("keeping %s: %s", self._info.spec.path.name, error)
            future.set_exception(error)
            return session
        self._info = info
        self._cpu_rebuilt = False
        future.set_result(info)
        return new_session  # the old session is released as its last reference goes

    def _run(self, session: Session, future: Future[Any], tensor: np.ndarray, generation: int, priority: int = LIVE) -> Session:
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
            try:
                start = time.perf_counter()
                output = session.run(names, feed, options)[0]
                seconds = time.perf_counter() - start
                prediction = depth_map(output)
            except Exception as exc:  # onnxruntime raises its own exception types
                if options.terminate and self._preempted and not self._interrupted:
                    self._requeue(future, tensor, generation, priority)
                    return session
                if options.terminate:
                    future.set_exception(Superseded("a newer version arrived during inference"))
                    return session
                on_accelerator = any(p != providers.CPU for p in info.providers)
                if attempt == 1 and on_accelerator and not self._cpu_rebuilt:
                    session, info = self._rebuild_on_cpu(session, info, exc)
                    continue
                future.set_exception(FrameError(f"inference failed: {_first_line(exc)}"))
                return session
            finally:
                with self._lock:
                    self._running = None
                    self._running_background = False
            self.run_count += 1
            problem = unusable(prediction, tensor, info.providers)
            if problem:
                future.set_exception(BadPrediction(problem))
            else:
                future.set_result(Inference(prediction, seconds, info))
            return session
        return session

    def _requeue(self, future: Future[Any], tensor: np.ndarray, generation: int, priority: int) -> None:
        """A preempted background inference goes back in the queue, behind the live job that stopped it.

        Its future is already running; it is put back as it was, so the caller sees
        only a later result.
        """
        # Before the stop marker, which always comes last: work queued before a stop still runs.
        self._jobs.put((priority, next(self._order), (future, ("run", tensor, generation, priority))))

    def _rebuild_on_cpu(self, session: Session, info: ModelInfo, exc: Exception) -> tuple[Session, ModelInfo]:
        self._cpu_rebuilt = True
        log.warning(
            "%s failed at run time (%s); rebuilding the session on CPU",
            info.providers[0],
            _first_line(exc),
        )
        cpu_spec = dataclasses.replace(info.spec, providers=(providers.CPU,))
        try:
            session, rebuilt = self._load(cpu_spec, generation=info.generation)
        except DepthwatchError as load_exc:
            log.error("could not rebuild the session on CPU: %s", load_exc)
            return session, info
        self._info = rebuilt
        return session, rebuilt

    def _load(
        self, spec: ModelSpec, generation: int, variant: Variant | None = None, measured: tuple[list[Trial], list[str]] | None = None
    ) -> tuple[Session, ModelInfo]:
        """A serving session of `spec`, warmed up; `variant` (with the `measured` figures and refusals)
        when the idle-time measurement chose it, else as `_decide` says."""
        path = spec.path
        if not path.is_file():
            raise ModelError(f"model file {path} {why_not_a_file(path)}; fetch it with `depthwatch models fetch` or set model.path")
        if not os.access(path, os.R_OK):
            raise ModelError(f"model file {path} is not readable; check its permissions")
        available = list(self._available())
        wanted, skipped = providers.choose(spec.providers, available)
        for reason in skipped if variant is None else ():
            log.warning("%s; using the next provider", reason)
        start = time.perf_counter()
        plan: _Plan | None = None
        if variant is not None:
            (provider, precision), chosen_by = variant, "measured"
            trials, refused = measured or ([], [])
        else:
            (provider, precision), chosen_by, trials, refused, plan = self._decide(spec, available, wanted[0])
        if chosen_by:
            start = time.perf_counter()  # the load time is the serving session's, not the measurement's
        if spec.providers == "auto" or provider != wanted[0]:
            wanted = _with_cpu(provider)  # an explicit list keeps its order (and its fallbacks) as given
        chain, compiled, pins = ort.provider_chain(wanted, spec, precision)
        model_file = self._int8_file(spec) if precision == precisions.INT8 else path
        session = self._create(model_file, ort.session_options(spec, pins=pins), chain, spec, precision)
        applied = tuple(session.get_providers())
        if applied[0] != provider:
            precision = precisions.FP32  # a fallback to the CPU provider
        for name in wanted:
            if name != providers.CPU and name not in applied:
                log.warning("%s did not take the model; running on %s", name, ", ".join(applied))
        contract = read_contract(session)
        if spec.choose_profile is not None:  # profile auto: decided by the graph, before ready
            spec = dataclasses.replace(spec, profile=spec.choose_profile.choose(contract), choose_profile=None)
        warm = time.perf_counter()
        self._warm_up(session, contract, spec.profile)
        self._warm_s = time.perf_counter() - warm
        if applied[0] == providers.CPU and precision == precisions.FP32:
            self._seen = (spec.path, contract, self._warm_s)
        if variant is None:
            self.load_count += 1
        if providers.COREML not in applied:
            compiled = None
        info = self._described(
            spec, contract, applied, generation, time.perf_counter() - start,
            compiled=compiled, chosen_by=chosen_by, trials=tuple(trials), precision=precision, refused=tuple(refused),
        )
        log.info(
            "loaded %s in %.2f s; applied providers: %s; precision %s",
            path.name,
            info.load_seconds,
            ", ".join(applied),
            precision,
        )
        if plan is not None:
            plan = dataclasses.replace(plan, spec=spec)  # with the profile the graph chose
        self._plan = plan if plan is not None and applied[0] == provider else None
        return session, info

    @staticmethod
    def _described(spec: ModelSpec, contract: Contract, applied: tuple[str, ...], generation: int, load_s: float, **more: Any) -> ModelInfo:
        # For a square frame the model's input is as large as it gets on the frame's short side.
        floor = model_input_size(contract, spec.profile, (1, 1))
        return ModelInfo(spec, contract, applied, generation, load_s, min_frame_size=floor, **more)

    def _decide(
        self, spec: ModelSpec, available: list[str], first: str
    ) -> tuple[Variant, str, list[Trial], list[str], _Plan | None]:
        """The variant (provider, precision) to serve from, how it was chosen, the figures, refusals,
        and the idle-time measurement still to make.

        `auto` providers: the variant measured fastest for this model on this
        machine. When nobody has measured it, batch work (`remembered`) measures
        now, before its first frame, and the daemon (`background`) serves from
        the reference at once and plans the measurement for idle time; a choice
        measured on a busy machine serves, and is measured again. An explicit
        list serves from its first available provider, measured only between
        the precisions `precision: auto` may take on it. With one variant on
        offer there is nothing to measure. A remembered choice is found before
        any runtime is asked what it offers, so a start that serves from
        onnxruntime never imports OpenVINO.
        """
        names = providers.auto_candidates(available) if spec.providers == "auto" else [first]
        if names == [providers.CPU] and self._measure != "always":
            wanted, note = precisions.candidates(providers.CPU, spec.precision)
            if len(wanted) == 1:  # nothing to choose between: no digest, no record
                if note:
                    log.warning("precision %s: %s", spec.precision, note)
                return (providers.CPU, wanted[0]), "", [], [], None
        try:
            digest = caches.model_digest(spec.path, spec.state_dir())
        except OSError as exc:
            raise ModelError(f"cannot read model {spec.path}: {exc.strerror or exc}; check the file and its permissions") from None
        key = choice.decision_key(digest, providers.runtimes_version(available), available, spec.precision)
        decisions = choice.Decisions(spec.state_dir() / "providers.json")
        known = decisions.get(key) if self._measure != "always" else None
        remembered: tuple[Variant, str, list[Trial], list[str]] | None = None
        if known is not None and known["provider"] in names:
            chosen = (known["provider"], str(known.get("precision", precisions.FP32)))
            log.info(
                "providers: auto uses %s%s for %s (measured %s%s)",
                chosen[0],
                "" if chosen[1] == precisions.FP32 else f" at {chosen[1]}",
                spec.path.name,
                known.get("measured", "before"),
                ", on a busy machine: measuring again in idle time" if known.get("busy") and self._measure == "background" else "",
            )
            remembered = chosen, "remembered", [], [str(r) for r in known.get("refused", [])]
            if not (known.get("busy") and self._measure == "background"):
                return (*remembered, None)
        variants: list[Variant] = []
        notes: dict[str, str] = {}
        for name in names:
            try:
                wanted, note = precisions.candidates(name, spec.precision)
            except Exception as exc:  # the runtime cannot even say what it runs: measured as fp32, where it may fail
                wanted, note = [precisions.FP32], f"cannot read {providers.short(name)}'s precisions: {_first_line(exc)}"
            variants += [(name, p) for p in wanted]
            if note:
                notes[name] = note
        if len(variants) == 1 and self._measure != "always":
            if notes.get(variants[0][0]):
                log.warning("precision %s: %s", spec.precision, notes[variants[0][0]])
            return variants[0], "", [], [], None
        if self._measure == "background":
            why = "measured on a busy machine" if remembered is not None else "never measured"
            plan = _Plan(spec, variants, notes, key, decisions, why)
            if remembered is not None:
                return (*remembered, plan)
            return choice.reference(variants), "", [], [], plan
        with tempfile.TemporaryDirectory(prefix="depthwatch-trace-") as folder:
            trace_prefix = str(Path(folder) / "trace") if self._measure == "always" else None
            log.info(
                "measuring engines for %s before its first frame (about %.0f s at most): %s",
                spec.path.name, choice.BUDGET_S, ", ".join(f"{providers.short(p)} {q}" for p, q in choice.in_order(variants)),
            )
            try:
                trials = choice.measure(
                    variants, self._measured_session(spec, trace_prefix), self._measured_run(spec),
                    probe=self._measured_probe(spec), trace_nodes=trace_prefix is not None,
                )
            except DepthwatchError:
                raise
            except Exception as exc:  # the reference itself failed: the model is unusable
                raise ModelError(f"cannot load model {spec.path}: {_first_line(exc)}{_FIX_MODEL}") from None
        self.measurements += 1
        choice.give_back_freed_memory()
        chosen, refused = self._report(spec, trials, variants, notes)
        if len(variants) > 1:
            decisions.put(key, spec.path, chosen, trials)
        return chosen, "measured", trials, refused, None

    def _report(
        self, spec: ModelSpec, trials: list[Trial], variants: list[Variant], notes: dict[str, str], was: Variant | None = None
    ) -> tuple[Variant, list[str]]:
        """The variant a measurement chose and the refusals, each logged in one line."""
        chosen = choice.fastest(trials) or (trials[0].variant if trials else (providers.CPU, precisions.FP32))
        refused = [t.refusal() for t in choice.unfaithful(trials, chosen[0])]
        uses = f"; auto uses {chosen[0]}{_at(chosen[1], variants)}"
        if was is not None and chosen != was:
            uses = f"; auto now uses {chosen[0]}{_at(chosen[1], variants)} (was {was[0]}{_at(was[1], variants)})"
        log.info("providers: measured %s: %s%s", spec.path.name, ", ".join(t.summary() for t in trials), uses)
        for line in refused:
            log.warning("precision: auto refused %s; %s runs at %s", line, providers.short(chosen[0]), chosen[1])
        if notes.get(chosen[0]):
            log.warning("precision %s: %s", spec.precision, notes[chosen[0]])
        return chosen, refused

    # -- the measured sessions (the inference thread) -----------------------------------------

    def _measured_session(self, spec: ModelSpec, trace_prefix: str | None) -> Callable[[Variant, bool], Session]:
        def create(variant: Variant, traced: bool) -> Session:
            provider, precision = variant
            if provider == providers.OPENVINO:
                return _openvino_session(spec, precision)
            chain, _, pins = ort.provider_chain(_with_cpu(provider), spec, precision)
            options = ort.session_options(spec, trace_prefix if traced else None, pins)
            model_file = self._int8_file(spec) if precision == precisions.INT8 else spec.path
            return self._factory(str(model_file), sess_options=options, providers=chain)

        return create

    def _measured_run(self, spec: ModelSpec) -> Callable[[Session], None]:
        def run(session: Session) -> None:
            contract = read_contract(session)
            start = time.perf_counter()
            self._warm_up(session, contract, spec.profile, preemptible=True)
            if self._seen is None or self._seen[0] != spec.path:
                self._seen = (spec.path, contract, time.perf_counter() - start)

        return run

    def _measured_probe(self, spec: ModelSpec) -> Callable[[Session], list[np.ndarray]]:
        def probe(session: Session) -> list[np.ndarray]:
            contract = read_contract(session)
            return [
                depth_map(self._side(session, [contract.output_name], {contract.input_name: x}, preemptible=True))
                for x in precisions.probe_tensors(contract, spec.profile)
            ]

        return probe

    def _side(self, session: Session, names: list[str], feed: dict[str, np.ndarray], preemptible: bool) -> Any:
        """A run that is not a frame's: a stop ends it (EngineStopped); a `preemptible` one (a run of
        the idle-time measurement) also makes way for a live job (Preempted: it is done again later)."""
        preemptible = preemptible and self._measurement is not None  # before the first load nothing waits
        options = ort.run_options()
        with self._lock:
            if self._closed:
                raise EngineStopped("the inference engine was stopped")
            self._side_run = (options, preemptible)
        try:
            return session.run(names, feed, options)[0]
        except Exception:
            if options.terminate and self._closed:
                raise EngineStopped("the inference engine was stopped") from None
            if options.terminate and preemptible:
                raise Preempted() from None
            raise
        finally:
            with self._lock:
                self._side_run = None

    def _int8_file(self, spec: ModelSpec) -> Path:
        """The int8 model of `spec`: cached, or quantized now on probe images (see `quantize`)."""
        root, state = spec.state_dir() / "int8", spec.state_dir()
        cached = quantize.cached(spec.path, root, state)
        if cached is not None:
            return cached
        # The calibration's input: what the graph takes, and how long a run is (a slow model is
        # calibrated on fewer images), as a session of the model already showed, or one made now.
        if self._seen is not None and self._seen[0] == spec.path:
            _, contract, seconds = self._seen
        else:
            reference = self._factory(str(spec.path), sess_options=ort.session_options(spec), providers=[providers.CPU])
            contract = read_contract(reference)
            start = time.perf_counter()
            self._warm_up(reference, contract, spec.profile)
            seconds = time.perf_counter() - start
            del reference
        tensors = precisions.probe_tensors(contract, spec.profile, quantize.calibration_count(seconds))
        return quantize.int8_model(spec.path, root, state, contract.input_name, tensors)

    # -- the idle-time measurement (the inference thread) -------------------------------------

    def _measure_step(self, session: Session) -> Session:
        """One step of the idle-time measurement; at its end, the swap to a faster faithful engine."""
        info = self._info
        assert info is not None
        try:
            if self._measurement is None:
                plan = self._plan
                assert plan is not None
                serving = (info.providers[0], info.precision)
                self._measurement = Measurement(
                    plan.variants,
                    self._measured_session(plan.spec, None),
                    self._measured_run(plan.spec),
                    probe=self._measured_probe(plan.spec),
                    budget_s=BACKGROUND_BUDGET_S,
                    reference=(session, info.load_seconds) if serving == choice.reference(plan.variants) else None,
                    then=serving,
                    offer=self._offered,
                )
                # A load, a warm-up and a few runs per variant, each at about the time a run takes now.
                estimate = len(plan.variants) * (1 + (2 + choice.MIN_RUNS + precisions.PROBES) * self._run_seconds(info))
                log.info(
                    "measuring engines for %s in idle time (%s; about %.0f s of work, every frame goes first): %s",
                    plan.spec.path.name,
                    plan.why,
                    min(estimate, BACKGROUND_BUDGET_S),
                    ", ".join(f"{providers.short(p)} {q}" for p, q in self._measurement.order),
                )
                return session
            more = self._measurement.step()
            session = self._take_offered(session)
            if more:
                return session
        except Exception as exc:  # a measurement that fails leaves the engine serving as it was
            if self._closed:  # stopped in the middle of a step: nothing failed
                self._end_measurement()
                return session
            log.warning(
                "the engine measurement for %s failed (%s); keeping %s",
                info.spec.path.name, _first_line(exc), ", ".join(info.providers),
            )
            log.debug("the measurement's traceback:\n%s", traceback.format_exc())
            self._end_measurement()
            return session
        return self._measured(session)

    def _run_seconds(self, info: ModelInfo) -> float:
        """About how long a run of the serving model takes: its warm-up's time, as the load measured it."""
        return self._warm_s if self._warm_s is not None else max(info.load_seconds, 0.01)

    def _offered(self, trial: Trial, session: Session, trials: list[Trial]) -> bool:
        """A faithful variant was measured: keep its session to serve from if it beats every measured one.

        The variant serving now must have been measured itself (with the
        reference, it has), so a switch is never to something slower.
        """
        info = self._info
        assert info is not None and trial.run_ms is not None
        serving = (info.providers[0], info.precision)
        if trial.variant == serving or not any(t.variant == serving and t.eligible for t in trials):
            return False
        best = min(t.run_ms for t in trials[:-1] if t.eligible and t.run_ms is not None)
        if trial.run_ms >= best:
            return False
        now = next(t.run_ms for t in trials if t.variant == serving and t.eligible)
        self._kept = (session, trial, now)
        return True

    def _take_offered(self, session: Session) -> Session:
        """Serve from the session the measurement just kept (see `_offered`), as a swap does: a new generation."""
        kept, self._kept = self._kept, None
        info = self._info
        if kept is None or info is None:
            return session
        new_session, trial, was_ms = kept
        applied = tuple(new_session.get_providers())
        new_info = self._described(
            info.spec, read_contract(new_session), applied, info.generation + 1, trial.load_s or 0.0,
            chosen_by="measured", precision=trial.precision,
        )
        log.info(
            "switched %s to %s%s: %.3g ms a frame against %.3g ms",
            info.spec.path.name, trial.provider, "" if trial.precision == precisions.FP32 else f" at {trial.precision}",
            trial.run_ms, was_ms,
        )
        self._info = new_info
        self._cpu_rebuilt = False
        self.switches += 1
        return new_session  # the old session is released as its last reference goes

    def _measured(self, session: Session) -> Session:
        """The measurement is done: remember it, and swap to its choice if that is not what serves."""
        measurement, plan, info = self._measurement, self._plan, self._info
        assert measurement is not None and measurement.trials is not None and plan is not None and info is not None
        self._measurement = self._plan = None
        self.measurements += 1
        serving = (info.providers[0], info.precision)
        trials = measurement.trials
        chosen, refused = self._report(plan.spec, trials, plan.variants, plan.notes, was=serving)
        if measurement.busy:
            log.info(
                "the measurement ran while other processes kept %.1f cores busy; the next start measures again",
                measurement.others or 0.0,
            )
        plan.decisions.put(plan.key, plan.spec.path, chosen, trials, busy=measurement.busy)
        choice.give_back_freed_memory()
        if chosen == serving:
            self._info = dataclasses.replace(info, chosen_by="measured", trials=tuple(trials), refused=tuple(refused))
            return session
        # The fastest was measured before the variant serving had figures to beat: load it now.
        try:
            new_session, new_info = self._load(plan.spec, info.generation + 1, variant=chosen, measured=(trials, refused))
        except Exception as exc:  # the faster engine would not load after all: keep serving
            log.warning("could not switch to %s (%s); keeping %s", chosen[0], _first_line(exc), ", ".join(info.providers))
            return session
        self._info = new_info
        self._cpu_rebuilt = False
        self.switches += 1
        log.info("switched %s to %s", plan.spec.path.name, ", ".join(new_info.providers))
        return new_session  # the old session is released as its last reference goes

    def _end_measurement(self) -> None:
        if self._measurement is not None:
            self._measurement.close()
        self._measurement = self._plan = None
        self._kept = None

    def _create(
        self, path: Path, options: Any, chain: list[tuple[str, dict[str, Any]]], spec: ModelSpec, precision: str
    ) -> Session:
        wanted = [name for name, _ in chain]
        try:
            if wanted[0] == providers.OPENVINO:
                return _openvino_session(spec, precision)
            return self._factory(str(path), sess_options=options, providers=chain)
        except Exception as exc:
            if wanted == [providers.CPU]:
                raise ModelError(f"cannot load model {path}: {_first_line(exc)}{_FIX_MODEL}") from None
            log.warning(
                "could not start %s (%s); falling back to CPU", ", ".join(wanted[:-1]), _first_line(exc)
            )
        try:
            return self._factory(str(path), sess_options=options, providers=[providers.CPU])
        except Exception as exc:
            raise ModelError(f"cannot load model {path}: {_first_line(exc)}{_FIX_MODEL}") from None

    def _warm_up(self, session: Session, contract: Contract, profile: Profile, preemptible: bool = False) -> None:
        side = profile.input_size or 256
        w, h = model_input_size(contract, profile, (side, side))
        shape = (1, 3, h, w) if contract.layout == "NCHW" else (1, h, w, 3)
        feed = {contract.input_name: np.zeros(shape, contract.input_dtype)}
        try:
            depth_map(self._side(session, [contract.output_name], feed, preemptible))
        except (DepthwatchError, Preempted):
            raise
        except Exception as exc:
            raise ModelError(f"the model failed its first run: {_first_line(exc)}") from None
