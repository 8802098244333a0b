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
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import BenchError, Child, python


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
    #: output.normalise: stable (depthwatch's default) or frame.
    normalise: str = "stable"

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
        },
        "watch": {"folders": [str(folder)], "patterns": patterns},
        "output": {"template": template, "normalise": knobs.normalise},
        "daemon": {"workers": knobs.workers, "status_file": str(status), "log_level": "info"},
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


_FRAME_LINE = re.compile(
    r"-> \S+ \d+x\d+ ms: read (?P<read>[\d.]+) decode (?P<decode>[\d.]+) infer (?P<infer>[\d.]+) "
    r"encode (?P<encode>[\d.]+) write (?P<write>[\d.]+) total (?P<total>[\d.]+)"
)


class Daemon:
    """One depthwatch daemon watching `root/<name>/`, with its config, status file and log."""

    def __init__(self, root: Path, name: str, knobs: Knobs, patterns: list[str], template: str) -> None:
        self.name = name
        self.folder = root / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.status_file = root / f"{name}.status.json"
        self.config = write_config(
            root / f"{name}.yaml", config_dict(knobs, self.folder, patterns, template, self.status_file)
        )
        self.knobs = knobs
        self.log = root / f"{name}.log"
        self.child: Child | None = None
        self.startup_s: float | None = None

    def start(self, timeout: float = 120.0) -> float:
        """Start the daemon; the seconds from launch until its status says running."""
        with contextlib.suppress(FileNotFoundError):
            self.status_file.unlink()
        argv = [python(), "-m", "depthwatch", "run", "-c", str(self.config)]
        self.child = Child(f"depthwatch ({self.name})", argv, self.log, self.knobs.env())
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            status = self.status()
            if status and status.get("state") == "running":
                self.startup_s = time.perf_counter() - self.child.started
                return self.startup_s
            self.child.check_alive()
            time.sleep(0.002)
        raise BenchError(f"depthwatch did not report running within {timeout:.0f} s: {self.child.tail()}")

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_file.read_bytes())
        except (FileNotFoundError, ValueError):
            return None

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
            if (
                status
                and status.get("updated", 0) >= since_wall
                and status.get("queue_depth") == 0
                and status.get("in_progress") == 0
            ):
                return status
            self.child.check_alive()
            time.sleep(0.02)
        raise BenchError(f"depthwatch was still busy after {timeout:.0f} s: {self.child.tail()}")

    def frame_timings(self) -> list[dict[str, float]]:
        """Per-frame stage timings (ms) from the daemon's log lines, in order."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [{k: float(v) for k, v in m.groupdict().items()} for m in _FRAME_LINE.finditer(text)]

    def peak_rss(self) -> int:
        return self.child.peak_rss() if self.child else 0

    def stop(self) -> int | None:
        """SIGTERM and wait (the daemon finishes its frames and exits 0)."""
        if self.child is None:
            return None
        return self.child.stop()


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
