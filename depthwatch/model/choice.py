"""Measure, then choose: which provider runs this model fastest on this machine.

An accelerator is not always faster. CoreML takes only part of a transformer
(Depth Anything's DINOv2 encoder) in dozens of partitions and runs it several
times slower than the CPU provider, with far more memory. So with `providers:
auto` the first load of a model on a machine times a few warm runs on each
available accelerator and on CPU, keeps the fastest, and remembers the choice
in `providers.json` in the cache folder, keyed by the model's sha256, the
onnxruntime version and the machine (platform, architecture, CPU model, host
name and the set of providers onnxruntime offers). Later starts read it and
measure nothing. An explicit provider list is never measured.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from depthwatch.model import caches

log = logging.getLogger("depthwatch.model.providers")

#: Seconds the whole measurement may take; each provider gets an equal share of what is left.
BUDGET_S = 90.0
#: Timed runs per provider after its warm-up run.
RUNS = 5
#: Decisions remembered at most.
MAX_DECISIONS = 64


@dataclass(frozen=True)
class Trial:
    """One provider's figures; `error` says why it was dropped."""

    provider: str
    load_s: float | None = None
    run_ms: float | None = None
    runs: int = 0
    peak_mib: float | None = None
    #: Nodes the provider ran in the traced run, and all nodes of that run.
    nodes: int | None = None
    total_nodes: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.run_ms is not None

    def summary(self) -> str:
        name = self.provider.replace("ExecutionProvider", "")
        if not self.ok:
            return f"{name} dropped ({self.error})"
        return f"{name} {self.run_ms:.1f} ms (load {self.load_s:.2f} s)"


def fastest(trials: Sequence[Trial]) -> str | None:
    """The provider with the lowest median time per frame; earlier wins a tie."""
    good = [t for t in trials if t.ok]
    return min(good, key=lambda t: t.run_ms).provider if good else None  # type: ignore[arg-type,return-value]


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

Create = Callable[[str, bool], Any]
Run = Callable[[Any], None]


def measure(
    candidates: Sequence[str],
    create: Create,
    run: Run,
    *,
    budget_s: float = BUDGET_S,
    runs: int = RUNS,
    trace_nodes: bool = False,
) -> list[Trial]:
    """Time each candidate: load, one warm-up run, then up to `runs` timed runs.

    `create(provider, trace_nodes)` makes a session whose first provider is
    `provider` (raising if it cannot), `run(session)` runs one frame. Each
    session is released before the next is made. A provider that fails, or
    whose load and warm-up overrun its share of the budget, is dropped; CPU is
    measured first and never dropped for time, so there is always an answer.
    """
    order = sorted(candidates, key=lambda p: p != "CPUExecutionProvider")
    deadline = time.perf_counter() + budget_s
    trials = []
    for index, provider in enumerate(order):
        share = max(0.0, deadline - time.perf_counter()) / (len(order) - index)
        trials.append(_trial(provider, create, run, share, runs, trace_nodes, must_finish=provider == "CPUExecutionProvider"))
    return trials


def _trial(provider: str, create: Create, run: Run, share: float, runs: int, trace_nodes: bool, must_finish: bool) -> Trial:
    session = None
    try:
        with PeakMemory() as memory:
            start = time.perf_counter()
            session = create(provider, trace_nodes)
            load_s = time.perf_counter() - start
            applied = list(session.get_providers())
            if not applied or applied[0] != provider:
                return Trial(provider, load_s, error=f"it did not take the model (ran on {', '.join(applied)})")
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
        if not times:
            return Trial(provider, load_s, peak_mib=memory.mib, error=f"its load and first run took more than its {share:.0f} s")
        return Trial(
            provider,
            load_s,
            statistics.median(times),
            len(times),
            memory.mib,
            counts.get(provider) if trace_nodes else None,
            sum(counts.values()) if trace_nodes else None,
        )
    except Exception as exc:  # onnxruntime raises its own types; a failing provider is dropped, not fatal
        if must_finish:
            raise
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:200]
        return Trial(provider, error=text)
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


def decision_key(digest: str, runtime_version: str, available: Sequence[str]) -> str:
    return " | ".join([digest, f"onnxruntime {runtime_version}", machine(), ",".join(sorted(available))])


class Decisions:
    """`providers.json`: the provider measured fastest, per model, runtime, machine and providers on offer."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> dict[str, Any] | None:
        found = caches.read_json(self.path).get(key)
        if isinstance(found, dict) and isinstance(found.get("provider"), str):
            return found
        return None

    def put(self, key: str, model: Path, provider: str, trials: Sequence[Trial]) -> None:
        data = caches.read_json(self.path)
        data[key] = {
            "model": str(model),
            "provider": provider,
            "measured": time.strftime("%Y-%m-%d %H:%M"),
            "at": time.time(),
            "trials": [asdict(t) for t in trials],
        }
        if len(data) > MAX_DECISIONS:
            for old in sorted(data, key=lambda k: data[k].get("at", 0))[: len(data) - MAX_DECISIONS]:
                del data[old]
        caches.write_json(self.path, data)
