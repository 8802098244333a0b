"""The real `depthwatch run` process, driven the way an editor's plugin drives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

TIMEOUT = 60.0


def wait_for(condition: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy; fail loudly after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value is not None and (isinstance(value, np.ndarray) or value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


class DaemonProcess:
    """Writes a config, starts `python -m depthwatch run -c it`, reads its status and log."""

    def __init__(
        self, root: Path, model: Path, *, restricted: bool = False, wrapper: tuple[str, ...] = (), **sections: dict[str, Any]
    ) -> None:
        self.root = root
        self.restricted = restricted
        #: A command the daemon runs under (strace).
        self.wrapper = wrapper
        self.watch = root / "watch"
        self.watch.mkdir(parents=True, exist_ok=True)
        self.status_path = root / "status.json"
        self.log_path = root / "daemon.log"
        config: dict[str, Any] = {
            "model": {"path": str(model), "profile": "midas-v21-small"},
            "watch": {"folders": [str(self.watch)], "patterns": ["frame.jpg"]},
            "output": {"template": "depth.jpg"},
            "daemon": {"status_file": str(self.status_path), "workers": 2},
        }
        for name, values in sections.items():
            config.setdefault(name, {}).update(values)
        self.config_path = root / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    def start(self, wait: bool = True) -> DaemonProcess:
        if self.status_path.exists():
            self.status_path.unlink()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*privileges(self.restricted), *self.wrapper, sys.executable, "-m", "depthwatch", "run", "-c", str(self.config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
        )
        if wait:
            wait_for(lambda: self.state() == "running" or self.proc.poll() is not None, what="the daemon to start")
            assert self.proc.poll() is None, f"daemon exited at start:\n{self.log()}"
        return self

    def status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def state(self) -> str | None:
        return self.status().get("state")

    def counts(self) -> dict[str, Any]:
        return self.status().get("counts", {})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def send(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = TIMEOUT) -> int:
        """Signal the daemon and return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(TIMEOUT)
        self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        if self._log is not None:
            self._log.close()
            self._log = None

    def temp_files(self) -> list[str]:
        return sorted(p.name for p in self.watch.rglob("*") if p.name.endswith(".dwtmp"))

    def frame_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if " -> " in line and " ms: " in line]


def privileges(restricted: bool) -> list[str]:
    """A command prefix under which file permissions bind, even for root.

    The tests run as root in CI, and root reads and writes anything; dropping
    the two capabilities that let it do so (setpriv is in util-linux) makes an
    unreadable frame or an unwritable folder real for the daemon.
    """
    if not restricted or os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
