"""A real Dask scheduler and real `depthwatch worker` processes on 127.0.0.1, for the farm tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemon_process import TIMEOUT, wait_for

REPO = Path(__file__).resolve().parents[1]


class Scheduler:
    """`dask scheduler` on 127.0.0.1, on a port it picks, announced through its scheduler file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.file = root / "scheduler.json"
        self.log_path = root / "scheduler.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> Scheduler:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(self.file)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.root,
        )
        info = wait_for(lambda: _json(self.file) or self.proc.poll() is not None, what="the scheduler file")
        assert self.proc.poll() is None, self.log_path.read_text()
        self.address = info["address"]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(TIMEOUT)
        self._log.close()


class FarmWorker:
    """`python -m depthwatch worker ADDRESS -c CONFIG --status FILE`, optionally under strace."""

    def __init__(self, root: Path, name: str, scheduler: str, config: Path, *, strace: bool = False) -> None:
        self.root = root
        self.name = name
        self.scheduler = scheduler
        self.config = config
        self.status_path = root / f"{name}.status.json"
        self.log_path = root / f"{name}.log"
        self.strace_path = root / f"{name}.strace" if strace else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FarmWorker:
        prefix: list[str] = []
        if self.strace_path is not None:
            # Only process-creating calls are traced (seccomp filter: the rest runs at full speed).
            prefix = ["strace", "-f", "-ttt", "--seccomp-bpf", "-e", "trace=fork,vfork,clone,clone3",
                      "-e", "signal=none", "-o", str(self.strace_path)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "depthwatch", "worker", self.scheduler, "-c", str(self.config),
             "--name", self.name, "--status", str(self.status_path)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.root,
        )
        return self

    def wait_ready(self) -> FarmWorker:
        wait_for(lambda: self.status().get("state") == "running" or self.proc.poll() is not None, what=f"{self.name} to join")
        assert self.proc.poll() is None, f"{self.name} exited at start:\n{self.log()}"
        return self

    def status(self) -> dict[str, Any]:
        return _json(self.status_path) or {}

    def counts(self) -> dict[str, Any]:
        return self.status().get("counts", {})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def frame_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if " -> " in line and " ms: " in line]

    def send(self, signum: int) -> None:
        """Signal the worker itself: under strace, not strace (which blocks fatal signals with -o)."""
        assert self.proc is not None
        if self.strace_path is None:
            self.proc.send_signal(signum)
        else:
            os.kill(self.status()["pid"], signum)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the worker and return its exit code (strace exits with its tracee's)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.send(signum)
        try:
            return self.proc.wait(TIMEOUT)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.strace_path is not None and self.status().get("pid"):
                try:
                    os.kill(self.status()["pid"], signal.SIGKILL)  # strace's tracee, or it would outlive strace
                except ProcessLookupError:
                    pass
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        if not self._log.closed:
            self._log.close()

    def processes_created_after(self, when: float) -> list[str]:
        """strace lines for fork, vfork or a clone without CLONE_THREAD (a process, not a thread) after `when`."""
        assert self.strace_path is not None
        found = []
        for line in self.strace_path.read_text().splitlines():
            match = re.match(r"^\d+\s+(\d+\.\d+)\s+(fork|vfork|clone3?)\(", line)
            if match is None:
                continue
            is_process = match.group(2) in ("fork", "vfork") or "CLONE_THREAD" not in line
            if is_process and float(match.group(1)) > when:
                found.append(line)
        return found

    def threads_created(self) -> int:
        assert self.strace_path is not None
        return sum(1 for line in self.strace_path.read_text().splitlines() if "CLONE_THREAD" in line)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_once(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def start_once(*args: str, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "depthwatch", "once", *args], stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
