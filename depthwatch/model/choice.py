"""Measure, then choose: which provider runs this model fastest on this machine.

An accelerator is not always faster, nor is every runtime on the same CPU:
OpenVINO runs some models twice as fast as onnxruntime's CPU provider, and
bf16 halves the time again where the CPU has it. CoreML takes only part of a transformer
(Depth Anything's DINOv2 encoder) in dozens of partitions and runs it several
times slower than the CPU provider, with far more memory. So with `providers:
auto` depthwatch times a few warm runs of each available accelerator and of
CPU, keeps the fastest, and remembers the choice in `providers.json` in the
cache folder, keyed by the model's sha256, the runtimes' versions and the
machine's abilities (platform, architecture, CPU model, the ISA features that
change the answer, core count, host name, and the providers on offer). Later
starts read it and measure nothing. An explicit provider list is never
measured, except for the precisions `precision: auto` may take on it.

The daemon never waits for a measurement: it serves from the remembered
choice, or from the reference when there is none, and measures in idle time
on the inference thread, a step at a time (`Measurement`), so a frame waits
for one step at most. A measurement taken while other processes kept the
CPUs busy is remembered as such (`busy`) and made again at the next start.

Each candidate is a variant: a provider and a precision. Besides its speed,
each one's maps on the probe images (see `precision`) are compared with the
reference's, the CPU provider's fp32 maps (or, on an explicit provider, its
own fp32 maps): a variant whose maps correlate less than
`precision.FAITHFUL` is measured but never chosen.

The sessions measured are made and released one at a time by the caller (the
engine, on its inference thread): besides the serving session, at most one
measured session is in memory at any moment, and the daemon serves from
exactly one session.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import resource
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.model import caches
from depthwatch.model import precision as precisions

log = logging.getLogger("depthwatch.model.providers")

#: Seconds of work the whole measurement may take; each variant gets an equal share of what is left.
BUDGET_S = 90.0
#: Timed runs per variant after its warm-up run.
RUNS = 5
#: Fewest timed runs per variant: a slow model gets this many rather than RUNS.
MIN_RUNS = 2
#: Seconds of timed runs a variant gets at most, once MIN_RUNS are done.
TIMED_S = 1.0
#: Cores kept busy by other processes, on average over the timed runs, above which a
#: measurement is marked busy (its figures may be those of a contended machine).
BUSY_CORES = 0.5
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


def _rank(variant: Variant) -> tuple[bool, bool]:
    return (variant[1] != precisions.FP32, variant[0] != "CPUExecutionProvider")


def in_order(variants: Sequence[Variant], then: Variant | None = None) -> list[Variant]:
    """The order variants are measured in: the reference first, `then` next, fp32 before reduced precisions."""
    order = sorted(variants, key=_rank)
    if then in order[1:]:
        order.remove(then)
        order.insert(1, then)
    return order


def reference(variants: Sequence[Variant]) -> Variant:
    """The variant every other is compared with: the CPU provider at fp32 if offered, else the first fp32 one."""
    return in_order(variants)[0]


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

    def __init__(self, enabled: bool = True) -> None:
        #: False: no figure, and the process's peak is left alone (a daemon that already
        #: serves keeps its own peak, which a benchmark reads).
        self.enabled = enabled

    def __enter__(self) -> PeakMemory:
        self.mib: float | None = None
        if not self.enabled:
            return self
        self._reset = _reset_peak()
        self._base = _current_rss() if self._reset else _max_rss()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
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


class Preempted(Exception):
    """A measured run was stopped to let a frame through; the step is done again later."""


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
    """The whole measurement at once (`depthwatch check --providers`); see `Measurement`."""
    measurement = Measurement(candidates, create, run, probe=probe, budget_s=budget_s, runs=runs, trace_nodes=trace_nodes)
    while measurement.step():
        pass
    assert measurement.trials is not None
    return measurement.trials


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
    ) -> None:
        self.order = in_order(candidates, then)
        self.trials: list[Trial] | None = None
        #: Seconds of work done so far (loads, runs and probes; not the waits between steps).
        self.spent = 0.0
        #: Cores other processes kept busy during the timed runs (median; None: not known here).
        self.others: float | None = None
        self._create, self._run, self._probe = create, run, probe
        self._budget, self._runs, self._trace = budget_s, max(1, runs), trace_nodes
        self._reference = reference
        self._offer = offer
        self._load = CpuLoad()
        self._loads: list[float] = []
        self._steps = self._measure()

    @property
    def busy(self) -> bool:
        """Whether other processes kept the CPUs busy while the runs were timed."""
        return self.others is not None and self.others > BUSY_CORES

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
            trial, maps, session = yield from self._trial(variant, share, must_finish=index == 0, adopted=adopted)
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
        self, variant: Variant, share: float, must_finish: bool, adopted: tuple[Any, float] | None
    ) -> Generator[None, None, tuple[Trial, list[np.ndarray] | None, Any]]:
        provider, precision = variant
        session = None
        try:
            with PeakMemory(enabled=self._reference is None) as memory:
                used = self.spent
                if adopted is not None:
                    session, load_s = adopted
                else:
                    start = time.perf_counter()
                    session = self._create(variant, self._trace)
                    load_s = time.perf_counter() - start
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
                    yield
                    ms = yield from self._timed(session)
                    times.append(ms)
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
            self._loads.append(self._load.others())
            return ms


class CpuLoad:
    """How many cores other processes kept busy over a span (this process's own threads excluded).

    Linux: the system's busy time from /proc/stat less this process's CPU time.
    Elsewhere: the 1-minute load average less one (the measurement itself), a
    coarser figure. Read without starting a process (the daemon never forks).
    """

    def __init__(self) -> None:
        self._at: tuple[float, float, float] | None = None

    def begin(self) -> None:
        self._at = (time.monotonic(), _system_busy_s() or 0.0, _process_cpu_s())

    def others(self) -> float | None:
        if self._at is None:
            return None
        busy = _system_busy_s()
        if busy is None:
            try:
                return max(0.0, os.getloadavg()[0] - 1.0)
            except OSError:
                return None
        wall = time.monotonic() - self._at[0]
        if wall <= 0:
            return None
        return max(0.0, ((busy - self._at[1]) - (_process_cpu_s() - self._at[2])) / wall)


def _system_busy_s() -> float | None:
    """Seconds all CPUs spent busy since boot (Linux), or None where /proc/stat is not there."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# -- remembered decisions -------------------------------------------------------------


#: The ISA features that change which engine and precision are fastest (x86: AVX2 and
#: AVX-512, bf16, VNNI for int8, AMX; Arm: dot product, bf16, int8 matrix multiply, SVE).
FEATURES = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2",
)
#: The same abilities as macOS names them (sysctl hw.optional.*), mapped to the names above.
_MAC_FEATURES = {
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512f",
    "hw.optional.avx512bw": "avx512bw",
    "hw.optional.avx512vnni": "avx512_vnni",
}


def cpu_features(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The FEATURES this CPU has, sorted: from /proc/cpuinfo (or the text given), else macOS's sysctl."""
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = None
    if text is not None:
        flags: set[str] = set()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                flags.update(value.split())
                break  # every core lists the same
        return tuple(sorted(flags.intersection(FEATURES)))
    return tuple(sorted(name for key, name in _MAC_FEATURES.items() if _sysctl(key, integer=True) == "1"))


def _cpu_model(cpuinfo: str | None) -> str:
    for line in (cpuinfo or "").splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return _sysctl("machdep.cpu.brand_string") or ""


def _sysctl(name: str, integer: bool = False) -> str | None:
    """A macOS sysctl value as text (an integer one as its decimal), through libc (no `sysctl` process: the daemon never forks)."""
    if sys.platform != "darwin":
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        size = ctypes.c_size_t(0)
        if libc.sysctlbyname(name.encode(), None, ctypes.byref(size), None, 0) != 0 or not size.value:
            return None
        buf = ctypes.create_string_buffer(size.value)
        if libc.sysctlbyname(name.encode(), buf, ctypes.byref(size), None, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    raw = buf.raw[: size.value]
    if integer:
        return str(int.from_bytes(raw, sys.byteorder))
    return raw.rstrip(b"\0").decode(errors="replace")


def machine(cpuinfo: str | None = None) -> str:
    """What makes one machine's figures its own: platform, architecture, CPU model and the
    features that change the answer, core count, host name.

    A cache measured on a CPU with AVX-512 BF16 must not be read on one with
    AVX2 alone that has the same model name (the same cloud instance type, a
    home folder shared across farm nodes). Read without starting a process.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = None
    features = cpu_features(cpuinfo) if cpuinfo is not None else cpu_features()
    cpu = _cpu_model(cpuinfo)
    return (
        f"{platform.system()} {platform.machine()} {cpu or '-'} [{' '.join(features) or 'no listed features'}] "
        f"{os.cpu_count() or 0} cores {socket.gethostname()}"
    )


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

    def put(self, key: str, model: Path, chosen: Variant, trials: Sequence[Trial], busy: bool = False) -> None:
        """`busy`: other processes kept the CPUs busy while it was measured; the next start measures again."""
        data = caches.read_json(self.path)
        data[key] = {
            "busy": busy,
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
