"""The daemon's process against a hostile machine: signal floods, idle sockets, unwritable
folders, a second daemon from another environment, a full disk. Real process, real sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch.daemon.locks import EX_TEMPFAIL
from depthwatch.errors import EX_CONFIG


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


def tracebacks(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if "Traceback" in line or "Error:" in line.split(" ", 1)[0]]


# -- signals -----------------------------------------------------------------------------------------


def test_fifty_thousand_sighups_are_survived_and_coalesced(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        # Four senders at once, as runaway scripts would: 12,500 each in a tight loop, all
        # let go together: each says it is ready, then waits for its stdin to close.
        flood = (
            "import os, signal, sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
            f"for _ in range(12_500): os.kill({d.proc.pid}, signal.SIGHUP)"
        )
        senders = [
            subprocess.Popen([sys.executable, "-c", flood], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        assert [sender.stdout.readline() for sender in senders] == ["ready\n"] * 4
        start = time.monotonic()
        for sender in senders:
            sender.stdin.close()
        assert [sender.wait(120) for sender in senders] == [0, 0, 0, 0]
        for sender in senders:
            sender.stdout.close()
        burst_s = time.monotonic() - start
        assert d.proc.poll() is None, f"the daemon died in the flood:\n{d.log()[-3000:]}"
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="a map after the flood")
        loads = wait_for(lambda: d.status().get("config_loads"), what="the status")
        # Reloads are coalesced: at most one per main-loop tick (0.25 s) over the burst, and a few more.
        assert 1 <= loads - 1 <= burst_s / 0.25 + 4, (loads, burst_s)
    finally:
        assert d.stop(timeout=30) == 0
    assert "RecursionError" not in d.log() and "lost sys.stderr" not in d.log()


# -- folders the daemon cannot make --------------------------------------------------------------------


def test_a_watch_folder_under_an_unwritable_parent_exits_78_at_start_and_is_refused_on_reload(tmp_path, tiny_model):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        d = DaemonProcess(tmp_path / "a", tiny_model, restricted=True, watch={"folders": [str(locked / "shots")]})
        d.start(wait=False)
        try:
            assert d.proc.wait(60) == EX_CONFIG, d.log()
        finally:
            d.close()
        lines = d.log().strip().splitlines()
        assert "Traceback" not in d.log()
        assert lines[-1] == f"depthwatch: cannot make the watch folder {locked / 'shots'}: permission denied; make it yourself or fix the permissions of {locked}", lines[-1]

        good = DaemonProcess(tmp_path / "b", tiny_model, restricted=True).start()
        try:
            config = yaml.safe_load(good.config_path.read_text())
            config["watch"]["folders"] = [str(locked / "shots")]
            good.config_path.write_text(yaml.safe_dump(config))
            wait_for(lambda: good.status().get("config_error"), what="the refused reload")
            assert "cannot make the watch folder" in good.status()["config_error"]
            assert good.status()["watching"] == [str(good.watch)]
            write_by_rename(good.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
            wait_for(lambda: good.counts().get("done") == 1, what="the old folder still served")
        finally:
            assert good.stop() == 0
        assert "Traceback" not in good.log()
        assert sum("keeping the watch folders of the last good config" in line for line in good.log().splitlines()) == 1
    finally:
        locked.chmod(0o755)
