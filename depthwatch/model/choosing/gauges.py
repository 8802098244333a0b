"""What a measurement reads besides the clock: others' CPU load, peak memory, the nodes each provider ran.

All read without starting a process (the daemon never forks): /proc on
Linux, getrusage and the load average elsewhere.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

#: Cores kept busy by other processes, on average over the timed runs, above which a
#: measurement is marked busy (its figures may be those of a contended machine).
BUSY_CORES = 0.5


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

    def taken(self) -> tuple[float, float] | None:
        """(seconds of the span, CPU seconds other processes took in it), where /proc/stat can say; None elsewhere.

        Summed over many spans, these give the load of runs shorter than the
        clock tick /proc/stat counts in (10 ms), which one span alone reads as 0.
        """
        busy = _system_busy_s()
        if self._at is None or busy is None:
            return None
        return time.monotonic() - self._at[0], max(0.0, (busy - self._at[1]) - (_process_cpu_s() - self._at[2]))

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
