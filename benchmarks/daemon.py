"""depthwatch driven as users run it: `python -m depthwatch run -c CONFIG`, a real process.

Frames go in as an editor should drop them: written under a hidden temporary
name in the watched folder, then renamed to the frame's name. Readiness and
counts come from the daemon's status file; per-frame stage timings from its
log (one line per frame at log level info).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import BenchError, Child, python
from depthwatch.frames.frameline import STAGES, parse_frame_line


@dataclass(frozen=True)
class Knobs:
    """The settings every scenario shares: model, providers and thread counts."""

    model: Path
    profile: str
    providers: str
    intra_op_threads: int
    workers: int
    #: OpenCV's thread count in the daemon (OPENCV_FOR_THREADS_NUM); 0 = OpenCV's default.
    cv2_threads: int = 0
    #: output.refine: depthwatch's default (edges), or none for the comparison.
    refine: str = "edges"
    #: output.normalise: stable (depthwatch's default) or frame.
    normalise: str = "stable"
    #: model.precision: auto (depthwatch's default), fp32, bf16 or fp16.
    precision: str = "auto"

    def env(self) -> dict[str, str]:
        return {"OPENCV_FOR_THREADS_NUM": str(self.cv2_threads)} if self.cv2_threads else {}


def config_dict(knobs: Knobs, folder: Path, patterns: list[str], template: str, status: Path) -> dict[str, Any]:
    """The daemon's config: everything not named here keeps depthwatch's default."""
    return {
        "model": {
            "path": str(knobs.model),
            "profile": knobs.profile,
            "providers": knobs.providers if knobs.providers == "auto" else knobs.providers.split(","),
            "intra_op_threads": knobs.intra_op_threads,
            "precision": knobs.precision,
        },
        "watch": {"folders": [str(folder)], "patterns": patterns},
        "output": {"template": template, "refine": knobs.refine, "normalise": knobs.normalise},
        "daemon": {"workers": knobs.workers, "status_file": str(status), "log_level": "info"},
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class DaemonProcess:
    """`python -m depthwatch run -c CONFIG` as a real process: its config, status file and log.

    The one harness for every test and benchmark that drives the daemon: it
    writes the config (`config` as a dict of sections; the status file is set
    here), starts the process, waits for its status to say running, reads its
    status and its per-frame log lines (through `depthwatch.frames.frameline.parse_frame_line`,
    the reader that lives beside the writer), and always stops it.
    `prefix` goes before the command (e.g. a privilege drop); the log is
    appended to across restarts.
    """

    def __init__(
        self,
        root: Path,
        config: dict[str, Any],
        *,
        name: str = "daemon",
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.name = name
        self.prefix = list(prefix)
        self.env = env
        self.status_path = root / f"{name}.status.json"
        self.log_path = root / f"{name}.log"
        self.config_path = root / f"{name}.yaml"
        config = {section: dict(values) for section, values in config.items()}
        config.setdefault("daemon", {}).setdefault("status_file", str(self.status_path))
        write_config(self.config_path, config)
        self.child: Child | None = None
        #: Seconds from launch until the status said running, for the last start.
        self.startup_s: float | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.child is not None, "the daemon was never started"
        return self.child.proc

    def start(self, wait: bool = True, timeout: float = 120.0) -> DaemonProcess:
        with contextlib.suppress(FileNotFoundError):
            self.status_path.unlink()
        argv = [*self.prefix, python(), "-m", "depthwatch", "run", "-c", str(self.config_path)]
        self.child = Child(f"depthwatch ({self.name})", argv, self.log_path, self.env, cwd=self.root, append=True)
        if not wait:
            return self
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.state() == "running":
                self.startup_s = time.perf_counter() - self.child.started
                return self
            if not self.child.alive():
                raise BenchError(f"depthwatch exited at start with code {self.child.proc.returncode}:\n{self.log()}")
            time.sleep(0.002)
        raise BenchError(f"depthwatch did not report running within {timeout:.0f} s: {self.child.tail()}")

    def wait_measured(self, timeout: float = 600.0) -> float:
        """Wait until the idle-time engine measurement is over; the seconds from launch until it was."""
        assert self.child is not None
        deadline = time.perf_counter() + timeout
        while self.status().get("measuring", False):
            self.child.check_alive()
            if time.perf_counter() > deadline:
                raise BenchError(f"depthwatch was still measuring engines after {timeout:.0f} s: {self.child.tail()}")
            time.sleep(0.05)
        return time.perf_counter() - self.child.started

    def status(self) -> dict[str, Any]:
        """The status file's contents, or {} while there is none (it is replaced atomically)."""
        try:
            return json.loads(self.status_path.read_bytes())
        except (FileNotFoundError, ValueError):
            return {}

    def state(self) -> str | None:
        return self.status().get("state")

    def counts(self) -> dict[str, Any]:
        return self.status().get("counts", {})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def frame_lines(self) -> list[str]:
        """The per-frame log lines, in order."""
        return [line for line in self.log().splitlines() if parse_frame_line(line) is not None]

    def frame_timings(self) -> list[dict[str, float]]:
        """Per-frame stage timings (ms) from the log, in order."""
        out = []
        for line in self.log().splitlines():
            fields = parse_frame_line(line)
            if fields is not None and "total" in fields:
                out.append({k: v for k, v in fields.items() if k in (*STAGES, "total")})
        return out

    def wait_idle(self, since_wall: float, timeout: float = 60.0) -> dict[str, Any]:
        """The first status written after `since_wall` (time.time()) with nothing queued or in flight.

        The daemon rewrites its status only when something changed, so
        `since_wall` must come before the last frame was dropped (its
        completion forces the rewrite that is waited for).
        """
        assert self.child is not None
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            status = self.status()
            if status.get("updated", 0) >= since_wall and status.get("queue_depth") == 0 and status.get("in_progress") == 0:
                return status
            self.child.check_alive()
            time.sleep(0.02)
        raise BenchError(f"depthwatch was still busy after {timeout:.0f} s: {self.child.tail()}")

    def peak_rss(self) -> int:
        return self.child.peak_rss() if self.child else 0

    def send(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Signal the daemon (it finishes its frames and exits 0) and return its exit code.

        Killed, with anything it started, if it is still running after `timeout`.
        """
        if self.child is None:
            return None
        return self.child.stop(timeout, signum)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def close(self) -> None:
        """Make sure it is gone (after a test that may have failed half-way)."""
        if self.child is not None:
            self.child.stop(0.0, signal.SIGKILL)


class Daemon(DaemonProcess):
    """A benchmark's daemon: the shared knobs, watching `root/<name>/`."""

    def __init__(self, root: Path, name: str, knobs: Knobs, patterns: list[str], template: str) -> None:
        self.folder = root / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.knobs = knobs
        super().__init__(root, config_dict(knobs, self.folder, patterns, template, root / f"{name}.status.json"), name=name, env=knobs.env())

    def start(self, wait: bool = True, timeout: float = 120.0) -> float:  # type: ignore[override]
        """Start the daemon; the seconds from launch until its status says running.

        Then wait for its engine choice to settle: a scenario times the engine the daemon
        picked, not the reference it serves from while it measures (`firststart` times that).
        """
        super().start(wait, timeout)
        assert self.startup_s is not None
        if wait:
            self.wait_measured(600)
        return self.startup_s


def stage(folder: Path, name: str, data: bytes) -> Path:
    """Write `data` under a hidden temporary name in `folder`; rename it to `name` to drop it."""
    tmp = folder / f".{name}.bench-tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    return tmp


def drop(folder: Path, name: str, data: bytes) -> float:
    """Drop a frame by rename; the perf_counter time just before the rename."""
    tmp = stage(folder, name, data)
    now = time.perf_counter()
    os.rename(tmp, folder / name)
    return now


def wall_of(perf: float) -> float:
    """The time.time() of a perf_counter() reading taken a moment ago."""
    return time.time() - (time.perf_counter() - perf)


def signature(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of a file, or None: an atomic replace changes the inode."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns
