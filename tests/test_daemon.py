"""The real `depthwatch run` process: drop frames, read depth maps, signal it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch.frames.frameline import STAGES, parse_frame_line

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")


def bright_quadrant(depth: np.ndarray) -> str:
    """Which quadrant of a depth map is white (near) — identifies the frame it came from."""
    h, w = depth.shape[0] // 2, depth.shape[1] // 2
    means = {
        "top-left": depth[:h, :w].mean(),
        "top-right": depth[:h, w:].mean(),
        "bottom-left": depth[h:, :w].mean(),
        "bottom-right": depth[h:, w:].mean(),
    }
    return max(means, key=means.get)


def read_depth(path: Path) -> np.ndarray | None:
    data = path.read_bytes()
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None or not data.endswith(b"\xff\xd9"):
        return None
    return image


@pytest.fixture
def daemon(tmp_path, tiny_model):
    processes: list[DaemonProcess] = []

    def start(observer: str = "native", **sections) -> DaemonProcess:
        sections.setdefault("watch", {})["observer"] = observer
        d = DaemonProcess(tmp_path / f"d{len(processes)}", tiny_model, **sections).start()
        processes.append(d)
        return d

    yield start
    for d in processes:
        d.close()


@pytest.mark.parametrize("observer", ["native", "polling"])
def test_frame_dropped_by_rename_gives_exactly_one_depth_map(daemon, observer):
    d = daemon(observer)
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(320, 180, "bottom-right")))
    depth = wait_for(lambda: (d.watch / "depth.jpg").exists() and read_depth(d.watch / "depth.jpg"), what="depth.jpg")
    assert depth.shape == (180, 320)
    assert bright_quadrant(depth) == "bottom-right"
    wait_for(lambda: d.counts().get("done") == 1, what="the status file to count the frame")
    assert d.stop() == 0
    assert len(d.frame_lines()) == 1, d.log()
    assert d.counts()["failed"] == 0
    # The stages the log line names, one per module a frame goes through, in the status file too.
    line = parse_frame_line(d.frame_lines()[0])
    assert line is not None and line["size"] == (320, 180) and set(STAGES) <= set(line), d.frame_lines()
    assert list(d.counts()["last_stage_ms"]) == list(STAGES)


@pytest.mark.parametrize("observer", ["native", "polling"])
def test_slow_in_place_write_gives_one_map_of_the_full_frame(daemon, observer):
    d = daemon(observer)
    # Top half bright: a map made from a truncated file would lack the bottom rows or be gray there.
    frame = np.full((240, 320, 3), 20, np.uint8)
    frame[:120] = 235
    data = jpeg_bytes(frame)
    with open(d.watch / "frame.jpg", "wb") as f:
        for start in range(0, len(data), 700):
            f.write(data[start : start + 700])
            f.flush()
            time.sleep(0.03)  # slower than the settle time between chunks
    depth = wait_for(lambda: (d.watch / "depth.jpg").exists() and read_depth(d.watch / "depth.jpg"), what="depth.jpg")
    assert depth.shape == (240, 320)
    assert depth[:110].mean() > 240 and depth[130:].mean() < 15
    wait_for(lambda: d.counts().get("done") == 1, what="the frame to be counted")
    assert d.stop() == 0
    assert len(d.frame_lines()) == 1, d.log()
    assert d.counts()["failed"] == 0


def test_rewriting_a_frame_a_hundred_times_never_shows_a_broken_map(daemon):
    d = daemon()
    frames = [jpeg_bytes(quadrant_frame(320, 180, QUADRANTS[i % 3])) for i in range(3)]
    final = jpeg_bytes(quadrant_frame(320, 180, "bottom-right"))
    stop_reading = threading.Event()
    reads, failures = [0], []

    def reader() -> None:
        depth_path = d.watch / "depth.jpg"
        while not stop_reading.is_set():
            if depth_path.exists():
                if read_depth(depth_path) is None:
                    failures.append(reads[0])
                reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(99):
            (d.watch / "frame.jpg").write_bytes(frames[i % 3])  # in place, as fast as possible
        (d.watch / "frame.jpg").write_bytes(final)
        wait_for(
            lambda: (d.watch / "depth.jpg").exists()
            and (m := read_depth(d.watch / "depth.jpg")) is not None
            and bright_quadrant(m) == "bottom-right"
            and d.status()["in_progress"] == 0
            and d.status()["queue_depth"] == 0,
            what="the final frame's depth map",
        )
        # The sentinel: a stop joins every thread, so no older map can land after it. The
        # reader keeps reading through it.
        assert d.stop() == 0
    finally:
        stop_reading.set()
        thread.join()
    assert failures == []
    assert reads[0] > 0
    assert bright_quadrant(read_depth(d.watch / "depth.jpg")) == "bottom-right"  # still the newest
    counts = d.counts()  # the status file's last word, written as it stopped
    assert counts["failed"] == 0, d.log()
    assert counts["done"] < 100  # latest wins: superseded versions were skipped
    assert len(d.frame_lines()) == counts["done"]  # every map written is one logged frame


def test_outputs_temp_files_and_sidecars_never_trigger_processing(daemon):
    d = daemon(watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg", "sidecar": True})
    write_by_rename(d.watch / "a.jpg", jpeg_bytes(quadrant_frame()))
    wait_for(lambda: (d.watch / "a_depth.jpg").exists() and (d.watch / "a_depth.jpg.json").exists(), what="a's map")
    # Decoys that match *.jpg: an output of another frame and a temp file.
    write_by_rename(d.watch / "other_depth.jpg", jpeg_bytes(quadrant_frame()))
    (d.watch / ".x_depth.jpg.0badc0de.dwtmp").write_bytes(jpeg_bytes(quadrant_frame()))
    # A sentinel after the decoys: once it is done, any decoy would have been too.
    write_by_rename(d.watch / "b.jpg", jpeg_bytes(quadrant_frame()))
    wait_for(lambda: (d.watch / "b_depth.jpg").exists(), what="the sentinel's map")
    wait_for(lambda: d.counts().get("done") == 2, what="two frames counted")
    assert d.stop() == 0
    names = sorted(p.name for p in d.watch.iterdir())
    assert names == [".x_depth.jpg.0badc0de.dwtmp", "a.jpg", "a_depth.jpg", "a_depth.jpg.json", "b.jpg",
                     "b_depth.jpg", "b_depth.jpg.json", "other_depth.jpg"]
    assert len(d.frame_lines()) == 2


def test_sigkill_in_a_burst_then_restart_loses_nothing(daemon):
    d = daemon(watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    count = 60
    for i in range(count):
        write_by_rename(d.watch / f"f{i:03d}.jpg", jpeg_bytes(quadrant_frame(640, 360, QUADRANTS[i % 4])))
    wait_for(lambda: d.counts().get("done", 0) >= 3, what="a few frames done")
    d.kill()
    # Whatever was written before the kill is whole.
    for out in d.watch.glob("*_depth.jpg"):
        assert read_depth(out) is not None, out
    d.start()
    wait_for(lambda: len(list(d.watch.glob("*_depth.jpg"))) == count, what="every frame's map after the restart")
    wait_for(lambda: d.status().get("queue_depth") == 0 and d.status().get("in_progress") == 0, what="idle")
    assert d.stop() == 0
    for i in range(count):
        depth = read_depth(d.watch / f"f{i:03d}_depth.jpg")
        assert depth is not None and bright_quadrant(depth) == QUADRANTS[i % 4]
    assert d.temp_files() == []


def test_sigterm_in_a_burst_exits_zero_with_nothing_left_behind(daemon):
    d = daemon(watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    for i in range(80):
        write_by_rename(d.watch / f"f{i:03d}.jpg", jpeg_bytes(quadrant_frame(640, 360)))
    wait_for(lambda: d.counts().get("done", 0) >= 2, what="the burst to be under way")
    started = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 15  # daemon.shutdown_timeout_s is 10
    assert d.temp_files() == []
    assert d.status()["state"] == "stopped"
    assert "threads still running" not in d.log()
    assert "stopped" in d.log().splitlines()[-1]
    for out in d.watch.glob("*_depth.jpg"):
        assert read_depth(out) is not None


def test_second_signal_cuts_the_stop_short_and_still_unwinds(tmp_path):
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.6, size=256)  # over half a second per frame
    d = DaemonProcess(tmp_path, model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"},
                      daemon={"shutdown_timeout_s": 19}, providers=["cpu"]).start()
    try:
        for i in range(8):
            write_by_rename(d.watch / f"f{i}.jpg", jpeg_bytes(quadrant_frame(64, 64)))
        wait_for(lambda: d.status().get("in_progress", 0) >= 2, what="frames in flight")
        d.send(signal.SIGTERM)
        wait_for(lambda: d.state() == "stopping", what="the graceful stop to begin")
        d.send(signal.SIGTERM)
        code = d.proc.wait(30)
    finally:
        d.close()
    assert code == 0
    log = d.log()
    # Cut short: the frames in flight were abandoned, not finished (at over half a
    # second each, the 19 s graceful stop would have finished them)...
    assert "frames still in flight after a second signal; stopping anyway" in log
    assert d.counts().get("done", 0) < 8
    # ...and still unwound: the status file says so and every thread was joined.
    assert d.status()["state"] == "stopped"
    assert "threads still running" not in log
    assert log.rstrip().endswith("stopped")


def test_a_thousand_frames_all_get_maps_and_the_counts_agree(daemon):
    d = daemon(watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    count = 1000
    small = [jpeg_bytes(quadrant_frame(48, 32, q)) for q in QUADRANTS]
    for i in range(count):
        write_by_rename(d.watch / f"f{i:04d}.jpg", small[i % 4])
    wait_for(lambda: d.counts().get("done") == count, timeout=240, what="a thousand frames")
    assert d.stop() == 0
    outputs = sorted(d.watch.glob("*_depth.jpg"))
    assert len(outputs) == count
    counts = d.counts()
    assert counts["failed"] == 0 and counts["superseded"] == 0
    assert d.status()["model_loads"] == 1
    assert len(d.frame_lines()) == count


def test_two_frames_that_would_share_one_map_are_both_refused(tmp_path, tiny_model):
    """`A.jpg` and `A.tif` under `{stem}_depth.png`: neither map would last, so neither is made.

    One line each, naming the other frame; a frame of its own (`B.jpg`) is mapped as ever.
    """
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg", "*.tif"]}, output={"template": "{stem}_depth.png"})
    for name in ("A.jpg", "A.tif", "B.jpg"):
        cv2.imwrite(str(d.watch / name), quadrant_frame())
    d.start()
    try:
        wait_for(lambda: d.counts().get("done") == 1 and d.counts().get("failed") == 2, what="B mapped, both A refused")
        log = d.log()
        assert "A.jpg: A.tif maps to A_depth.png too" in log and "A.tif: A.jpg maps to A_depth.png too" in log, log
        assert (d.watch / "B_depth.png").is_file() and not (d.watch / "A_depth.png").exists()
        assert d.stop() == 0
    finally:
        d.close()


def test_frames_waiting_at_start_are_processed(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    from depthwatch.frames import provenance

    for name in ("old", "new", "stale", "theirs"):
        (d.watch / f"{name}.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    (d.watch / "old_depth.jpg").write_bytes(b"already done")  # newer than its frame: left alone
    stale = d.watch / "stale_depth.jpg"  # a map of an earlier version of stale.jpg: made again
    stale.write_bytes(provenance.embed(jpeg_bytes(quadrant_frame(32, 32)), {"source": "stale.jpg", "size": 1, "mtime_ns": 0, "inode": 0}))
    theirs = d.watch / "theirs_depth.jpg"  # older than its frame, but not a map depthwatch made: never replaced
    theirs.write_bytes(b"older than its frame")
    for old in (stale, theirs):
        os.utime(old, (time.time() - 3600, time.time() - 3600))
    d.start()
    try:
        wait_for(lambda: d.counts().get("done") == 2 and d.counts().get("failed") == 1, what="the two frames without a current map")
        assert (d.watch / "old_depth.jpg").read_bytes() == b"already done"
        assert read_depth(stale) is not None and read_depth(d.watch / "new_depth.jpg") is not None
        assert theirs.read_bytes() == b"older than its frame"
        assert "theirs_depth.jpg in " in d.counts()["last_error"] and "not a depth map depthwatch made" in d.counts()["last_error"]
    finally:
        assert d.stop() == 0


def test_no_config_reproduces_the_classic_setup(tmp_path, tiny_model):
    """`depthwatch run` with no config watches tmp/ for frame.jpg and writes tmp/depth.jpg."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "no-config"), "HOME": str(tmp_path)}
    env.pop("DEPTHWATCH_CONFIG", None)
    log = open(tmp_path / "log.txt", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "depthwatch", "run", "--model", str(tiny_model), "--profile", "midas-v21-small",
         "--status", "status.json"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: (tmp_path / "tmp").is_dir() and "ready" in (tmp_path / "log.txt").read_text(), what="ready")
        write_by_rename(tmp_path / "tmp" / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (tmp_path / "tmp" / "depth.jpg").exists(), what="tmp/depth.jpg")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_a_burst_larger_than_the_queue_is_picked_up_by_a_rescan(daemon):
    """The queue holds 16 jobs; the other frames are found again once it has room."""
    d = daemon(watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"}, daemon={"queue_size": 16})
    count = 300
    data = jpeg_bytes(quadrant_frame(48, 32))
    for i in range(count):
        write_by_rename(d.watch / f"f{i:03d}.jpg", data)
    wait_for(lambda: len(list(d.watch.glob("*_depth.jpg"))) == count, timeout=180, what="every frame's map")
    wait_for(lambda: d.status().get("queue_depth") == 0 and d.status().get("in_progress") == 0, what="idle")
    assert d.stop() == 0
    assert "queue full (16 frames); the frames beyond it will be picked up by a rescan" in d.log()
    assert d.counts()["done"] == count and d.counts()["failed"] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_the_daemons_threads_carry_their_names_in_the_operating_system(tmp_path, tiny_model):
    """`top -H` and the benchmarks' CPU split by thread see dw-inference, dw-worker_N, ...; the engine's pool too."""
    d = DaemonProcess(tmp_path, tiny_model, providers=["cpu"], model_options={"intra_op_threads": 2})
    d.start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="one map")
        tasks = Path(f"/proc/{d.child.pid}/task")
        names = [(t / "comm").read_text().strip() for t in tasks.iterdir() if (t / "comm").exists()]
        assert {"dw-inference", "dw-worker_0", "dw-settle", "dw-scan", "dw-clip"} <= set(names), names
        # onnxruntime's second operator thread was made by the inference thread, and took its name.
        assert names.count("dw-inference") >= 2, names
        roles = d.child.thread_cpu_seconds()
        assert {"dw-inference", "dw-worker", "python"} <= set(roles), roles  # worker_N counted as one role
    finally:
        assert d.stop() == 0
