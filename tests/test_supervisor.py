"""What the daemon says is what is so: a model that hangs, a daemon that stops answering, told apart from one idle.

Against the real daemon process, with models that hang for one kind of frame
(`onnx_models.hanging_model`, `stuck_model`): a black frame runs at once, a
frame with a white pixel hangs the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
from conftest import jpeg_bytes, write_by_rename
from daemon_process import DaemonProcess, wait_for
from onnx_models import hanging_model, stuck_model

from depthwatch.daemon.supervisor import SILENT_AFTER_S
from depthwatch.errors import EX_SOFTWARE


def black() -> bytes:
    return jpeg_bytes(np.zeros((48, 64, 3), np.uint8))


def white() -> bytes:
    return jpeg_bytes(np.full((48, 64, 3), 255, np.uint8))


def _daemon(tmp_path, model, **sections) -> DaemonProcess:
    sections.setdefault("daemon", {}).update({"stall_timeout_s": 1})
    return DaemonProcess(
        tmp_path, model, providers=["cpu"], watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.png"}, **sections
    )


def test_a_run_past_the_stall_bound_is_given_up_and_its_frame_set_aside_across_restarts(tmp_path):
    """A model that hangs on one frame costs that frame, never the inference thread: the run is given up
    past the stall bound, the next frame is mapped, and the frame is not run again after a restart."""
    d = _daemon(tmp_path, hanging_model(tmp_path / "hanging.onnx"))
    try:
        d.start()
        write_by_rename(d.watch / "white.jpg", white())
        wait_for(lambda: d.counts().get("failed") == 1, what="the hanging frame given up")
        write_by_rename(d.watch / "black.jpg", black())
        wait_for(lambda: (d.watch / "black_depth.png").exists(), what="the next frame mapped")
        assert d.state() == "running"
        given_up = [line for line in d.log().splitlines() if "white.jpg: the model ran on it for more than" in line]
        assert len(given_up) == 1 and "given up" in given_up[0] and "set aside" in given_up[0], d.log()
        assert not (d.watch / "white_depth.png").exists()
        assert d.stop() == 0
        before = len(d.log())
        d.start()  # the start-up scan meets the frame again: refused, not run
        wait_for(lambda: d.counts().get("failed") == 1, what="the hanging frame refused at the next start")
        write_by_rename(d.watch / "black2.jpg", black())
        wait_for(lambda: (d.watch / "black2_depth.png").exists(), what="a frame mapped after the restart")
        after = d.log()[before:]
        assert "white.jpg: set aside: the model ran on this version of it past the stall bound" in after, after
        assert "the model ran on it for more than" not in after
        assert d.stop() == 0
    finally:
        d.close()


def test_a_run_that_cannot_be_given_up_makes_the_daemon_stalled_and_exit_70_then_the_next_start_serves(tmp_path):
    """A run inside one long operator cannot be given up: the daemon says `stalled` with the reason and
    exits EX_SOFTWARE, for the service manager to start it again; then the frame is not run again and
    the next frame is mapped."""
    requests = __import__("pytest").importorskip("requests")
    d = _daemon(tmp_path, stuck_model(tmp_path / "stuck.onnx"), api={"enabled": True, "port": 0})
    try:
        d.start()
        url = wait_for(lambda: d.status().get("api"), what="the API address")
        write_by_rename(d.watch / "white.jpg", white())
        answers: list[tuple[int, str, str]] = []
        while d.proc.poll() is None:  # it exits of itself: nothing stops it
            try:
                health = requests.get(f"{url}/health", timeout=5)
                body = health.json()
                answers.append((health.status_code, body["state"], body.get("health_error") or ""))
            except (requests.RequestException, ValueError):
                pass  # its listener closes as it stops
            time.sleep(0.02)
        assert d.stop() == EX_SOFTWARE, d.log()
        stalled = [a for a in answers if a[1] == "stalled"]
        assert stalled and all(code == 503 and "white.jpg" in why for code, _, why in stalled), answers[-5:]
        status = d.status()
        assert status["state"] == "stalled", status
        assert "white.jpg" in status["health_error"] and "did not stop when given up" in status["health_error"], status
        assert "white.jpg" in d.log() and "exiting, so that the service manager starts depthwatch again" in d.log()
        out = subprocess.run(
            [sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)], capture_output=True, text=True, timeout=60
        )
        assert "stalled" in out.stdout and "could not be given up" in out.stdout, out.stdout
        before = len(d.log())
        d.start()  # as launchd's KeepAlive or systemd's Restart=on-failure would
        write_by_rename(d.watch / "black.jpg", black())
        wait_for(lambda: (d.watch / "black_depth.png").exists(), what="the next frame mapped after the restart")
        wait_for(lambda: d.counts().get("failed") == 1, what="the stuck frame refused at the next start")
        after = d.log()[before:]
        assert "white.jpg: set aside: the model ran on this version of it past the stall bound" in after, after
        assert d.state() == "running"
        assert d.stop() == 0
    finally:
        d.close()


def test_an_idle_daemon_keeps_its_heartbeat_and_one_that_stops_answering_is_told_apart(tmp_path, tiny_model):
    """An idle daemon rewrites its heartbeat, so `status` tells it from one that has stopped answering."""
    d = DaemonProcess(tmp_path, tiny_model)
    try:
        d.start()
        first = wait_for(lambda: d.status().get("heartbeat_at"), what="a heartbeat")
        wait_for(lambda: d.status().get("heartbeat_at", 0) > first, what="the heartbeat again, idle")
        status = d.status()
        assert status["threads"]["inference"] == {"doing": "idle"}, status["threads"]
        assert {"inference", "settle", "scan", "clip", "main"} <= set(status["threads"]), status["threads"]

        def said() -> str:
            return subprocess.run(
                [sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)],
                capture_output=True, text=True, timeout=60,
            ).stdout

        assert "doing:" in said() and "idle" in said()
        os.kill(d.proc.pid, signal.SIGSTOP)  # as a daemon wedged whole would be
        try:
            # `status` is asked once the heartbeat in the status file is older than the bound it applies:
            # asked from the stop on, it was a Python process started every few hundredths of a second
            # for half a minute (20 s of CPU, a core of a 2-core machine) to say "running" each time.
            def silent() -> bool:
                beat = d.status().get("heartbeat_at")
                return isinstance(beat, (int, float)) and time.time() - beat > SILENT_AFTER_S

            wait_for(lambda: silent() and "not answering" in said(), timeout=90, what="status to say the daemon is not answering")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        wait_for(lambda: "not answering" not in said(), what="status to say it answers again")
        assert d.stop() == 0
    finally:
        d.close()


def test_systemd_is_told_watchdog_while_the_daemon_serves(tmp_path, tiny_model):
    """With WatchdogSec= in the unit, systemd restarts a daemon that stops sending WATCHDOG=1."""
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(0.5)
    d = DaemonProcess(tmp_path, tiny_model)
    d.env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"}
    messages: list[str] = []

    def watchdogs() -> int:
        try:
            messages.append(listener.recv(4096).decode())
        except TimeoutError:
            pass
        return sum("WATCHDOG=1" in m for m in messages)

    try:
        d.start()
        wait_for(lambda: watchdogs() >= 3, what="WATCHDOG=1 several times")
        assert any("READY=1" in m for m in messages), messages
        assert d.stop() == 0
    finally:
        d.close()
        listener.close()
    assert json.loads(d.status_path.read_text())["state"] == "stopped"


def test_a_failing_model_is_the_models_fault_not_the_frames_and_another_model_clears_it(tmp_path):
    """Under a NaN model /health is 503 and both kinds of request get 503 "the model is failing", never a
    422 held against the frame: after a reload to a good model the same, unchanged frame is mapped."""
    import yaml

    requests = __import__("pytest").importorskip("requests")
    from onnx_models import brightness_model, sqrt_model

    good = brightness_model(tmp_path / "good.onnx", size=(16, 16))
    d = DaemonProcess(
        tmp_path, sqrt_model(tmp_path / "nan.onnx"), providers=["cpu"], watch={"patterns": ["*.jpg"]},
        output={"template": "{stem}_depth.png"}, api={"enabled": True, "port": 0},
    )
    try:
        d.start()
        url = wait_for(lambda: d.status().get("api"), what="the API address")
        write_by_rename(d.watch / "n2.jpg", black())
        answer = requests.post(f"{url}/predict", params={"frame": "n2.jpg"}, timeout=60)
        assert answer.status_code == 503 and answer.text.startswith("the model is failing: n2.jpg:"), answer.text
        body = requests.post(f"{url}/predict", data=black(), headers={"Content-Type": "image/jpeg"}, timeout=60)
        assert body.status_code == 503 and body.text.startswith("the model is failing:"), body.text
        for i in range(5):
            write_by_rename(d.watch / f"dark{i}.jpg", black())
        health_error = wait_for(lambda: d.status().get("health_error"), what="the model's health error")
        health = requests.get(f"{url}/health", timeout=60)
        assert health.status_code == 503 and health.json()["health_error"] == health_error, health.text
        config = yaml.safe_load(d.config_path.read_text())
        config["model"]["path"] = str(good)
        d.config_path.write_text(yaml.safe_dump(config))
        d.send(signal.SIGHUP)
        wait_for(lambda: "now using model good.onnx" in d.log(), what="the reload to the good model")
        wait_for(lambda: d.status().get("health_error") is None, what="the health error cleared by the new model")
        assert requests.get(f"{url}/health", timeout=60).status_code == 200
        again = requests.post(f"{url}/predict", params={"frame": "n2.jpg"}, timeout=60)  # the same, unchanged frame
        assert again.status_code == 200 and again.text == "DONE", again.text
        assert (d.watch / "n2_depth.png").exists()
        assert d.stop() == 0
    finally:
        d.close()


def test_a_frame_the_process_keeps_ending_on_in_a_worker_stage_is_named_then_set_aside(tmp_path, tiny_model):
    """A frame that ends the process while a worker reads, decodes or renders it (an OOM kill) is named at
    the next start, and set aside once it has ended the process twice."""
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.png", "error_sidecar": True})
    notes = tmp_path / "daemon.status.json.threads"
    rng = np.random.default_rng(0)
    write_by_rename(d.watch / "big.jpg", jpeg_bytes(rng.integers(0, 255, (6000, 8000, 3), np.uint8)))

    def ended_in_a_worker() -> None:
        d.start()
        wait_for(lambda: notes.exists() and b"big.jpg" in notes.read_bytes(), what="a worker at the frame")
        d.kill()  # as the kernel's OOM killer ends it: no line, no status
        d.proc.wait(60)

    try:
        ended_in_a_worker()
        ended_in_a_worker()
        said = d.log()
        assert "big.jpg: depthwatch was reading or decoding it" in said or "big.jpg: depthwatch was rendering or writing it" in said, said
        assert "it is tried once more" in said
        d.start()
        wait_for(lambda: d.counts().get("failed") == 1, what="the frame set aside")
        assert "big.jpg: the process ended 2 times while depthwatch was re" in d.log(), d.log()
        assert not (d.watch / "big_depth.png").exists()
        assert "set aside" in (d.watch / "big.jpg.error.json").read_text()
        assert d.stop() == 0 and not notes.exists()
    finally:
        d.close()


def test_sigterm_is_honoured_in_time_after_a_reload_while_the_settle_thread_is_stuck(tmp_path, tiny_model):
    """A reload that changes the watch settings waits for the settle thread within a bound: with that thread
    in a `stat` that does not come back (a dead network volume), SIGTERM is still honoured in time."""
    import psutil
    import pytest
    import yaml
    from daemon_process import strace_works

    why = strace_works()
    if why:
        pytest.skip(why)
    frame = tmp_path / "watch" / "frame.jpg"
    # Every system call naming the frame takes ten minutes: the settle thread's look at it hangs.
    stuck = ("strace", "-f", "-qq", "-o", os.devnull, "-P", str(frame), "-e", "inject=all:delay_enter=600000000")
    d = DaemonProcess(tmp_path, tiny_model, wrapper=stuck, daemon={"shutdown_timeout_s": 2})
    try:
        d.start()
        daemon = psutil.Process(d.proc.pid).children()[0].pid  # strace's child: the daemon itself
        write_by_rename(frame, black())
        wait_for(lambda: d.status().get("threads", {}).get("settle", {}).get("doing") == "frame.jpg (settle)", what="the settle thread stuck")
        config = yaml.safe_load(d.config_path.read_text())
        config["watch"]["patterns"] = ["frame.jpg", "*.png"]
        d.config_path.write_text(yaml.safe_dump(config))
        os.kill(daemon, signal.SIGHUP)
        wait_for(lambda: "*.png" in d.log(), what="the reload's new watch")
        assert d.state() == "running"
        os.kill(daemon, signal.SIGTERM)
        # The shutdown's own bound (2 s), never the ten minutes of the stuck `stat`. (strace itself waits
        # out the delays it injects before it exits: the daemon's own word is what tells.)
        wait_for(lambda: d.state() == "stopped", timeout=30, what="the daemon stopped within its shutdown bound")
        wait_for(lambda: any(line.endswith(" stopped") for line in d.log().splitlines()), what="its last line")
    finally:
        d.close()


def test_the_incomplete_count_never_goes_backwards_across_a_reload(tmp_path, tiny_model):
    """counts.incomplete goes on across a reload, which makes a new watcher with a count of its own."""
    import yaml

    d = DaemonProcess(tmp_path, tiny_model, watch={"incomplete_timeout_s": 0.5})
    try:
        d.start()
        write_by_rename(d.watch / "frame.jpg", black()[: len(black()) // 2])  # a JPEG cut off: it never completes
        wait_for(lambda: d.counts().get("incomplete") == 1, what="the frame counted incomplete")
        config = yaml.safe_load(d.config_path.read_text())
        config["watch"]["patterns"] = ["frame.jpg", "*.png"]
        d.config_path.write_text(yaml.safe_dump(config))
        d.send(signal.SIGHUP)
        wait_for(lambda: "*.png" in d.log(), what="the reload's new watch")
        wait_for(lambda: d.status().get("config_loads") == 2, what="the reload applied")
        assert d.counts().get("incomplete", 0) >= 1, d.status()
        assert d.stop() == 0
        assert d.counts().get("incomplete", 0) >= 1
    finally:
        d.close()
