"""The idle-time measurement: which engine is fastest here, found a step at a time between frames.

A mixin of `Engine` (see `engine`): with `providers: auto` the daemon serves at
once (from the remembered choice, or from the reference) and measures the
other engines on its own inference thread when no live frame has come for
IDLE_S, one step at a time, so a frame waits for one step at most (the
engine's `_take` schedules the steps). A faster faithful engine found on the
way is served from at once (`_offered`, `_take_offered`); at the end the choice
is remembered (`choice.Decisions`) and, if it is not what serves, loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback

from depthwatch.model import choice, providers
from depthwatch.model import precision as precisions
from depthwatch.model.contract import read_contract
from depthwatch.model.failures import first_line
from depthwatch.model.gauges import give_back_freed_memory
from depthwatch.model.loading import SessionMaking
from depthwatch.model.measurement import MIN_RUNS, Measurement
from depthwatch.model.sessions import Session
from depthwatch.model.spec import ModelInfo
from depthwatch.model.trials import Trial, fastest_trial, reference

log = logging.getLogger("depthwatch.model.engine")

#: Seconds without a live frame before the idle-time measurement takes a step.
IDLE_S = 1.0
#: Seconds of work the idle-time measurement may take in all (see measurement.Measurement).
BACKGROUND_BUDGET_S = 45.0


class IdleMeasuring(SessionMaking):
    """The idle-time measurement of the `Engine` this is mixed into (its attributes are the engine's).

    A measurement's sessions are made as `SessionMaking` makes them.
    """

    # The engine's state these methods read and write (set in Engine.__init__).
    _info: ModelInfo | None
    _kept: tuple[Session, Trial, float] | None
    _cpu_rebuilt: bool
    _concluding: bool
    switches: int

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
            if self._closed:  # stopped in the middle of a step: nothing failed
                self._end_measurement()
                return session
            log.warning(
                "the engine measurement for %s failed (%s); keeping %s",
                info.spec.path.name, first_line(exc), ", ".join(info.providers),
            )
            log.debug("the measurement's traceback:\n%s", traceback.format_exc())
            self._end_measurement()
            return session
        return self._measured(session)

    def _run_seconds(self, info: ModelInfo) -> float:
        """About how long a run of the serving model takes: its warm-up's time, as the load measured it."""
        return self._warm_s if self._warm_s is not None else max(info.load_seconds, 0.01)

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
        self.measurements += 1
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
            self._info = dataclasses.replace(info, chosen_by="measured", trials=tuple(trials), refused=tuple(refused))
            return session
        # The fastest was measured before the variant serving had figures to beat: load it now.
        try:
            new_session, new_info = self._load(plan.spec, info.generation + 1, variant=chosen, measured=(trials, refused))
        except Exception as exc:  # the faster engine would not load after all: keep serving
            log.warning("could not switch to %s (%s); keeping %s", chosen[0], first_line(exc), ", ".join(info.providers))
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
