"""Live reload: edit config.yaml while the daemon runs (or send SIGHUP)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter

import cv2
import pytest
import yaml
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for
from onnx_models import brightness_model


def edit(d: DaemonProcess, change) -> None:
    """Change the config the way most editors save: a new file renamed over the old one."""
    config = yaml.safe_load(d.config_path.read_text())
    change(config)
    write_by_rename(d.config_path, yaml.safe_dump(config).encode())


def loads(d: DaemonProcess, n: int) -> None:
    wait_for(lambda: d.status().get("config_loads") == n, what=f"config load {n}")


def test_new_template_pattern_folder_and_model_take_effect(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        frame = jpeg_bytes(quadrant_frame())
        edit(d, lambda c: c["output"].update(template="depth2.jpg"))
        loads(d, 2)
        write_by_rename(d.watch / "frame.jpg", frame)
        wait_for(lambda: (d.watch / "depth2.jpg").exists(), what="the new template's output")

        edit(d, lambda c: (c["watch"].update(patterns=["*.png"]), c["output"].update(template="{stem}_depth.png")))
        loads(d, 3)
        (d.watch / ".shot.tmp").write_bytes(cv2.imencode(".png", quadrant_frame())[1].tobytes())
        (d.watch / ".shot.tmp").rename(d.watch / "shot.png")
        wait_for(lambda: (d.watch / "shot_depth.png").exists(), what="the new pattern's output")

        second = tmp_path / "watch2"
        second.mkdir()
        edit(d, lambda c: c["watch"].update(folders=[str(d.watch), str(second)]))
        loads(d, 4)
        (second / ".b.tmp").write_bytes(cv2.imencode(".png", quadrant_frame())[1].tobytes())
        (second / ".b.tmp").rename(second / "b.png")
        wait_for(lambda: (second / "b_depth.png").exists(), what="the new folder's output")

        other = brightness_model(tmp_path / "other.onnx", size=(48, 48))
        edit(d, lambda c: c["model"].update(path=str(other)))
        loads(d, 5)
        wait_for(lambda: d.status().get("model") == str(other), what="the new model in service")
        assert d.status()["model_loads"] == 2
        assert "48x48" in d.status()["contract"]
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0


def test_a_model_edit_undone_while_it_loads_leaves_the_model_in_service(tmp_path, tiny_model):
    """The config names a slow-loading model, then goes back while it loads: the load is withdrawn.

    Swapped in anyway, it would serve every frame from a model the config no longer names, with
    no error anywhere, until the next edit. Whichever way the timing falls (the edit
    back seen before the load ends, or after it), the model in service at the end is the one the
    config names, the status says so, and a frame's map is made by it.
    """
    from onnx_models import slow_model

    from depthwatch.frames import provenance

    slow = slow_model(tmp_path / "slow.onnx", seconds=1.5)  # a second and a half a frame; its warm-up (zeros) may be quicker
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        edit(d, lambda c: c["model"].update(path=str(slow)))
        loads(d, 2)
        edit(d, lambda c: c["model"].update(path=str(tiny_model)))
        loads(d, 3)
        # Withdrawn while it loaded (the usual case), or swapped in just before the edit was read and
        # then swapped out again: either way, the model the config names ends up in service.
        wait_for(lambda: "not using slow.onnx: the config no longer names it; keeping tiny.onnx" in d.log() or "now using model tiny.onnx" in d.log(),
                 what="the model the config names, in service")
        # The status file follows the log at the main loop's next write (a quarter of a second, more under load).
        wait_for(lambda: d.status().get("model") == str(tiny_model), what="the status naming the model in service")
        status = d.status()
        assert status["model"] == str(tiny_model) and status.get("model_error") is None and status.get("config_error") is None
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="the map")
        record = provenance.read(d.watch / "depth.jpg")
        assert record is not None and record["model"] == "tiny.onnx", record
        lines = [line for line in d.log().splitlines() if "now using" in line]
        assert not lines or "tiny.onnx" in lines[-1], lines
    finally:
        assert d.stop() == 0


def test_broken_edit_keeps_the_last_good_config_until_fixed(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        good = d.config_path.read_text()
        write_by_rename(d.config_path, good.replace("output:", "output:\n  templat: x.jpg").encode())
        wait_for(lambda: d.status().get("config_error"), what="the broken edit to be reported")
        error = d.status()["config_error"]
        assert error.startswith(f"{d.config_path}:") and "unknown setting output.templat (did you mean 'template'?)" in error
        assert f"{error}; keeping the last good config" in d.log()
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="a frame served on the old config")

        # A save cut short leaves NUL bytes: reported, not a reload's traceback that ends the daemon (exit 1).
        write_by_rename(d.config_path, good.encode() + b"\x00\x00\n")
        wait_for(lambda: "a control character (#x0000)" in (d.status().get("config_error") or ""), what="the NUL to be reported")
        assert d.proc.poll() is None
        # Emptied (a save cut short, a truncate): refused, not the built-in defaults, watching ./tmp.
        write_by_rename(d.config_path, b"# settings to come\n")
        wait_for(lambda: "is empty (or only comments)" in (d.status().get("config_error") or ""), what="the empty file to be reported")
        assert not (d.config_path.parent / "tmp").exists()

        write_by_rename(d.config_path, good.replace("depth.jpg", "fixed.jpg").encode())
        loads(d, 2)
        assert d.status()["config_error"] is None
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright="bottom-left")))
        wait_for(lambda: (d.watch / "fixed.jpg").exists(), what="the fixed config's output")
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


def test_sighup_reloads(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        d.send(signal.SIGHUP)
        loads(d, 2)
        assert "reloading the config (SIGHUP)" in d.log()
    finally:
        assert d.stop() == 0


def test_model_swap_under_a_stream_of_frames_loses_and_repeats_nothing(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"}).start()
    other = brightness_model(tmp_path / "other.onnx", size=(64, 48), scale=3.0)
    frames = [jpeg_bytes(quadrant_frame(320, 180, q)) for q in ("top-left", "bottom-right")]
    swapped = threading.Event()
    dropped = [0]

    def stream() -> None:
        """Frames keep coming from before the edit until well after the swap."""
        after = 0
        while after < 60 and dropped[0] < 5000:
            write_by_rename(d.watch / f"f{dropped[0]:04d}.jpg", frames[dropped[0] % 2])
            dropped[0] += 1
            after += swapped.is_set()
            time.sleep(0.003)

    feeder = threading.Thread(target=stream)
    feeder.start()
    try:
        wait_for(lambda: dropped[0] >= 40, what="the stream to start")
        edit(d, lambda c: c["model"].update(path=str(other)))
        wait_for(lambda: d.status().get("model") == str(other), what="the swap")
        swapped.set()
        feeder.join(120)
        wait_for(lambda: d.counts().get("done") == dropped[0], timeout=180, what="every frame's map")
    finally:
        swapped.set()
        feeder.join(120)
        code = d.stop()
    assert code == 0
    lines = d.log().splitlines()
    swap_line = next(i for i, line in enumerate(lines) if "now using model other.onnx" in line)
    frame_lines = [i for i, line in enumerate(lines) if " ms: " in line]
    assert frame_lines[0] < swap_line < frame_lines[-1]  # frames on both sides of the swap
    per_frame = Counter(line.split()[3] for line in d.frame_lines())
    assert len(per_frame) == dropped[0] and set(per_frame.values()) == {1}
    assert len(list(d.watch.glob("*_depth.jpg"))) == dropped[0]
    status = d.status()
    assert status["model_loads"] == 2  # up by exactly one
    assert status["counts"]["failed"] == 0


def test_png_bits_takes_effect_on_reload(tmp_path, tiny_model):
    """`Rules` checks a frame's map format against png_bits: the next frame gets the new value."""
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["shot*"]}, output={"template": "{stem}_depth.{ext}", "png_bits": 32}
    ).start()
    png = cv2.imencode(".png", quadrant_frame())[1].tobytes()
    try:
        write_by_rename(d.watch / "shot1.png", png)  # png_bits 32 cannot be a PNG map: refused
        wait_for(lambda: d.counts().get("failed") == 1, what="the 32-bit PNG map refused")
        assert "shot1.png: output.png_bits 32 (float) needs .tif or .exr maps" in d.log()
        edit(d, lambda c: c["output"].update(png_bits=16))
        d.send(signal.SIGHUP)  # the way a user may apply it; the edit alone reloads too
        wait_for(lambda: d.status().get("config_loads", 0) >= 2, what="the reload")
        write_by_rename(d.watch / "shot2.png", png)
        wait_for(lambda: (d.watch / "shot2_depth.png").exists(), what="the 16-bit PNG map")
        assert cv2.imread(str(d.watch / "shot2_depth.png"), cv2.IMREAD_UNCHANGED).dtype == "uint16"
        assert d.counts()["failed"] == 1
    finally:
        assert d.stop() == 0


def test_clip_template_takes_effect_on_reload(tmp_path, tiny_model):
    """A sequence folder's template changed to a file's: the next clip becomes that file."""
    pytest.importorskip("av", reason="clips need the video extra: pip install -e '.[video]'")
    from benchmarks.clips import pan_clip_frames, write_clip

    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["frame.jpg", "*.mov"]},
        output={"clip_template": "{stem}_depth/{frame:04d}.png"},
    ).start()
    clip = tmp_path / "A002.mov"
    write_clip(clip, pan_clip_frames((64, 48), 6, step=2), codec="prores")
    try:
        edit(d, lambda c: c["output"].update(clip_template="{stem}_depth.mkv"))
        d.send(signal.SIGHUP)
        wait_for(lambda: d.status().get("config_loads", 0) >= 2, what="the reload")
        clip.rename(d.watch / "A002.mov")
        wait_for(lambda: d.counts().get("clips") == 1 or d.counts().get("failed"), what="the clip job")
        assert (d.watch / "A002_depth.mkv").is_file(), d.log()[-2000:]
        assert not (d.watch / "A002_depth").exists()
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0


def test_queue_size_takes_effect_on_reload(tmp_path):
    """A smaller queue after a reload turns frames away (for the rescan) at the new bound."""
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.3, size=128)  # slow enough to keep three frames in flight
    d = DaemonProcess(
        tmp_path, model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"},
        daemon={"workers": 1, "queue_size": 1000, "shutdown_timeout_s": 2}, providers=["cpu"],
    ).start()
    frame = jpeg_bytes(quadrant_frame(64, 64))
    try:
        edit(d, lambda c: c["daemon"].update(queue_size=1))
        loads(d, 2)
        for i in range(8):  # one worker and two more in flight, one queued: the rest are turned away
            write_by_rename(d.watch / f"f{i}.jpg", frame)
        wait_for(lambda: "queue full (1 frames)" in d.log(), what="the new bound to turn frames away")
        assert "take effect at the next start" not in d.log()
    finally:
        assert d.stop() == 0


def test_settings_kept_for_the_next_start_are_said_once_and_the_status_stays_where_it_is(tmp_path, tiny_model):
    """daemon.workers changed and changed back says so once (not "take effect at the next start" for
    going back to the value running too); daemon.status_file moved live would leave the old file saying
    "running" with its counts frozen, and "gone without stopping cleanly" after a clean stop."""
    d = DaemonProcess(tmp_path, tiny_model).start()
    moved = tmp_path / "moved.json"
    try:
        edit(d, lambda c: c["daemon"].update(workers=3))
        loads(d, 2)
        edit(d, lambda c: c["daemon"].update(workers=2))
        loads(d, 3)
        assert d.log().count("daemon.workers and daemon.worker_niceness take effect at the next start") == 1
        edit(d, lambda c: c["daemon"].update(status_file=str(moved)))
        loads(d, 4)
        assert f"daemon.status_file takes effect at the next start; the status stays in {d.status_path}" in d.log()
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the status where it was to count the frame")
        assert not moved.exists()
    finally:
        assert d.stop() == 0
    assert d.state() == "stopped"


def test_a_config_replaced_by_a_fifo_is_refused_and_sigterm_still_stops_the_daemon(tmp_path, tiny_model):
    """A FIFO at the config's path, then SIGHUP: the read must not wait for a writer that never comes.

    The reload runs on the main loop, which also sees SIGTERM: a read blocked there would keep the daemon
    from stopping until it was killed. The FIFO is refused in one line, and SIGTERM stops the daemon
    cleanly, within its shutdown time (and some for a loaded machine).
    """
    shutdown_s = 5.0
    d = DaemonProcess(tmp_path, tiny_model, daemon={"shutdown_timeout_s": shutdown_s}).start()
    try:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        fifo.replace(d.config_path)
        d.send(signal.SIGHUP)
        refused = f"{d.config_path} is a FIFO (named pipe), not a config file; put the config file itself there"
        wait_for(lambda: d.status().get("config_error") == refused, what="the FIFO refused")
        assert f"{refused}; keeping the last good config" in d.log()
        assert d.proc.poll() is None
    finally:
        code = d.stop(timeout=shutdown_s + 30)
    assert code == 0, d.log()[-2000:]


def test_a_config_linked_to_a_device_or_grown_past_its_limit_is_refused_and_the_last_good_one_kept(tmp_path, tiny_model):
    """A config is read like a frame, bounded: a 2 MB file is refused before it is parsed, and a link to
    /dev/zero without a byte read (read, it would grow the daemon's memory until the process was killed)."""
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        good = d.config_path.read_text()
        write_by_rename(d.config_path, good.replace("depth.jpg", "big.jpg").encode() + b"#" * (2 << 20) + b"\n")
        too_big = f"{d.config_path} is 2 MB, over the 1 MB a config file may be; put the config file itself there (a few KB of settings)"
        wait_for(lambda: d.status().get("config_error") == too_big, what="the 2 MB file refused")

        link = tmp_path / "link"
        link.symlink_to("/dev/zero")
        link.replace(d.config_path)
        d.send(signal.SIGHUP)
        device = f"{d.config_path} is a character device, not a config file; put the config file itself there"
        wait_for(lambda: d.status().get("config_error") == device, what="the link to /dev/zero refused")
        assert d.status()["config_loads"] == 1

        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="a frame served on the last good config")
        assert not (d.watch / "big.jpg").exists()
        write_by_rename(d.config_path, good.replace("depth.jpg", "fixed.jpg").encode())
        loads(d, 2)
        assert d.status()["config_error"] is None
    finally:
        assert d.stop() == 0


def test_maps_of_earlier_templates_are_said_in_one_line_per_edit(tmp_path, tiny_model):
    """Each template edit scans the watch folder again, and meets every map an earlier template made
    (they match the patterns, and carry depthwatch's record): one line says how many, not one each
    (50, then 100, then 150 warnings for 50 frames)."""
    frames = 6
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_a.jpg"}).start()
    try:
        for i in range(frames):
            write_by_rename(d.watch / f"f{i}.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == frames, what="the first template's maps")
        edit(d, lambda c: c["output"].update(template="{stem}_b.jpg"))
        loads(d, 2)
        wait_for(lambda: d.counts().get("done") == 2 * frames, what="the second template's maps")
        edit(d, lambda c: c["output"].update(template="{stem}_c.jpg"))
        loads(d, 3)
        wait_for(lambda: d.counts().get("done") == 3 * frames, what="the third template's maps")
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0
    lines = [line for line in d.log().splitlines() if "depthwatch's record" in line]
    said = r"(\d+) files carry depthwatch's record \(depth maps, or images saved from them\), \S*/f\d_[ab]\.jpg among them; not taken as frames$"
    counts = [int(m.group(1)) for m in (re.search(said, line) for line in lines) if m]
    assert counts == [frames, 2 * frames], "\n".join(lines)
