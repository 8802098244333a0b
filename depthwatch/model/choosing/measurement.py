"""The measurement's steps: load, warm up, time and probe each candidate, one step at a time.

`Measurement` is a generator of steps so the engine's inference thread can
serve a frame between any two (see `choice` for why and when it measures);
`measure` runs all the steps at once.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from depthwatch.model.choosing import precision as precisions
from depthwatch.model.choosing.gauges import BUSY_CORES, CpuLoad, PeakMemory, node_counts
from depthwatch.model.choosing.trials import Trial, Variant, in_order, to_beat

#: Seconds of work the whole measurement may take; each variant gets an equal share of what is left.
BUDGET_S = 90.0
#: Timed runs per variant after its warm-up run.
RUNS = 5
#: Fewest timed runs per variant: a slow model gets this many rather than RUNS.
MIN_RUNS = 2
#: Seconds of timed runs a variant gets at most, once MIN_RUNS are done.
TIMED_S = 1.0
#: Lazy: a variant whose first timed run is this many times the time it must beat gets no more runs.
CLEARLY_SLOWER = 1.5

Create = Callable[[Variant, bool], Any]
Run = Callable[[Any], None]
Probe = Callable[[Any], list[np.ndarray]]


#: Times a variant's making (an int8 quantization) is started over for frames before it is left for the next start.
MOST_CUT_SHORT = 3


class Preempted(Exception):
    """A measured run was stopped to let a frame through; the step is done again later."""


def measure(candidates: Sequence[Variant], create: Create, run: Run, **options: Any) -> Measurement:
    """The whole measurement at once (`depthwatch check --providers`), done; `options` as `Measurement` takes them."""
    measurement = Measurement(candidates, create, run, **options)
    while measurement.step():
        pass
    assert measurement.trials is not None
    return measurement


class Measurement:
    """Time each candidate: load, one warm-up run, timed runs, its probe maps; one step at a time.

    `create(variant, trace_nodes)` makes a session whose first provider is the
    variant's provider at its precision (raising if it cannot), `run(session)`
    runs one frame, `probe(session)` returns its maps of the probe images. A
    step is one of those calls, so the caller (the engine's inference thread)
    can serve a frame between any two; a run it stops for a frame raises
    Preempted and is done again at the next step. Each session is released
    before the next is made. A variant that fails, or whose load and warm-up
    overrun its share of the budget (seconds of work, not of waiting), is
    dropped. Each variant has at least MIN_RUNS timed runs and at most `runs`,
    fewer when they would take more than TIMED_S.

    The reference is measured first and never dropped for time, so there is
    always an answer: the CPU provider at fp32 if it is a candidate, else the
    first fp32 variant. The others' probe maps are compared with its maps.
    `reference` is a session of the reference variant that already serves
    (with its load time): it is measured as it is, never made again. `then`
    is measured right after the reference (the variant that serves, when that
    is not the reference). `offer(trial, session, trials)` is shown each
    faithful variant's session before the measurement lets go of it, with the
    trials so far: a callee that keeps a reference to it (the engine, to serve
    from it) keeps it alive; otherwise it is released there.

    `lazy` (the daemon's idle-time measurement, where every run is work the
    machine does for nothing the user sees): only what can still win is
    measured. The likely fastest come first (`in_order`); a variant
    whose first timed run is CLEARLY_SLOWER than the time it must beat
    (`trials.to_beat`: the choice so far, held to SWITCH of the reference's
    while that is the choice) gets no more runs, and one that does not beat
    it is not probed: it can never be chosen, since that time only falls. It is dropped,
    its time and the reason in its trial. `depthwatch check` and batch work
    measure everything (`lazy` False), so their tables are complete.
    """

    def __init__(
        self,
        candidates: Sequence[Variant],
        create: Create,
        run: Run,
        *,
        probe: Probe | None = None,
        budget_s: float = BUDGET_S,
        runs: int = RUNS,
        trace_nodes: bool = False,
        reference: tuple[Any, float] | None = None,
        then: Variant | None = None,
        offer: Callable[[Trial, Any, list[Trial]], object] | None = None,
        lazy: bool = False,
    ) -> None:
        self.order = in_order(candidates, then, fastest_first=lazy)
        self._lazy = lazy
        self.trials: list[Trial] | None = None
        #: Seconds of work done so far (loads, runs and probes; not the waits between steps).
        self.spent = 0.0
        #: Cores other processes kept busy during the timed runs (over all of them; None: not known here).
        self.others: float | None = None
        self._create, self._run, self._probe = create, run, probe
        self._budget, self._runs, self._trace = budget_s, max(1, runs), trace_nodes
        self._reference = reference
        self._offer = offer
        self._load = CpuLoad()
        self._loads: list[float] = []
        #: (seconds, CPU seconds of other processes) over the timed runs, where /proc/stat can say.
        self._spans = (0.0, 0.0)
        #: A variant's making (its int8 quantization) was cut short by frames MOST_CUT_SHORT times.
        self.cut_short = False
        self._steps = self._measure()

    @property
    def busy(self) -> bool:
        """Whether other processes kept the CPUs busy while the runs were timed, or frames kept a variant from being made."""
        return self.cut_short or (self.others is not None and self.others > BUSY_CORES)

    def step(self) -> bool:
        """Do one step of work; False once the measurement is over (`trials` then holds its figures)."""
        if self.trials is not None:
            return False
        start = time.perf_counter()
        try:
            next(self._steps)
            return True
        except StopIteration as done:
            self.trials = done.value
            if self._spans[0] > 0:  # the timed runs together: a 1 ms run alone reads 0 on a 10 ms clock tick
                self.others = self._spans[1] / self._spans[0]
            else:
                known = [x for x in self._loads if x is not None]
                self.others = statistics.median(known) if known else None
            return False
        finally:
            self.spent += time.perf_counter() - start

    def close(self) -> None:
        """Give up the measurement, releasing the session it was measuring."""
        self._steps.close()

    def _measure(self) -> Generator[None, None, list[Trial]]:
        trials: list[Trial] = []
        reference: list[np.ndarray] | None = None
        for index, variant in enumerate(self.order):
            share = max(0.0, self._budget - self.spent) / (len(self.order) - index)
            adopted = self._reference if index == 0 else None
            bar = to_beat(trials) if self._lazy else None
            trial, maps, session = yield from self._trial(variant, share, must_finish=index == 0, adopted=adopted, beat=bar)
            if index == 0:
                reference = maps
            elif trial.ok and reference is not None and maps is not None:
                trial = replace(trial, agreement=round(precisions.agreement(reference, maps), 6))
            elif trial.ok and self._probe is not None and variant[1] != precisions.FP32:
                # A reduced precision is taken only on evidence that the maps stay faithful.
                trial = replace(trial, error="its maps could not be checked: the probe images failed on the reference")
            trials.append(trial)
            if session is not None and index > 0 and trial.eligible and self._offer is not None:
                self._offer(trial, session, trials)
            session = None  # released (unless kept by the offer) before the next variant's is made
        return trials

    def _again(self, call: Callable[[], Any]) -> Generator[None, None, Any]:
        """`call()` as one step, done again at the next step for as long as a frame preempts it."""
        while True:
            try:
                return call()
            except Preempted:
                yield

    def _trial(
        self,
        variant: Variant,
        share: float,
        must_finish: bool,
        adopted: tuple[Any, float] | None,
        beat: tuple[float, str] | None = None,
    ) -> Generator[None, None, tuple[Trial, list[np.ndarray] | None, Any]]:
        """One variant's trial; `beat`: the time it must reach to be worth its probe, and why (lazy, `to_beat`)."""
        provider, precision = variant
        session = None
        try:
            with PeakMemory(enabled=self._reference is None) as memory:
                used = self.spent
                if adopted is not None:
                    session, load_s = adopted
                else:
                    def create() -> tuple[Any, float]:
                        start = time.perf_counter()
                        return self._create(variant, self._trace), time.perf_counter() - start

                    # Done again while a frame preempts it (an int8 variant's quantization, between its images),
                    # a few times: frames that keep coming would have it started over for good, unsaid.
                    cut = 0
                    while True:
                        try:
                            session, load_s = create()
                            break
                        except Preempted:
                            cut += 1
                            if cut >= MOST_CUT_SHORT:
                                self.cut_short = True  # remembered as busy: the next start measures again
                                return Trial(provider, precision, error=f"its preparation was cut short by frames {cut} times"), None, None
                            yield
                    applied = list(session.get_providers())
                    if not applied or applied[0] != provider:
                        return Trial(provider, precision, load_s, error=f"it did not take the model (ran on {', '.join(applied)})"), None, None
                    yield
                    start = time.perf_counter()
                    yield from self._again(lambda: self._run(session))  # warm-up: first-run allocations, lazy compilation
                    if load_s + time.perf_counter() - start > share and not must_finish:
                        error = f"its load and first run took more than its {share:.0f} s"
                        return Trial(provider, precision, load_s, peak_mib=memory.mib, error=error), None, None
                counts = node_counts(session.end_profiling()) if self._trace and adopted is None else Counter()
                times: list[float] = []
                while len(times) < self._runs:
                    timed = sum(times) / 1000
                    if len(times) >= MIN_RUNS and timed > TIMED_S:
                        break
                    if times and self.spent - used > share and not must_finish:
                        break
                    if beat is not None and times and times[0] > CLEARLY_SLOWER * beat[0]:
                        break
                    yield
                    ms = yield from self._timed(session)
                    times.append(ms)
                median_ms = statistics.median(times) if times else None
                if beat is not None and median_ms is not None and median_ms > beat[0]:
                    error = f"{median_ms:.1f} ms a frame, not under {beat[0]:.1f} ms ({beat[1]}): its maps were not checked"
                    return Trial(provider, precision, load_s, median_ms, len(times), memory.mib, error=error), None, None
                maps = None
                if self._probe is not None and times:
                    yield
                    try:
                        maps = yield from self._again(lambda: self._probe(session))
                    except Exception:  # a model that fails on some inputs still serves; its maps go unchecked
                        maps = None
            trial = Trial(
                provider,
                precision,
                load_s,
                statistics.median(times),
                len(times),
                memory.mib,
                counts.get(provider) if self._trace else None,
                sum(counts.values()) if self._trace else None,
            )
            kept, session = session, None
            return trial, maps, (kept if adopted is None else None)
        except Exception as exc:  # onnxruntime raises its own types; a failing provider is dropped, not fatal
            if must_finish:
                raise
            text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:200]
            return Trial(provider, precision, error=text), None, None
        finally:
            session = None  # released before the next provider's session is made

    def _timed(self, session: Any) -> Generator[None, None, float]:
        """One timed run in ms (done again if a frame preempts it), and the others' load during it."""
        while True:
            self._load.begin()
            t0 = time.perf_counter()
            try:
                self._run(session)
            except Preempted:
                yield
                continue
            ms = (time.perf_counter() - t0) * 1000
            taken = self._load.taken()
            if taken is not None:
                self._spans = (self._spans[0] + taken[0], self._spans[1] + taken[1])
            else:
                self._loads.append(self._load.others())
            return ms
