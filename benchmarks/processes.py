"""Child processes the benchmark starts, and how they are watched and always stopped.

Every child is started here, logs to a file in the benchmark's temporary
folder, and is stopped by its own pid (SIGTERM, then SIGKILL after a bound;
a gunicorn master's workers too, by their pids). Resident memory is sampled
with psutil and, on Linux, read from the kernel's high-water mark (VmHWM).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

#: The repository root, so children can import `benchmarks` like the parent does.
ROOT = Path(__file__).resolve().parent.parent


class BenchError(Exception):
    """A scenario could not be measured; the message says why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("DEPTHWATCH_CONFIG", None)
    env.update(extra or {})
    return env


class Child:
    """One started process: its log file, its memory, and a stop that always ends it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        *,
        cwd: Path = ROOT,
        append: bool = False,
    ) -> None:
        self.name = name
        self.log = log
        self._log_file = open(log, "ab" if append else "wb")
        self.started = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=child_env(env), stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT
            )
        except BaseException:
            self._log_file.close()
            raise
        self._ps = psutil.Process(self.proc.pid)
        self._peak = 0
        self._stop_sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name=f"rss-{name}", daemon=True)
        self._sampler.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited with code {self.proc.returncode}: {self.tail()}")

    def tail(self, lines: int = 6) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def _processes(self) -> list[psutil.Process]:
        try:
            return [self._ps, *self._ps.children(recursive=True)]
        except psutil.Error:
            return []

    def _rss(self) -> int:
        try:
            return int(self._ps.memory_info().rss)
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        while not self._stop_sampling.wait(0.05):
            self._peak = max(self._peak, self._rss())

    def cpu_seconds(self) -> float:
        """User + system CPU time the process (all its threads) has used so far."""
        try:
            t = self._ps.cpu_times()
        except psutil.Error:
            return float("nan")
        return float(t.user + t.system)

    def thread_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) so far per thread role: the OS name without its `_N` (Linux).

        depthwatch names its threads (`dw-inference` with the engine's own
        operator threads, `dw-worker` with OpenCV's pool; see
        depthwatch/threadnames.py); anything else is `python`. Empty where
        /proc has no per-thread times.
        """
        totals: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        try:
            tasks = list(Path(f"/proc/{self.pid}/task").iterdir())
        except OSError:
            return totals
        for task in tasks:
            try:
                text = (task / "stat").read_text()
            except OSError:
                continue  # the thread ended meanwhile
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            role = re.sub(r"_\d+$", "", name)
            totals[role] = totals.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return totals

    def peak_rss(self) -> int:
        """The largest resident set seen so far (the kernel's VmHWM where there is one)."""
        peak = max(self._peak, self._rss())
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        return peak

    def stop(self, timeout: float = 15.0, signum: int = signal.SIGTERM) -> int | None:
        """`signum`, wait up to `timeout`, then SIGKILL it and anything it started; the exit code."""
        self._stop_sampling.set()
        kids = self._processes()[1:]
        try:
            if self.alive():
                self.proc.send_signal(signum)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            for kid in kids:
                with contextlib.suppress(psutil.Error):
                    if kid.is_running():
                        kid.kill()
        finally:
            self._sampler.join(1.0)
            self._log_file.close()
        return self.proc.returncode


def python() -> str:
    return sys.executable
