"""`depthwatch status` against a real daemon started by hand, and what its first log line says.

The autouse fixture in conftest points XDG_STATE_HOME and XDG_CONFIG_HOME at a
temporary folder, so the daemons here keep their status files there.
"""

from __future__ import annotations

import os
import json
import re
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import wait_for

NOT_RUNNING = 3


def depthwatch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


class HandStarted:
    """`depthwatch run ARGS` typed in a terminal: no status file named, the log on stderr."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.log_path = cwd / "run.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "depthwatch", "run", *args], cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_for(lambda: "ready:" in self.log() or self.proc.poll() is not None, what="the daemon to be ready")
        assert self.proc.poll() is None, self.log()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(60)
        finally:
            self._log.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)
        self._log.close()


def state_folder() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "depthwatch" / "daemons"


def rows(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^([a-z ]+):\s+(.*)$", text, re.M)}


def test_status_shows_a_hand_started_daemon_and_exits_3_once_it_stopped(tmp_path, tiny_model):
    watch = tmp_path / "shots"
    watch.mkdir()
    assert depthwatch(tmp_path, "status").returncode == NOT_RUNNING
    daemon = HandStarted(tmp_path, "--model", str(tiny_model), "--profile", "midas-v21-small", "--watch", str(watch))
    try:
        daemon.wait_ready()
        status_files = list(state_folder().glob("defaults-*.json"))
        assert len(status_files) == 1
        first = daemon.log().splitlines()[0]
        assert first.endswith(f"INFO    config built-in defaults; status file {status_files[0]}")
        write_by_rename(watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (watch / "depth.jpg").exists(), what="the depth map")
        wait_for(lambda: "1 done" in depthwatch(tmp_path, "status").stdout, what="status to count the frame")

        running = depthwatch(tmp_path, "status")

        assert running.returncode == 0, running.stdout + running.stderr
        shown = rows(running.stdout)
        started = re.fullmatch(rf"running, pid {daemon.proc.pid}, since (\S+)", shown["depthwatch"])
        assert started is not None, shown
        assert datetime.fromisoformat(started.group(1)).tzinfo is not None
        assert shown["config"] == "built-in defaults"
        assert shown["status file"].startswith(str(status_files[0]))
        # The precision too (fp32 or int8, as auto measured): the line shows what the status file holds.
        precision = json.loads(status_files[0].read_text())["precision"]
        assert precision in ("fp32", "int8")
        assert shown["model"] == f"{tiny_model} (profile midas-v21-small; providers CPUExecutionProvider at {precision})"
        assert shown["watching"] == str(watch)
        assert shown["frames"].startswith("1 done, 0 failed, 0 superseded")
        assert shown["last frame"].startswith(f"{watch / 'frame.jpg'} (")
        assert shown["last error"] == "none"
    finally:
        assert daemon.stop() == 0
        daemon.close()

    stopped = depthwatch(tmp_path, "status")
    assert stopped.returncode == NOT_RUNNING
    assert rows(stopped.stdout)["depthwatch"].startswith("not running (stopped at ")
    assert "waiting for" not in stopped.stdout  # its folder is there: a stopped daemon waits for nothing
    assert watch.is_dir()


def test_status_tells_the_truth_about_a_daemon_whose_config_file_now_holds_a_bad_edit(tmp_path, tiny_model):
    """The daemon runs on in its last good config; `status -c config.yaml` (and `status` beside it) still
    shows it, with the edit's error, rather than exiting 78 (or saying "not running"). And a frame named with
    a newline cannot add lines of its own to what status prints (a forged "last error: none")."""
    watch = tmp_path / "shots"
    watch.mkdir()
    config = tmp_path / "config.yaml"
    settings = {
        "model": {"path": str(tiny_model), "profile": "midas-v21-small"},
        "watch": {"folders": [str(watch)], "patterns": ["*.jpg"]},
        "output": {"template": "{stem}_depth.jpg"},
    }
    config.write_text(yaml.safe_dump(settings))
    daemon = HandStarted(tmp_path, "-c", str(config))
    try:
        daemon.wait_ready()
        forged = "x\nlast error:   none\nhealth:       ok.jpg"
        write_by_rename(watch / forged, jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (watch / "x\nlast error:   none\nhealth:       ok_depth.jpg").exists(), what="the map")
        wait_for(lambda: "1 done" in depthwatch(tmp_path, "status", "-c", str(config)).stdout, what="status to count it")
        config.write_text(config.read_text() + "watch: [unclosed\n")
        wait_for(lambda: "not valid YAML" in daemon.log(), what="the daemon to refuse the edit")
        for args in (("status", "-c", str(config)), ("status",)):
            done = depthwatch(tmp_path, *args)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
            shown = rows(done.stdout)
            assert shown["depthwatch"].startswith(f"running, pid {daemon.proc.pid}"), done.stdout
            assert "not valid YAML" in shown["config error"]
            assert shown["last frame"].startswith(f"{watch}/x\\nlast error:   none\\nhealth:"), shown["last frame"]  # escaped, as the log has it
            assert [line for line in done.stdout.splitlines() if line.startswith(("last error", "health"))] == ["last error:   none"]
        assert "not valid YAML" in depthwatch(tmp_path, "status", "-c", str(config)).stderr
    finally:
        assert daemon.stop() == 0
        daemon.close()


def test_an_edit_naming_a_model_that_cannot_be_loaded_is_shown_once(tmp_path, tiny_model):
    """A model that cannot be loaded is shown once, as a "model error", not again as a "config error"."""
    config = tmp_path / "config.yaml"
    settings = {"model": {"path": str(tiny_model), "profile": "midas-v21-small"}, "watch": {"folders": [str(tmp_path)]}}
    config.write_text(yaml.safe_dump(settings))
    daemon = HandStarted(tmp_path, "-c", str(config))
    try:
        daemon.wait_ready()
        missing = tmp_path / "missing.onnx"
        settings["model"]["path"] = str(missing)
        config.write_text(yaml.safe_dump(settings))
        wait_for(lambda: f"keeping model {tiny_model}" in daemon.log(), what="the daemon to refuse the edit")
        done = depthwatch(tmp_path, "status", "-c", str(config))
        shown = rows(done.stdout)
        assert str(missing) in shown["model error"], done.stdout
        assert done.stdout.count(str(missing)) == 1 and "config error" not in shown, done.stdout
    finally:
        assert daemon.stop() == 0
        daemon.close()


def test_a_start_whose_model_does_not_load_leaves_a_status_saying_so(tmp_path):
    """The status file is written as the start begins (`starting`: a large model's load takes a while,
    and status must not say "not running" all along), and a start that ends there says why."""
    watch = tmp_path / "shots"
    watch.mkdir()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    daemon = HandStarted(tmp_path, "--model", str(broken), "--profile", "midas-v21-small", "--watch", str(watch))
    try:
        assert daemon.proc.wait(120) == 78
    finally:
        daemon.close()
    done = depthwatch(tmp_path, "status")
    assert done.returncode == NOT_RUNNING
    shown = rows(done.stdout)
    assert shown["depthwatch"].startswith("not running (stopped at "), done.stdout
    assert shown["model error"].startswith(f"cannot load model {broken}"), done.stdout


def test_a_daemon_that_died_is_shown_as_not_running(tmp_path, tiny_model):
    daemon = HandStarted(tmp_path, "--model", str(tiny_model), "--profile", "midas-v21-small", "--status", "s.json")
    try:
        daemon.wait_ready()
        pid = daemon.proc.pid
        assert depthwatch(tmp_path, "status", "--status", "s.json").returncode == 0
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(60)

        dead = depthwatch(tmp_path, "status", "--status", "s.json")

        assert dead.returncode == NOT_RUNNING
        assert rows(dead.stdout)["depthwatch"].startswith(f"not running (pid {pid} is gone without stopping cleanly;")
    finally:
        daemon.close()


def test_a_stray_status_file_is_one_line_and_a_last_error_is_shown_as_the_log_has_it(tmp_path):
    """A file in the state folder with fields of other types (an ISO date for `updated`, counts as text)
    is one line, not a traceback that takes `depthwatch status` down and hides every daemon; and a last
    error, escaped as the log escapes names, is shown as the log has it, not escaped again
    (`back\\\\slash`, matching neither file nor log)."""
    from depthwatch.daemon.status import Status, write_status
    from depthwatch.logtext import shown

    folder = tmp_path / "state" / "depthwatch" / "daemons"
    folder.mkdir(parents=True)
    live = Status(pid=os.getpid(), state="running")
    live.counts.last_error = f"{shown('/shots/back' + chr(92) + 'slash.jpg')}: not a JPEG"
    write_status(folder / "live.json", live)
    (folder / "dated.json").write_text('{"state": "running", "pid": 1, "updated": "2026-01-01T00:00:00"}')
    (folder / "counted.json").write_text('{"state": "stopped", "pid": 1, "counts": "n/a"}')
    (folder / "far.json").write_text('{"state": "stopped", "pid": 1, "updated": 1e300}')
    done = subprocess.run([sys.executable, "-m", "depthwatch", "status"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.count("depthwatch: cannot read the status file") == 3, done.stdout
    assert f"running, pid {os.getpid()}" in done.stdout
    assert "last error:  /shots/back" + chr(92) * 2 + "slash.jpg: not a JPEG" in done.stdout, done.stdout  # as the log has it


def test_a_gone_daemons_clip_and_frames_in_hand_are_said_in_the_past(tmp_path):
    """A daemon killed mid-clip does not show `79/360 frames, 36.4 fps, about 8 s left` and its frames
    `1 in progress`, as if it ran; one that stopped after a failure is not "gone without stopping cleanly"."""
    from depthwatch.daemon.status import Status, write_status

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    status = Status(pid=int(gone.stdout), state="running", in_progress=1)
    status.clip = {"source": "/shots/shot.mp4", "output": "/shots/shot_depth.mov", "done": 79, "total": 360, "rate": 36.4, "eta_s": 8}
    write_status(tmp_path / "s.json", status)
    out = depthwatch(tmp_path, "status", "--status", "s.json").stdout
    assert rows(out)["clip"] == "shot.mp4 -> shot_depth.mov: stopped at 79/360 frames (the next start maps it again)", out
    assert "1 in progress when it stopped (the next start maps them)" in rows(out)["frames"]
    status.state = "failed"
    write_status(tmp_path / "s.json", status)
    assert rows(depthwatch(tmp_path, "status", "--status", "s.json").stdout)["depthwatch"].startswith("not running (it stopped after a failure at ")


def test_run_from_a_checkout_uses_its_config_yaml_and_says_so(tmp_path, tiny_model):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "config.yaml").write_text(
        f"model:\n  path: {tiny_model}\n  profile: midas-v21-small\nwatch:\n  folders: [frames]\n", encoding="utf-8"
    )
    daemon = HandStarted(checkout)
    try:
        daemon.wait_ready()
        assert f"config {checkout / 'config.yaml'}; status file {state_folder()}/config-" in daemon.log().splitlines()[0]
        assert (checkout / "frames").is_dir()  # the folder the file names, not the default tmp/
        shown = depthwatch(checkout, "status")
        assert shown.returncode == 0
        assert rows(shown.stdout)["config"] == str(checkout / "config.yaml")

        # A reload reads the file it started with. Searching again, a user config that appeared
        # (`service install` writes one) would take over at the next edit, and a config moved away
        # would switch the daemon to the built-in defaults, watching ./tmp, without a word.
        user = Path(os.environ["XDG_CONFIG_HOME"]) / "depthwatch" / "config.yaml"
        user.parent.mkdir(parents=True)
        user.write_text(f"model:\n  path: {tiny_model}\n  profile: midas-v21-small\nwatch:\n  folders: [other]\n")
        text = (checkout / "config.yaml").read_text()
        write_by_rename(checkout / "config.yaml", text.replace("watch:", "output:\n  template: d2.jpg\nwatch:").encode())
        wait_for(lambda: daemon.log().count("reloading the config") == 1, what="the edit to be read")
        write_by_rename(checkout / "frames" / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (checkout / "frames" / "d2.jpg").exists(), what="the edited config's map")
        assert not (user.parent / "other").exists()
        (checkout / "config.yaml").rename(checkout / "config.yaml.bak")
        wait_for(lambda: "keeping the last good config" in daemon.log(), what="the missing file to be said")
        assert f"{checkout / 'config.yaml'}: cannot read the config" in daemon.log()
        write_by_rename(checkout / "frames" / "frame.jpg", jpeg_bytes(quadrant_frame(bright="bottom-left")))
        wait_for(lambda: "2 done" in depthwatch(checkout, "status").stdout, what="the next frame, on the same config")
        assert not (checkout / "tmp").exists() and "watching /" not in daemon.log().split("keeping the last good config")[1]
    finally:
        assert daemon.stop() == 0
        daemon.close()


def test_two_daemons_on_the_same_config_are_warned_about(tmp_path, tiny_model):
    config = tmp_path / "depthwatch.yaml"
    config.write_text(f"model:\n  path: {tiny_model}\n  profile: midas-v21-small\n", encoding="utf-8")
    # Different watch folders on the command line: on the same folder the second would
    # not start at all (one daemon per watch folder, see test_hardening).
    first = HandStarted(tmp_path, "-c", str(config), "--watch", "first")
    second = None
    try:
        first.wait_ready()
        (tmp_path / "second").mkdir()
        second = HandStarted(tmp_path / "second", "-c", str(config), "--watch", "frames")
        second.wait_ready()
        assert f"another depthwatch (pid {first.proc.pid}) is running with this config" in second.log()
    finally:
        for daemon in (first, second):
            if daemon is not None:
                daemon.stop()
                daemon.close()


def test_status_lists_the_running_daemons_first_and_each_stopped_one_in_a_line(tmp_path):
    """Every daemon that ever ran leaves its file in the state folder, so `status` does not print each in
    full, newest first, each "0 queued, 0 in progress when it stopped (the next start maps them)". The
    running one comes first, in full; a stopped one is one line, saying what it left only when it left
    something."""
    from depthwatch.daemon.status import Status, write_status

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    folder = tmp_path / "state" / "depthwatch" / "daemons"
    folder.mkdir(parents=True)
    live = Status(pid=os.getpid(), state="running", config="/shots/live.yaml", queue_depth=0)
    write_status(folder / "live.json", live)
    os.utime(folder / "live.json", (1, 1))  # the oldest file: it still comes first
    write_status(folder / "clean.json", Status(pid=int(gone.stdout), state="stopped", config="/shots/clean.yaml"))
    write_status(folder / "left.json", Status(pid=int(gone.stdout), state="stopped", config="/shots/left.yaml",
                                              queue_depth=2, in_progress=1))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}

    done = subprocess.run([sys.executable, "-m", "depthwatch", "status"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)

    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip().split("\n\n")
    assert len(blocks) == 2, done.stdout
    full = rows(blocks[0])
    assert full["depthwatch"].startswith(f"running, pid {os.getpid()}, since ") and full["config"] == "/shots/live.yaml"
    assert full["frames"].endswith("; 0 queued, 0 in progress"), full["frames"]
    lines = blocks[1].splitlines()
    assert len(lines) == 2, done.stdout
    for line, name in zip(sorted(lines, key=lambda line: "left" in line), ("clean", "left")):
        assert re.fullmatch(rf"depthwatch:  not running \(stopped at \S+; pid {gone.stdout.strip()} started \S+\); "
                            rf"config /shots/{name}\.yaml; (3 frame\(s\) left for the next start; )?"
                            rf"status file {re.escape(str(folder / name))}\.json", line), line
    assert "left for the next start" in next(line for line in lines if "left.yaml" in line)
    assert "left for the next start" not in next(line for line in lines if "clean.yaml" in line)
    assert "when it stopped" not in done.stdout

    clean = depthwatch(tmp_path, "status", "--status", str(folder / "clean.json"))  # one in full, on asking
    assert rows(clean.stdout)["frames"].endswith("0 depth maps skipped"), clean.stdout
