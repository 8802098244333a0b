"""The one inference thread and the one ONNX Runtime session it owns.

Sessions on GPU back-ends are bound to the thread and process that made them
(CoreML after fork() crashes; TensorFlow-style sessions hang when called from
another thread), and a model loaded lazily from concurrent callers gets loaded
many times. So: one thread creates the session, before any job, and makes
every `run()` call; other threads hand it tensors and get futures back. A
reload is a job like any other on the same queue, so two loads can never
overlap and no frame is lost across the swap.
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
from depthwatch.model import caches, choice, providers
from depthwatch.model import precision as precisions
from depthwatch.model.choice import Trial, Variant
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
        where it is installed (tests offer stand-in accelerators through it). `measure_providers`: "remembered" measures
        `auto` only when no earlier measurement is on record; "always" measures afresh,
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
        #: Sessions created over the engine's life (first load, reloads, CPU rebuild).
        self.load_count = 0
        #: Frames run through the model.
        self.run_count = 0
        #: Provider measurements made (each times every candidate once).
        self.measurements = 0

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
        return future

    # -- the inference thread ----------------------------------------------------

    def _serve(self) -> None:
        name_this_thread()  # before the session exists: its operator threads take this name
        session: Session | None = None
        try:
            try:
                session, self._info = self._load(self._spec, generation=1)
            except DepthwatchError as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            while True:
                item = self._jobs.get()[2]
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
                if job[0] == "load":
                    session = self._swap(session, future, job[1])
                else:
                    session = self._run(session, future, job[1], job[2], job[3])
        finally:
            session = None  # release the model before the thread ends
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            self._closed = True
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
        try:
            new_session, info = self._load(spec, generation=self._info.generation + 1)
        except DepthwatchError as exc:
            log.error("keeping %s: %s", self._info.spec.path.name, exc)
            future.set_exception(exc)
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

    def _load(self, spec: ModelSpec, generation: int) -> tuple[Session, ModelInfo]:
        path = spec.path
        if not path.is_file():
            raise ModelError(f"model file {path} {why_not_a_file(path)}; fetch it with `depthwatch models fetch` or set model.path")
        if not os.access(path, os.R_OK):
            raise ModelError(f"model file {path} is not readable; check its permissions")
        available = list(self._available())
        wanted, skipped = providers.choose(spec.providers, available)
        for reason in skipped:
            log.warning("%s; using the next provider", reason)
        start = time.perf_counter()
        (provider, precision), chosen_by, trials, refused = self._decide(spec, available, wanted[0])
        if chosen_by:
            start = time.perf_counter()  # the load time is the serving session's, not the measurement's
        if spec.providers == "auto" or provider != wanted[0]:
            wanted = _with_cpu(provider)  # an explicit list keeps its order (and its fallbacks) as given
        chain, compiled, pins = ort.provider_chain(wanted, spec, precision)
        session = self._create(path, ort.session_options(spec, pins=pins), chain, spec, precision)
        applied = tuple(session.get_providers())
        if applied[0] != provider:
            precision = precisions.FP32  # a fallback to the CPU provider
        for name in wanted:
            if name != providers.CPU and name not in applied:
                log.warning("%s did not take the model; running on %s", name, ", ".join(applied))
        contract = read_contract(session)
        if spec.choose_profile is not None:  # profile auto: decided by the graph, before ready
            spec = dataclasses.replace(spec, profile=spec.choose_profile.choose(contract), choose_profile=None)
        self._warm_up(session, contract, spec.profile)
        self.load_count += 1
        if providers.COREML not in applied:
            compiled = None
        # For a square frame the model's input is as large as it gets on the frame's short side.
        floor = model_input_size(contract, spec.profile, (1, 1))
        info = ModelInfo(
            spec,
            contract,
            applied,
            generation,
            time.perf_counter() - start,
            min_frame_size=floor,
            compiled=compiled,
            chosen_by=chosen_by,
            trials=tuple(trials),
            precision=precision,
            refused=tuple(refused),
        )
        log.info(
            "loaded %s in %.2f s; applied providers: %s; precision %s",
            path.name,
            info.load_seconds,
            ", ".join(applied),
            precision,
        )
        return session, info

    def _decide(self, spec: ModelSpec, available: list[str], first: str) -> tuple[Variant, str, list[Trial], list[str]]:
        """The variant (provider, precision) to serve from, how it was chosen, the figures, and refusals.

        `auto` providers: the variant measured fastest for this model on this
        machine, measuring if nobody has. An explicit list serves from its
        first available provider, measured only between the precisions
        `precision: auto` may take on it. With one variant on offer there is
        nothing to measure. The measurement makes one session per variant,
        each released before the next, and all before the serving session is
        made. A remembered choice is found before any runtime is asked what it
        offers, so a start that serves from onnxruntime never imports OpenVINO.
        """
        names = providers.auto_candidates(available) if spec.providers == "auto" else [first]
        if names == [providers.CPU] and self._measure != "always":
            return self._single(spec, providers.CPU), "", [], []
        try:
            digest = caches.model_digest(spec.path, spec.state_dir())
        except OSError as exc:
            raise ModelError(f"cannot read model {spec.path}: {exc.strerror or exc}; check the file and its permissions") from None
        key = choice.decision_key(digest, providers.runtimes_version(available), available, spec.precision)
        decisions = choice.Decisions(spec.state_dir() / "providers.json")
        known = decisions.get(key) if self._measure != "always" else None
        if known is not None and known["provider"] in names:
            chosen = (known["provider"], str(known.get("precision", precisions.FP32)))
            log.info(
                "providers: auto uses %s%s for %s (measured %s)",
                chosen[0],
                "" if chosen[1] == precisions.FP32 else f" at {chosen[1]}",
                spec.path.name,
                known.get("measured", "before"),
            )
            refused = [str(r) for r in known.get("refused", [])]
            return chosen, "remembered", [], refused
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
            return variants[0], "", [], []
        with tempfile.TemporaryDirectory(prefix="depthwatch-trace-") as folder:
            trace_prefix = str(Path(folder) / "trace") if self._measure == "always" else None

            def create(variant: Variant, traced: bool) -> Session:
                provider, precision = variant
                if provider == providers.OPENVINO:
                    return _openvino_session(spec, precision)
                chain, _, pins = ort.provider_chain(_with_cpu(provider), spec, precision)
                options = ort.session_options(spec, trace_prefix if traced else None, pins)
                return self._factory(str(spec.path), sess_options=options, providers=chain)

            def run(session: Session) -> None:
                contract = read_contract(session)
                self._warm_up(session, contract, spec.profile)

            def probe(session: Session) -> list[np.ndarray]:
                contract = read_contract(session)
                return [
                    depth_map(session.run([contract.output_name], {contract.input_name: x})[0])
                    for x in precisions.probe_tensors(contract, spec.profile)
                ]

            try:
                trials = choice.measure(variants, create, run, probe=probe, trace_nodes=trace_prefix is not None)
            except DepthwatchError:
                raise
            except Exception as exc:  # the reference itself failed: the model is unusable
                raise ModelError(f"cannot load model {spec.path}: {_first_line(exc)}{_FIX_MODEL}") from None
        self.measurements += 1
        choice.give_back_freed_memory()
        chosen = choice.fastest(trials) or (trials[0].variant if trials else (providers.CPU, precisions.FP32))
        refused = [t.refusal() for t in choice.unfaithful(trials, chosen[0])]
        log.info(
            "providers: measured %s: %s; auto uses %s%s",
            spec.path.name,
            ", ".join(t.summary() for t in trials),
            chosen[0],
            _at(chosen[1], variants),
        )
        for line in refused:
            log.warning("precision: auto refused %s; %s runs at %s", line, providers.short(chosen[0]), chosen[1])
        if notes.get(chosen[0]):
            log.warning("precision %s: %s", spec.precision, notes[chosen[0]])
        if len(variants) > 1:
            decisions.put(key, spec.path, chosen, trials)
        return chosen, "measured", trials, refused

    def _single(self, spec: ModelSpec, provider: str) -> Variant:
        wanted, note = precisions.candidates(provider, spec.precision)
        if note:
            log.warning("precision %s: %s", spec.precision, note)
        return provider, wanted[0]

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

    def _warm_up(self, session: Session, contract: Contract, profile: Profile) -> None:
        side = profile.input_size or 256
        w, h = model_input_size(contract, profile, (side, side))
        shape = (1, 3, h, w) if contract.layout == "NCHW" else (1, h, w, 3)
        try:
            depth_map(session.run([contract.output_name], {contract.input_name: np.zeros(shape, contract.input_dtype)})[0])
        except DepthwatchError:
            raise
        except Exception as exc:
            raise ModelError(f"the model failed its first run: {_first_line(exc)}") from None
