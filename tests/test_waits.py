"""The tests' own waits: they stretch with the machine's load and with a daemon's progress, and a failed one shows the log.

A wait that does not scale with the machine is a wall-clock limit in disguise:
it fails a daemon that is only slow. These check the wait itself, with real
threads and real time.
"""

from __future__ import annotations

import threading
import time

import pytest

import daemon_process
from daemon_process import wait_for


def test_a_wait_lasts_as_long_as_progress_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_process, "machine_factor", lambda: 1.0)
    done = threading.Event()
    steps = [0]

    def work() -> None:  # 1.5 s of steps, 0.1 s apart: longer than the wait's 0.5 s, never 0.5 s still
        for _ in range(15):
            time.sleep(0.1)
            steps[0] += 1
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        started = time.monotonic()
        assert wait_for(done.is_set, timeout=0.5, what="the work", progress=lambda: steps[0])
        assert time.monotonic() - started > 0.5
    finally:
        worker.join()


def test_a_wait_without_progress_fails_and_shows_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_process, "machine_factor", lambda: 1.0)
    log = "\n".join(f"line {n}" for n in range(200))
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: False, timeout=0.3, what="nothing", progress=lambda: 7, log=lambda: log)
    message = str(failed.value)
    assert "waiting for nothing (0 s without progress)" in message or "without progress" in message
    assert "line 199" in message and "line 0\n" not in message  # the tail, not the whole log


def test_a_wait_stretches_with_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_process, "machine_factor", lambda: 3.0)
    started = time.monotonic()
    with pytest.raises(AssertionError):
        wait_for(lambda: False, timeout=0.2, what="nothing")
    assert time.monotonic() - started >= 0.6


def test_the_machine_factor_is_the_load_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_process.os, "getloadavg", lambda: (8.0, 0.0, 0.0))
    monkeypatch.setattr(daemon_process.os, "cpu_count", lambda: 2)
    assert daemon_process.machine_factor() == 4.0
    monkeypatch.setattr(daemon_process.os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    assert daemon_process.machine_factor() == 1.0
