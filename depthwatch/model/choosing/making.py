"""Making the engine's sessions: the one that serves, and the ones a measurement times.

A `SessionMaker` is handed to the engine when it is built (with the engine's
`SideRuns`, and a `Tally` the engine reads its counts from) and is called on
the inference thread only: `load` makes a serving session (the variant as
`choice.decide` says, or as the idle-time measurement chose), warms it up and
describes it (`ModelInfo`), and says which idle-time measurement is still to
be made; `measured_session`, `measured_run` and `measured_probe` are what a
measurement is handed; `_side` runs what is not a frame's (a warm-up, a
measured run), stoppable; `_int8_file` is the int8 model, quantized once.
Every session made is counted (`Tally.sessions_made`): the serving one, and
each one the measurement makes, one at a time, on the same thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.errors import DepthwatchError, ModelError
from depthwatch.files import why_not_a_file
from depthwatch.model import graph_ops, providers
from depthwatch.model.choosing import choice, quantize
from depthwatch.model.choosing import precision as precisions
from depthwatch.model.contract import Contract, depth_map, model_input_size, read_contract
from depthwatch.model.failures import FIX_MODEL, first_line
from depthwatch.model.choosing.measurement import BUDGET_S, Measurement, Preempted, measure
from depthwatch.model.choosing.sideruns import SideRuns
from depthwatch.model.profiles import Profile
from depthwatch.model.sessions import Session, ort
from depthwatch.model.spec import ModelInfo, ModelSpec
from depthwatch.model.choosing.trials import Trial, Variant, in_order

log = logging.getLogger("depthwatch.model.engine")


def _with_cpu(provider: str) -> list[str]:
    """`provider` with the CPU provider behind it, to fall back on."""
    return [provider] if provider == providers.CPU else [provider, providers.CPU]


def _openvino_session(spec: ModelSpec, precision: str, path: Path) -> Session:
    """A session on OpenVINO's own runtime, imported only when a variant asks for it (an optional extra).

    `path`: the model's file, or its int8 file (`SessionMaker._int8_file`).
    """
    from depthwatch.model.sessions.openvino import OpenVINOSession

    return OpenVINOSession(path, precision, threads=max(0, spec.intra_op_threads))


def describe(spec: ModelSpec, contract: Contract, applied: tuple[str, ...], generation: int, load_s: float, **more: Any) -> ModelInfo:
    """What a session of `spec` is, as the engine publishes it; `more`: ModelInfo's other fields."""
    # For a square frame the model's input is as large as it gets on the frame's short side.
    floor = model_input_size(contract, spec.profile, (1, 1))
    return ModelInfo(spec, contract, applied, generation, load_s, min_frame_size=floor, quantized=_quantized(more.get("file") or spec.path), **more)


@dataclass
class Tally:
    """What the engine's parts did, for the status; written on the inference thread only."""

    #: Serving sessions loaded for the model asked for (the first load, reloads, a CPU rebuild).
    loads: int = 0
    #: Every session made: the serving ones, the measurement's, the one an int8 calibration times.
    sessions_made: int = 0
    #: Provider measurements made (each times every candidate once).
    measurements: int = 0
    #: Times the idle-time measurement moved serving to a faster engine (not counted in `loads`).
    switches: int = 0


def _quantized(path: Path) -> bool:
    """Whether the graph in `path` is quantized (see `graph_ops`); a file that cannot be read so is taken as not."""
    try:
        return graph_ops.quantized(path)
    except (OSError, ValueError, EOFError):
        return False


class SessionMaker:
    """The engine's sessions, made on its inference thread (see the module's docstring)."""

    def __init__(
        self, factory: Callable[..., Session], available: Callable[[], Sequence[str]], measure: str, sides: SideRuns, tally: Tally
    ) -> None:
        """`factory`, `available` and `measure` as the engine takes them (`session_factory`,
        `available_providers`, `measure_providers`); `sides`: the engine's side runs.

        `measure`: "remembered" measures `auto` before the first load only when no earlier
        measurement is on record (batch work: `once`, a farm worker); "background" serves at once
        from the remembered choice or the reference and measures in idle time (the daemon);
        "always" measures afresh, with profiling, even CPU alone (`depthwatch check --providers`).
        """
        self._factory = factory
        self._available = available
        self._measure = measure
        self._sides = sides
        self._tally = tally
        #: Seconds the last serving session's warm-up run took (the measurement's estimate).
        self.warm_s: float | None = None
        #: A model's contract and the seconds of one run, as an fp32 session of it showed: what
        #: the int8 calibration feeds, and how many images it can afford (see `_int8_file`).
        self._seen: tuple[Path, Contract, float] | None = None

    @property
    def stopped(self) -> bool:
        """Whether the engine is stopping: what a session maker runs now ends."""
        return self._sides.stopped

    def load(
        self, spec: ModelSpec, generation: int, variant: Variant | None = None, measured: tuple[list[Trial], list[str]] | None = None
    ) -> tuple[Session, ModelInfo, choice.Plan | None]:
        """A serving session of `spec`, warmed up, and the idle-time measurement still to make (None:
        none); `variant` (with the `measured` figures and refusals) when the idle-time measurement
        chose it, else as `choice.decide` says."""
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
            except ModelError as exc:  # a full or read-only cache: the model serves all the same, at fp32
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
        self.warm_s = time.perf_counter() - warm
        if applied[0] == providers.CPU and precision == precisions.FP32:
            self._seen = (spec.path, contract, self.warm_s)
        if variant is None:
            self._tally.loads += 1
        if providers.COREML not in applied:
            compiled = None
        info = describe(
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
        return session, info, plan if plan is not None and applied[0] == provider else None

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
                    variants, self.measured_session(spec, trace_prefix), self.measured_run(spec),
                    probe=self.measured_probe(spec), trace_nodes=trace_prefix is not None,
                )
            except DepthwatchError:
                raise
            except Exception as exc:  # the reference itself failed: the model is unusable
                raise ModelError(f"cannot load model {spec.path}: {first_line(exc)}{FIX_MODEL}") from None
        self._tally.measurements += 1
        return measured

    # What a measurement is handed: `preemptible` in idle time (a live frame ends a run, made again
    # later), not before the first load, when no frame waits.

    def measured_session(self, spec: ModelSpec, trace_prefix: str | None, preemptible: bool = False) -> Callable[[Variant, bool], Session]:
        def create(variant: Variant, traced: bool) -> Session:
            provider, precision = variant
            model_file = self._int8_file(spec, preemptible) if precision == precisions.INT8 else spec.path
            if provider == providers.OPENVINO:
                return self._made(_openvino_session(spec, precision, model_file))
            chain, _, pins = ort.provider_chain(_with_cpu(provider), spec, precision)
            options = ort.session_options(spec, trace_prefix if traced else None, pins)
            return self._made(self._factory(str(model_file), sess_options=options, providers=chain))

        return create

    def measured_run(self, spec: ModelSpec, preemptible: bool = False) -> Callable[[Session], None]:
        def run(session: Session) -> None:
            contract = read_contract(session)
            start = time.perf_counter()
            self._warm_up(session, contract, spec.profile, preemptible)
            if self._seen is None or self._seen[0] != spec.path:
                self._seen = (spec.path, contract, time.perf_counter() - start)

        return run

    def measured_probe(self, spec: ModelSpec, preemptible: bool = False) -> Callable[[Session], list[np.ndarray]]:
        def probe(session: Session) -> list[np.ndarray]:
            contract = read_contract(session)
            return [
                depth_map(self._side(session, [contract.output_name], {contract.input_name: x}, preemptible))
                for x in precisions.probe_tensors(contract, spec.profile)
            ]

        return probe

    def _side(self, session: Session, names: list[str], feed: dict[str, np.ndarray], preemptible: bool) -> Any:
        """A run that is not a frame's: a stop ends it (EngineStopped); a `preemptible` one (a run of
        the idle-time measurement) also makes way for a live job (Preempted: it is done again later)."""
        options = ort.run_options()
        with self._sides.running(options, preemptible):
            return session.run(names, feed, options)[0]

    def _made(self, session: Session) -> Session:
        """`session`, counted: every session made, of whatever kind, passes here."""
        self._tally.sessions_made += 1
        return session

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
            reference = self._made(self._factory(str(spec.path), sess_options=ort.session_options(spec), providers=[providers.CPU]))
            contract = read_contract(reference)
            start = time.perf_counter()
            self._warm_up(reference, contract, spec.profile)
            seconds = time.perf_counter() - start
            del reference
        tensors = precisions.probe_tensors(contract, spec.profile, quantize.calibration_count(seconds))
        flag = ort.run_options()  # no run's: a flag the engine raises as it does a side run's (`_side`)
        with self._sides.running(flag, preemptible):
            return quantize.int8_model(
                spec.path, root, state, contract.input_name, tensors, check=lambda: self._sides.check(flag, preemptible)
            )

    def _create(
        self, path: Path, options: Any, chain: list[tuple[str, dict[str, Any]]], spec: ModelSpec, precision: str
    ) -> Session:
        wanted = [name for name, _ in chain]
        try:
            if wanted[0] == providers.OPENVINO:
                return self._made(_openvino_session(spec, precision, path))
            return self._made(self._factory(str(path), sess_options=options, providers=chain))
        except Exception as exc:
            if wanted == [providers.CPU]:
                raise ModelError(f"cannot load model {path}: {first_line(exc)}{FIX_MODEL}") from None
            log.warning(
                "could not start %s (%s); falling back to CPU", ", ".join(wanted[:-1]), first_line(exc)
            )
        # The model as it came (not OpenVINO's int8 file): the fallback serves fp32, and says so.
        try:
            return self._made(self._factory(str(spec.path), sess_options=options, providers=[providers.CPU]))
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
