"""Making the inference thread's sessions: the one that serves, and the ones a measurement times.

A mixin of `Engine` (see `engine`), so that the thread and its queue read in
one module and how a session comes to be in another. Every method here runs on
the inference thread: `_load` makes the serving session (the variant as
`choice.decide` says, or as the idle-time measurement chose), warms it up and
describes it (`ModelInfo`); `_measured_session`, `_measured_run` and
`_measured_probe` are what a measurement is handed; `_side` runs what is not a
frame's (a warm-up, a measured run), stoppable; `_int8_file` is the int8 model,
quantized once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.errors import DepthwatchError, ModelError
from depthwatch.files import why_not_a_file
from depthwatch.model import choice, graph_ops, providers, quantize
from depthwatch.model import precision as precisions
from depthwatch.model.contract import Contract, depth_map, model_input_size, read_contract
from depthwatch.model.failures import FIX_MODEL, EngineStopped, first_line
from depthwatch.model.measurement import BUDGET_S, Measurement, Preempted, measure
from depthwatch.model.profiles import Profile
from depthwatch.model.sessions import Session, ort
from depthwatch.model.spec import ModelInfo, ModelSpec
from depthwatch.model.trials import Trial, Variant, in_order

log = logging.getLogger("depthwatch.model.engine")


def _with_cpu(provider: str) -> list[str]:
    """`provider` with the CPU provider behind it, to fall back on."""
    return [provider] if provider == providers.CPU else [provider, providers.CPU]


def _openvino_session(spec: ModelSpec, precision: str, path: Path) -> Session:
    """A session on OpenVINO's own runtime, imported only when a variant asks for it (an optional extra).

    `path`: the model's file, or its int8 file (`SessionMaking._int8_file`).
    """
    from depthwatch.model.sessions.openvino import OpenVINOSession

    return OpenVINOSession(path, precision, threads=max(0, spec.intra_op_threads))


def _quantized(path: Path) -> bool:
    """Whether the graph in `path` is quantized (see `graph_ops`); a file that cannot be read so is taken as not."""
    try:
        return graph_ops.quantized(path)
    except (OSError, ValueError, EOFError):
        return False


class SessionMaking:
    """The sessions of the `Engine` this is mixed into (its attributes are the engine's)."""

    # The engine's state these methods read and write (set in Engine.__init__).
    _factory: Callable[..., Session]
    _available: Callable[[], Sequence[str]]
    _measure: str
    _lock: threading.Lock
    _closed: bool
    _measurement: Measurement | None
    _plan: choice.Plan | None
    _side_run: tuple[Any, bool] | None
    _seen: tuple[Path, Contract, float] | None
    _warm_s: float | None
    load_count: int
    measurements: int

    def _load(
        self, spec: ModelSpec, generation: int, variant: Variant | None = None, measured: tuple[list[Trial], list[str]] | None = None
    ) -> tuple[Session, ModelInfo]:
        """A serving session of `spec`, warmed up; `variant` (with the `measured` figures and refusals)
        when the idle-time measurement chose it, else as `choice.decide` says."""
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
        plan: choice.Plan | None = None
        if variant is not None:
            (provider, precision), chosen_by = variant, "measured"
            trials, refused = measured or ([], [])
        else:
            (provider, precision), chosen_by, trials, refused, plan = choice.decide(spec, available, wanted[0], self._measure, self._measure_now)
        if chosen_by:
            start = time.perf_counter()  # the load time is the serving session's, not the measurement's
        if spec.providers == "auto" or provider != wanted[0]:
            wanted = _with_cpu(provider)  # an explicit list keeps its order (and its fallbacks) as given
        model_file = path
        if precision == precisions.INT8:
            try:
                model_file = self._int8_file(spec)
            except ModelError as exc:  # a full or read-only cache: the model serves all the same (before: exit 78)
                log.warning("%s; %s serves %s at fp32", exc, providers.short(provider), path.name)
                precision = precisions.FP32
        chain, compiled, pins = ort.provider_chain(wanted, spec, precision)
        session = self._create(model_file, ort.session_options(spec, pins=pins), chain, spec, precision)
        applied = tuple(session.get_providers())
        if applied[0] != provider:
            precision, model_file = precisions.FP32, path  # a fallback to the CPU provider, with the model itself
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
            file=model_file,
        )
        log.info(
            "loaded %s in %.2f s; applied providers: %s; precision %s",
            path.name,
            info.load_seconds,
            ", ".join(applied),
            info.arithmetic,
        )
        if plan is not None:
            plan = dataclasses.replace(plan, spec=spec)  # with the profile the graph chose
        self._plan = plan if plan is not None and applied[0] == provider else None
        return session, info

    @staticmethod
    def _described(spec: ModelSpec, contract: Contract, applied: tuple[str, ...], generation: int, load_s: float, **more: Any) -> ModelInfo:
        # For a square frame the model's input is as large as it gets on the frame's short side.
        floor = model_input_size(contract, spec.profile, (1, 1))
        return ModelInfo(spec, contract, applied, generation, load_s, min_frame_size=floor, quantized=_quantized(more.get("file") or spec.path), **more)

    def _measure_now(self, spec: ModelSpec, variants: list[Variant]) -> Measurement:
        """Measure `variants` before the model's first frame (batch work, `check --providers`); see `choice.decide`."""
        with tempfile.TemporaryDirectory(prefix="depthwatch-trace-") as folder:
            trace_prefix = str(Path(folder) / "trace") if self._measure == "always" else None
            log.info(
                "measuring engines for %s before its first frame (about %.0f s at most): %s",
                spec.path.name, BUDGET_S, ", ".join(f"{providers.short(p)} {q}" for p, q in in_order(variants)),
            )
            try:
                measured = measure(
                    variants, self._measured_session(spec, trace_prefix), self._measured_run(spec),
                    probe=self._measured_probe(spec), trace_nodes=trace_prefix is not None,
                )
            except DepthwatchError:
                raise
            except Exception as exc:  # the reference itself failed: the model is unusable
                raise ModelError(f"cannot load model {spec.path}: {first_line(exc)}{FIX_MODEL}") from None
        self.measurements += 1
        return measured

    def _measured_session(self, spec: ModelSpec, trace_prefix: str | None) -> Callable[[Variant, bool], Session]:
        def create(variant: Variant, traced: bool) -> Session:
            provider, precision = variant
            model_file = self._int8_file(spec, preemptible=True) if precision == precisions.INT8 else spec.path
            if provider == providers.OPENVINO:
                return _openvino_session(spec, precision, model_file)
            chain, _, pins = ort.provider_chain(_with_cpu(provider), spec, precision)
            options = ort.session_options(spec, trace_prefix if traced else None, pins)
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

    def _int8_file(self, spec: ModelSpec, preemptible: bool = False) -> Path:
        """The int8 model of `spec`: cached, or quantized now on probe images (see `quantize`).

        A quantization is stopped by a stop (EngineStopped), and a `preemptible`
        one (the idle-time measurement's) by a live frame too (Preempted: it is
        made again later), between its steps and its calibration images.
        """
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
        preemptible = preemptible and self._measurement is not None  # before the first load nothing waits
        flag = ort.run_options()  # no run's: a flag the engine raises as it does a side run's (`_side`)
        with self._lock:
            if self._closed:
                raise EngineStopped("the inference engine was stopped")
            self._side_run = (flag, preemptible)

        def check() -> None:
            if flag.terminate:
                if self._closed:
                    raise EngineStopped("the inference engine was stopped")
                if preemptible:
                    raise Preempted()

        try:
            return quantize.int8_model(spec.path, root, state, contract.input_name, tensors, check=check)
        finally:
            with self._lock:
                self._side_run = None

    def _create(
        self, path: Path, options: Any, chain: list[tuple[str, dict[str, Any]]], spec: ModelSpec, precision: str
    ) -> Session:
        wanted = [name for name, _ in chain]
        try:
            if wanted[0] == providers.OPENVINO:
                return _openvino_session(spec, precision, path)
            return self._factory(str(path), sess_options=options, providers=chain)
        except Exception as exc:
            if wanted == [providers.CPU]:
                raise ModelError(f"cannot load model {path}: {first_line(exc)}{FIX_MODEL}") from None
            log.warning(
                "could not start %s (%s); falling back to CPU", ", ".join(wanted[:-1]), first_line(exc)
            )
        # The model as it came (not OpenVINO's int8 file): the fallback serves fp32, and says so.
        try:
            return self._factory(str(spec.path), sess_options=options, providers=[providers.CPU])
        except Exception as exc:
            raise ModelError(f"cannot load model {spec.path}: {first_line(exc)}{FIX_MODEL}") from None

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
            raise ModelError(f"the model failed its first run: {first_line(exc)}") from None
