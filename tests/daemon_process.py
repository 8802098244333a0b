"""The real `depthwatch run` process, driven the way an editor's plugin drives it.

The harness itself is the benchmarks' (`benchmarks.daemon.DaemonProcess`):
one way to start, watch, read and stop the daemon for tests and benchmarks
alike. This adds what tests want on top: a config built from a model and
section overrides, a `watch/` folder, and a privilege drop for permission tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import daemon as harness

TIMEOUT = 60.0


def strace_works() -> str | None:
    """None if `strace -f` can trace a child here, else why not (for a skip)."""
    if shutil.which("strace") is None:
        return "strace is not installed (the CI script installs it)"
    probe = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace not permitted?): {probe.stderr.decode(errors='replace').strip()[:200]}"
    return None


def assert_one_process(trace: Path) -> None:
    """The `strace -f` trace shows one program started and threads only: no fork, no second process."""
    lines = trace.read_text().splitlines()
    execs = [line for line in lines if "execve(" in line]
    assert len(execs) == 1, execs  # the start of python itself
    threads = [line for line in lines if re.search(r"\bclone3?\(", line)]
    assert threads, "strace saw no threads at all: the trace is not working"
    processes = [line for line in lines if re.search(r"\b(v?fork)\(", line)]
    processes += [line for line in threads if "CLONE_THREAD" not in line]
    assert not processes, processes


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


class DaemonProcess(harness.DaemonProcess):
    """A daemon watching `root/watch/` for frame.jpg with `model`; `sections` override the config."""

    def __init__(
        self,
        root: Path,
        model: Path,
        *,
        restricted: bool = False,
        wrapper: tuple[str, ...] = (),
        providers: list[str] | None = None,
        model_options: dict[str, Any] | None = None,
        **sections: dict[str, Any],
    ) -> None:
        """`wrapper`: a command the daemon runs under (strace), after the privilege drop.
        `providers`: model.providers (default auto); a test that needs inference to take its
        time pins ["cpu"], since auto may measure OpenVINO several times faster (and then
        precision fp32 too, unless `model_options` says otherwise: auto would try int8).
        `model_options`: more of the model section (`model` names the model file)."""
        root.mkdir(parents=True, exist_ok=True)
        self.watch = root / "watch"
        self.watch.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "model": {
                "path": str(model),
                "profile": "midas-v21-small",
                **({"providers": providers, "precision": "fp32"} if providers else {}),
                **(model_options or {}),
            },
            "watch": {"folders": [str(self.watch)], "patterns": ["frame.jpg"]},
            "output": {"template": "depth.jpg"},
            "daemon": {"workers": 2},
        }
        for name, values in sections.items():
            config.setdefault(name, {}).update(values)
        super().__init__(root, config, prefix=[*privileges(restricted), *wrapper])

    def start(self, wait: bool = True, timeout: float = TIMEOUT) -> DaemonProcess:
        """Start it and wait for `running`; a daemon that never gets there is stopped before the test fails."""
        try:
            super().start(wait, timeout)
        except BaseException as exc:
            self.close()
            if isinstance(exc, harness.BenchError):
                raise AssertionError(str(exc)) from None
            raise
        return self

    def temp_files(self) -> list[str]:
        return sorted(p.name for p in self.watch.rglob("*") if p.name.endswith(".dwtmp"))


def privileges(restricted: bool) -> list[str]:
    """A command prefix under which file permissions bind, even for root.

    The tests run as root in CI, and root reads and writes anything; dropping
    the two capabilities that let it do so (setpriv is in util-linux) makes an
    unreadable frame or an unwritable folder real for the daemon.
    """
    if not restricted or os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
