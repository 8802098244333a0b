"""The idle-time measurement: which engine is fastest here, found a step at a time between frames.

With `providers: auto` the daemon serves at once (from the remembered choice,
or from the reference) and measures the other engines on its own inference
thread when no live frame has come for IDLE_S, one step at a time, so a frame
waits for one step at most (the engine's `_take` schedules the steps). The
engine holds one `IdleMeasurement`, handed the session maker, the tally and
`serve`, the one way it changes what the engine serves: a faster faithful
engine found on the way is served from at once (`_offered`, `_take_offered`);
at the end the choice is remembered (`choice.Decisions`) and, if it is not
what serves, loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable

from depthwatch.model import providers
from depthwatch.model.choosing import choice
from depthwatch.model.choosing import precision as precisions
from depthwatch.model.contract import read_contract
from depthwatch.model.failures import first_line
from depthwatch.model.choosing.gauges import give_back_freed_memory
from depthwatch.model.choosing.making import SessionMaker, Tally, describe
from depthwatch.model.choosing.measurement import MIN_RUNS, Measurement
from depthwatch.model.sessions import Session
from depthwatch.model.spec import ModelInfo
from depthwatch.model.choosing.trials import Trial, fastest_trial, reference

log = logging.getLogger("depthwatch.model.engine")

#: Seconds without a live frame before the idle-time measurement takes a step.
IDLE_S = 1.0
#: Seconds of work the idle-time measurement may take in all (see measurement.Measurement).
BACKGROUND_BUDGET_S = 45.0


class IdleMeasurement:
    """The engine's idle-time measurement: planned by a load, made a step at a time on the inference thread.

    `serve(info, switched)` puts what the measurement found in service: the
    figures of the engine serving (`switched` False, the same session), or a
    faster engine (`switched` True, the session `step` returns).
    """

    def __init__(self, maker: SessionMaker, tally: Tally, serve: Callable[[ModelInfo, bool], None]) -> None:
        self._maker = maker
        self._tally = tally
        self._serve = serve
        #: The measurement to make (`planned`), or under way; and the engine serving while a step runs.
        self._plan: choice.Plan | None = None
        self._measurement: Measurement | None = None
        self._info: ModelInfo | None = None
        #: The measurement has ended and its choice is being put in place (`_measured`).
        self._concluding = False
        #: A measured session kept to serve from: (session, its trial, the serving one's ms).
        self._kept: tuple[Session, Trial, float] | None = None

    @property
    def pending(self) -> bool:
        """Whether a step is to be taken when the engine is idle."""
        return self._plan is not None or self._measurement is not None

    @property
    def measuring(self) -> bool:
        """Whether a measurement is still to be made or under way, or its choice not yet in service."""
        return self.pending or self._concluding

    def planned(self, plan: choice.Plan | None) -> None:
        """The measurement a load planned (None: none); it starts at the next step."""
        self._plan = plan

    def step(self, session: Session, info: ModelInfo) -> Session:
        """One step, `info` being what serves from `session`; the session to serve from after it."""
        self._info = info
        try:
            return self._measure_step(session)
        finally:
            self._info = None

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
                    self._maker.measured_session(plan.spec, None, preemptible=True),
                    self._maker.measured_run(plan.spec, preemptible=True),
                    probe=self._maker.measured_probe(plan.spec, preemptible=True),
                    budget_s=BACKGROUND_BUDGET_S,
                    reference=(session, info.load_seconds) if serving == reference(plan.variants) else None,
                    then=serving,
                    offer=self._offered,
                    lazy=True,
                )
                # A bound, not a forecast: a load, a warm-up, the timed runs and the probes for every
                # variant, each run as slow as one now; the lazy measurement usually does about half.
                bound = len(plan.variants) * (1 + (2 + MIN_RUNS + precisions.PROBES) * self._run_seconds(info))
                log.info(
                    "measuring engines for %s in idle time (%s; at most about %.0f s of work, every frame goes first): %s",
                    plan.spec.path.name,
                    plan.why,
                    min(bound, BACKGROUND_BUDGET_S),
                    ", ".join(f"{providers.short(p)} {q}" for p, q in self._measurement.order),
                )
                return session
            more = self._measurement.step()
            session = self._take_offered(session)
            if more:
                return session
        except Exception as exc:  # a measurement that fails leaves the engine serving as it was
            if self._maker.stopped:  # stopped in the middle of a step: nothing failed
                self.end()
                return session
            log.warning(
                "the engine measurement for %s failed (%s); keeping %s",
                info.spec.path.name, first_line(exc), ", ".join(info.providers),
            )
            log.debug("the measurement's traceback:\n%s", traceback.format_exc())
            self.end()
            return session
        return self._measured(session)

    def _run_seconds(self, info: ModelInfo) -> float:
        """About how long a run of the serving model takes: its warm-up's time, as the load measured it."""
        warm_s = self._maker.warm_s
        return warm_s if warm_s is not None else max(info.load_seconds, 0.01)

    def _offered(self, trial: Trial, session: Session, trials: list[Trial]) -> bool:
        """A faithful variant was measured: keep its session to serve from if it is now the choice (`fastest`).

        The variant serving now must have been measured itself (with the
        reference, it has), so a switch is never to something slower.
        """
        info = self._info
        assert info is not None and trial.run_ms is not None
        serving = (info.providers[0], info.precision)
        if trial.variant == serving or not any(t.variant == serving and t.eligible for t in trials):
            return False
        if fastest_trial(trials) is not trial:
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
        new_info = describe(
            info.spec, read_contract(new_session), applied, info.generation + 1, trial.load_s or 0.0,
            chosen_by="measured", precision=trial.precision,
        )
        log.info(
            "switched %s to %s%s: %.3g ms a frame against %.3g ms",
            info.spec.path.name, trial.provider, "" if trial.precision == precisions.FP32 else f" at {trial.precision}",
            trial.run_ms, was_ms,
        )
        self._info = new_info
        self._serve(new_info, True)
        self._tally.switches += 1
        return new_session  # the old session is released as its last reference goes

    def _measured(self, session: Session) -> Session:
        """The measurement is done: remember it, and swap to its choice if that is not what serves.

        `measuring` stays true until its choice serves and its figures are in
        `info`: a status read in between must not say "measured" over the old engine.
        """
        self._concluding = True
        try:
            return self._conclude(session)
        finally:
            self._concluding = False

    def _conclude(self, session: Session) -> Session:
        measurement, plan, info = self._measurement, self._plan, self._info
        assert measurement is not None and measurement.trials is not None and plan is not None and info is not None
        self._measurement = self._plan = None  # the swap's load below is not a measured run: nothing preempts it
        self._tally.measurements += 1
        serving = (info.providers[0], info.precision)
        trials = measurement.trials
        chosen, refused = choice.report(plan.spec, trials, plan.variants, plan.notes, was=serving)
        if measurement.cut_short:
            log.info("frames kept coming while a variant was made (int8, quantized between them); the next start measures again")
        elif measurement.busy:
            log.info(
                "the measurement ran while other processes kept %.1f cores busy; the next start measures again",
                measurement.others or 0.0,
            )
        plan.decisions.put(plan.key, plan.spec.path, chosen, trials, busy=measurement.busy)
        give_back_freed_memory()
        if chosen == serving:
            self._serve(dataclasses.replace(info, chosen_by="measured", trials=tuple(trials), refused=tuple(refused)), False)
            return session
        # The fastest was measured before the variant serving had figures to beat: load it now.
        try:
            new_session, new_info, _ = self._maker.load(plan.spec, info.generation + 1, variant=chosen, measured=(trials, refused))
        except Exception as exc:  # the faster engine would not load after all: keep serving
            log.warning("could not switch to %s (%s); keeping %s", chosen[0], first_line(exc), ", ".join(info.providers))
            return session
        self._serve(new_info, True)
        self._tally.switches += 1
        log.info("switched %s to %s", plan.spec.path.name, ", ".join(new_info.providers))
        return new_session  # the old session is released as its last reference goes

    def end(self) -> None:
        """Drop the measurement planned or under way (a stop, a reload: it was of the model serving)."""
        if self._measurement is not None:
            self._measurement.close()
        self._measurement = self._plan = None
        self._kept = None
