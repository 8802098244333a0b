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


def machine_factor() -> float:
    """How many times slower than a quiet machine this one runs now: runnable tasks per core, at least 1.

    A fixed wait is a wall-clock limit in disguise: the suite beside two busy
    loops, or beside another suite, runs several times slower, and a wait that
    holds on a quiet machine fails there for no fault of the daemon's.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: take the machine as quiet
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def wait_for(
    condition: Callable[[], Any],
    timeout: float = TIMEOUT,
    what: str = "condition",
    *,
    progress: Callable[[], Any] | None = None,
    log: Callable[[], str] | None = None,
) -> Any:
    """Poll `condition` until it returns something truthy; fail loudly once it cannot be coming.

    `timeout` is what a quiet machine needs; it stretches with the machine's load
    (`machine_factor`), looked at afresh at every poll. With `progress`, it counts
    from the last time `progress()` changed, so a long job that keeps moving is
    waited for however slow the machine, and one that stops moving fails as soon.
    A failure carries the tail of `log()` (the daemon's log): the reason a wait
    failed is in it, and it is gone once the test's folder is.
    """
    started = last_move = time.monotonic()
    seen = progress() if progress is not None else None
    while True:
        value = condition()
        if value is not None and (isinstance(value, np.ndarray) or value):
            return value
        now = time.monotonic()
        if progress is not None:
            moved = progress()
            if moved != seen:
                seen, last_move = moved, now
        if now - last_move > timeout * machine_factor():
            still = f" ({now - last_move:.0f} s without progress)" if progress is not None else ""
            message = f"timed out after {now - started:.0f} s waiting for {what}{still}"
            if log is not None:
                tail = log().splitlines()[-LOG_LINES_SHOWN:]
                message += f"\nthe daemon's log, its last {len(tail)} lines:\n" + "\n".join(tail)
            raise AssertionError(message)
        time.sleep(0.02)


#: Lines of the daemon's log a failed wait shows.
LOG_LINES_SHOWN = 80


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
        """Start it and wait for `running`; a daemon that never gets there is stopped before the test fails.

        `timeout` is for a quiet machine, stretched by its load as `wait_for` stretches it.
        """
        try:
            super().start(wait, timeout * machine_factor())
        except BaseException as exc:
            self.close()
            if isinstance(exc, harness.BenchError):
                raise AssertionError(str(exc)) from None
            raise
        return self

    def wait_for(self, condition: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
        """`wait_for` on this daemon: `timeout` counts from its last progress, and a failure shows its log.

        Progress is anything its status file says it has done or is doing: the
        counts, the queue, the clip's frames. A clip of hundreds of frames on a
        loaded machine is waited for as long as it keeps moving.
        """
        return wait_for(condition, timeout, what, progress=self.progress, log=self.log)

    def progress(self) -> tuple[Any, ...]:
        """What the daemon has done so far, as its status file says: changes whenever it gets anything done."""
        status = self.status()
        clip = status.get("clip") or {}
        return (
            status.get("state"), status.get("pid"), tuple(sorted((status.get("counts") or {}).items(), key=str)),
            status.get("queue_depth"), status.get("in_progress"), clip.get("done"), clip.get("phase"),
        )

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
