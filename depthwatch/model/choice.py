"""Measure, then choose: which provider runs this model fastest on this machine.

An accelerator is not always faster, nor is every runtime on the same CPU:
OpenVINO runs some models twice as fast as onnxruntime's CPU provider, and
bf16 halves the time again where the CPU has it. CoreML takes only part of a transformer
(Depth Anything's DINOv2 encoder) in dozens of partitions and runs it several
times slower than the CPU provider, with far more memory. So with `providers:
auto` the first load of a model on a machine times a few warm runs on each
available accelerator and on CPU, keeps the fastest, and remembers the choice
in `providers.json` in the cache folder, keyed by the model's sha256, the
onnxruntime version and the machine (platform, architecture, CPU model, host
name and the set of providers onnxruntime offers). Later starts read it and
measure nothing. An explicit provider list is never measured, except for the
precisions `precision: auto` may take on it.

Each candidate is a variant: a provider and a precision. Besides its speed,
each one's maps on the probe images (see `precision`) are compared with the
reference's, the CPU provider's fp32 maps (or, on an explicit provider, its
own fp32 maps): a variant whose maps correlate less than
`precision.FAITHFUL` is measured but never chosen.

The sessions measured are made and released one at a time by the caller (the
engine, on its inference thread), before the serving session is made, so at
most one model is in memory at any moment and the daemon still serves from
exactly one session.
"""

from __future__ import annotations

import json
import logging
import platform
import resource
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.model import caches
from depthwatch.model import precision as precisions

log = logging.getLogger("depthwatch.model.providers")

#: Seconds the whole measurement may take; each provider gets an equal share of what is left.
BUDGET_S = 90.0
#: Timed runs per provider after its warm-up run.
RUNS = 5
#: Decisions remembered at most.
MAX_DECISIONS = 64


#: A candidate: (provider, precision).
Variant = tuple[str, str]


@dataclass(frozen=True)
class Trial:
    """One variant's figures; `error` says why it was dropped."""

    provider: str
    precision: str = precisions.FP32
    load_s: float | None = None
    run_ms: float | None = None
    runs: int = 0
    peak_mib: float | None = None
    #: Nodes the provider ran in the traced run, and all nodes of that run.
    nodes: int | None = None
    total_nodes: int | None = None
    error: str | None = None
    #: The lowest correlation of its probe maps with the reference's (None: it is the reference).
    agreement: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.run_ms is not None

    @property
    def variant(self) -> Variant:
        return (self.provider, self.precision)

    @property
    def faithful(self) -> bool:
        return self.agreement is None or self.agreement >= precisions.FAITHFUL

    @property
    def eligible(self) -> bool:
        """Fast enough to have figures, and its maps those of the reference."""
        return self.ok and self.faithful

    @property
    def name(self) -> str:
        return f"{self.provider.replace('ExecutionProvider', '')} {self.precision}"

    def refusal(self) -> str:
        """Why this variant was not taken for its maps, in one line."""
        return (
            f"{self.precision} on {self.provider.replace('ExecutionProvider', '')}: its maps correlate "
            f"{self.agreement:.4f} with the reference's (at least {precisions.FAITHFUL} needed)"
        )

    def summary(self) -> str:
        if not self.ok:
            return f"{self.name} dropped ({self.error})"
        text = f"{self.name} {self.run_ms:.1f} ms (load {self.load_s:.2f} s)"
        if not self.faithful:
            text += f" not faithful (correlation {self.agreement:.4f} < {precisions.FAITHFUL})"
        return text


def fastest(trials: Sequence[Trial]) -> Variant | None:
    """The faithful variant with the lowest median time per frame; earlier wins a tie."""
    good = [t for t in trials if t.eligible]
    return min(good, key=lambda t: t.run_ms).variant if good else None  # type: ignore[arg-type,return-value]


def unfaithful(trials: Sequence[Trial], provider: str) -> list[Trial]:
    """The reduced precisions of `provider` that were measured and refused for their maps."""
    return [t for t in trials if t.provider == provider and t.ok and not t.faithful]


# -- memory ---------------------------------------------------------------------------


class PeakMemory:
    """Growth of the process's peak resident memory across a block.

    Linux can reset the peak (`/proc/self/clear_refs`), so each provider gets
    its own figure. Elsewhere the peak only grows (getrusage), so a provider
    measured after a hungrier one shows no growth.
    """

    def __enter__(self) -> PeakMemory:
        self.mib: float | None = None
        self._reset = _reset_peak()
        self._base = _current_rss() if self._reset else _max_rss()
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _peak_rss() if self._reset else _max_rss()
        if peak is not None and self._base is not None:
            self.mib = max(0.0, (peak - self._base) / (1 << 20))


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_peak() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _current_rss() -> int | None:
    return _status_bytes("VmRSS")


def _peak_rss() -> int | None:
    return _status_bytes("VmHWM")


def _max_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def give_back_freed_memory() -> None:
    """Return the heap that the measured sessions freed to the system (glibc only; elsewhere nothing).

    glibc keeps freed memory in its arenas for reuse, so after a measurement
    (several sessions made and released) the daemon would serve with ~40 MiB
    of dead sessions still resident. malloc_trim hands it back; it runs once,
    before the serving session is made, so it costs no frame anything.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


# -- tracing (ORT profiling): which provider ran each node ------------------------------------------


def node_counts(trace_file: str | Path) -> Counter[str]:
    """Nodes per provider in an onnxruntime trace (its profiling output: one count per node that ran).

    A compiling provider (CoreML) shows each of its partitions as one fused
    node, so its count is partitions, not the original nodes it took.
    """
    try:
        events = json.loads(Path(trace_file).read_text())
    except (OSError, ValueError):
        return Counter()
    seen: dict[str, str] = {}
    for event in events if isinstance(events, list) else []:
        args = event.get("args") or {}
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith("_kernel_time") and "provider" in args:
            seen[name] = str(args["provider"])
    return Counter(seen.values())


# -- the measurement -----------------------------------------------------------------

Create = Callable[[Variant, bool], Any]
Run = Callable[[Any], None]
Probe = Callable[[Any], list[np.ndarray]]


def measure(
    candidates: Sequence[Variant],
    create: Create,
    run: Run,
    *,
    probe: Probe | None = None,
    budget_s: float = BUDGET_S,
    runs: int = RUNS,
    trace_nodes: bool = False,
) -> list[Trial]:
    """Time each candidate: load, one warm-up run, then up to `runs` timed runs.

    `create(variant, trace_nodes)` makes a session whose first provider is the
    variant's provider at its precision (raising if it cannot), `run(session)`
    runs one frame, `probe(session)` returns its maps of the probe images. Each
    session is released before the next is made. A variant that fails, or
    whose load and warm-up overrun its share of the budget, is dropped. The
    reference is measured first and never dropped for time, so there is always
    an answer: the CPU provider at fp32 if it is a candidate, else the first
    fp32 variant. The others' probe maps are compared with its maps.
    """
    def rank(v: Variant) -> tuple[bool, bool]:
        return (v[0] != "CPUExecutionProvider", v[1] != precisions.FP32)

    order = sorted(candidates, key=rank)
    deadline = time.perf_counter() + budget_s
    trials: list[Trial] = []
    reference: list[np.ndarray] | None = None
    for index, variant in enumerate(order):
        share = max(0.0, deadline - time.perf_counter()) / (len(order) - index)
        trial, maps = _trial(variant, create, run, probe, share, runs, trace_nodes, must_finish=index == 0)
        if index == 0:
            reference = maps
        elif trial.ok and reference is not None and maps is not None:
            trial = replace(trial, agreement=round(precisions.agreement(reference, maps), 6))
        elif trial.ok and probe is not None and variant[1] != precisions.FP32:
            # A reduced precision is taken only on evidence that the maps stay faithful.
            trial = replace(trial, error="its maps could not be checked: the probe images failed on the reference")
        trials.append(trial)
    return trials


def _trial(
    variant: Variant, create: Create, run: Run, probe: Probe | None, share: float, runs: int, trace_nodes: bool, must_finish: bool
) -> tuple[Trial, list[np.ndarray] | None]:
    provider, precision = variant
    session = None
    try:
        with PeakMemory() as memory:
            start = time.perf_counter()
            session = create(variant, trace_nodes)
            load_s = time.perf_counter() - start
            applied = list(session.get_providers())
            if not applied or applied[0] != provider:
                return Trial(provider, precision, load_s, error=f"it did not take the model (ran on {', '.join(applied)})"), None
            run(session)  # warm-up: first-run allocations and any lazy compilation
            counts = node_counts(session.end_profiling()) if trace_nodes else Counter()
            end = start + share
            times: list[float] = []
            while len(times) < runs:
                if time.perf_counter() > end and (times or not must_finish):
                    break
                t0 = time.perf_counter()
                run(session)
                times.append((time.perf_counter() - t0) * 1000)
            maps = None
            if probe is not None and times:
                try:
                    maps = probe(session)
                except Exception:  # a model that fails on some inputs still serves; its maps go unchecked
                    maps = None
        if not times:
            error = f"its load and first run took more than its {share:.0f} s"
            return Trial(provider, precision, load_s, peak_mib=memory.mib, error=error), None
        trial = Trial(
            provider,
            precision,
            load_s,
            statistics.median(times),
            len(times),
            memory.mib,
            counts.get(provider) if trace_nodes else None,
            sum(counts.values()) if trace_nodes else None,
        )
        return trial, maps
    except Exception as exc:  # onnxruntime raises its own types; a failing provider is dropped, not fatal
        if must_finish:
            raise
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:200]
        return Trial(provider, precision, error=text), None
    finally:
        session = None  # released before the next provider's session is made


# -- remembered decisions -------------------------------------------------------------


def machine() -> str:
    """Platform, architecture, CPU model and host name: what makes one machine's figures its own.

    Read without starting a process (the daemon never forks).
    """
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()} {cpu or '-'} {socket.gethostname()}"


def decision_key(digest: str, runtime_version: str, available: Sequence[str], precision: str = precisions.AUTO) -> str:
    """`runtime_version`: every runtime's version, e.g. "onnxruntime 1.32.0, openvino 2026.4.1"."""
    if not runtime_version.startswith("onnxruntime"):
        runtime_version = f"onnxruntime {runtime_version}"
    return " | ".join([digest, runtime_version, machine(), ",".join(sorted(available)), f"precision {precision}"])


class Decisions:
    """`providers.json`: the variant measured fastest, per model, runtimes, machine, providers on offer and precision setting."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> dict[str, Any] | None:
        found = caches.read_json(self.path).get(key)
        if isinstance(found, dict) and isinstance(found.get("provider"), str):
            return found
        return None

    def put(self, key: str, model: Path, chosen: Variant, trials: Sequence[Trial]) -> None:
        data = caches.read_json(self.path)
        data[key] = {
            "model": str(model),
            "provider": chosen[0],
            "precision": chosen[1],
            "measured": time.strftime("%Y-%m-%d %H:%M"),
            "at": time.time(),
            "trials": [asdict(t) for t in trials],
            # Why a reduced precision was not taken, for `depthwatch check` on a later start.
            "refused": [t.refusal() for t in trials if t.provider == chosen[0] and t.ok and not t.faithful],
        }
        if len(data) > MAX_DECISIONS:
            for old in sorted(data, key=lambda k: data[k].get("at", 0))[: len(data) - MAX_DECISIONS]:
                del data[old]
        caches.write_json(self.path, data)
