"""A hostile folder, a racing file system and a killed process, against the real daemon and `once`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch import processes
from depthwatch.daemon.locks import EX_TEMPFAIL
from depthwatch.frames import provenance

SPARSE_SIZE = 2 * 2**30  # 2 GiB, almost none of it on disk


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


def sparse_file(path: Path, size: int = SPARSE_SIZE) -> None:
    """A huge file that takes no room, ending in a JPEG end marker."""
    with open(path, "wb") as f:
        f.truncate(size - 2)
        f.seek(size - 2)
        f.write(b"\xff\xd9")


def idle(d: DaemonProcess) -> bool:
    status = d.status()
    return status.get("queue_depth") == 0 and status.get("in_progress") == 0


def run_once(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )


# -- reading what sits in a frame's place, writing where the folder really is -------------------


def test_queued_frames_swapped_for_a_fifo_a_device_or_a_sparse_file_and_the_output_folder_for_a_link(tmp_path):
    """Frames found complete and queued are replaced before a worker reads them.

    The daemon must neither block (FIFO), read without end (/dev/zero), read a
    2 GiB sparse file, nor write a map into a folder the output folder was
    swapped for; and SIGTERM still ends it.
    """
    from onnx_models import slow_model

    # The first blocker's run is the margin: the three frames must be seen queued and swapped before it
    # ends (the status file's lag, the settle, the swaps: under a second here). Three seconds a frame,
    # more on a loaded machine, as the steps before the swap are slower too.
    model = slow_model(tmp_path / "slow.onnx", seconds=3.0, size=256)
    outside = tmp_path / "outside"
    outside.mkdir()
    d = DaemonProcess(
        tmp_path, model,
        watch={"patterns": ["*.jpg"], "follow_symlinks": True},  # links allowed: only the read's own checks guard
        output={"template": "maps/{stem}_depth.jpg"},
        daemon={"workers": 1, "max_file_mb": 64, "shutdown_timeout_s": 5},
        providers=["cpu"],  # that slow on onnxruntime's CPU provider (auto may pick OpenVINO, faster)
    ).start()
    maps = d.watch / "maps"
    maps.mkdir()
    frame = jpeg_bytes(quadrant_frame(64, 64))
    try:
        for i in range(3):  # workers + 2 frames in flight: the rest wait in the queue
            write_by_rename(d.watch / f"blocker{i}.jpg", frame)
        wait_for(lambda: d.status().get("in_progress") == 3, what="three frames in flight")
        for name in ("fifo", "zero", "sparse"):
            write_by_rename(d.watch / f"{name}.jpg", frame)
        wait_for(lambda: d.status().get("queue_depth") == 3, what="three frames queued")
        # Swapped while they wait (each by rename, as a careful attacker would).
        os.mkfifo(d.watch / ".fifo")
        os.replace(d.watch / ".fifo", d.watch / "fifo.jpg")
        os.symlink("/dev/zero", d.watch / ".zero")
        os.replace(d.watch / ".zero", d.watch / "zero.jpg")
        sparse_file(d.watch / ".sparse")
        os.replace(d.watch / ".sparse", d.watch / "sparse.jpg")
        maps.rename(tmp_path / "maps.real")
        os.symlink(outside, maps)

        def reported(reason: str) -> bool:
            return any(reason in line for line in error_lines(d))

        wait_for(lambda: reported("fifo.jpg: is a FIFO (named pipe), not an image file"), what="the FIFO refused")
        wait_for(lambda: reported("zero.jpg: is a character device, not an image file"), what="/dev/zero refused")
        wait_for(lambda: reported("sparse.jpg: is 2048 MB, over the limit of 64 MB"), what="the sparse file refused")
        wait_for(lambda: reported("now leads outside the configured folders"), what="a map refused at write time")
        wait_for(lambda: idle(d), what="the daemon idle")
        assert list(outside.iterdir()) == []
        assert d.stop(timeout=60) == 0  # no worker stuck in open() or read()
    finally:
        d.close()
    assert "threads still running" not in d.log()
    assert list(outside.iterdir()) == []


def test_once_refuses_a_fifo_a_device_a_sparse_file_and_its_own_input(tmp_path, tiny_model):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"daemon": {"max_file_mb": 64}}))
    frame = tmp_path / "a.jpg"
    frame.write_bytes(jpeg_bytes(quadrant_frame()))
    os.mkfifo(tmp_path / "fifo.jpg")
    os.symlink("/dev/urandom", tmp_path / "random.jpg")
    sparse_file(tmp_path / "sparse.jpg")
    base = ["--model", str(tiny_model), "--profile", "midas-v21-small", "-c", str(tmp_path / "config.yaml")]
    cases = [
        ("fifo.jpg", "is a FIFO (named pipe), not an image file"),
        ("random.jpg", "is a character device, not an image file"),
        ("sparse.jpg", "is 2048 MB, over the limit of 64 MB"),
    ]
    for name, reason in cases:
        done = run_once(name, *base, cwd=tmp_path)
        assert done.returncode == 1, (name, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.startswith("depthwatch: ")]
        assert len(lines) == 1 and f"{name}: {reason}" in lines[0], done.stderr
    original = frame.read_bytes()
    done = run_once("a.jpg", "-o", "a.jpg", *base, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("a.jpg: its output would overwrite the frame itself; change output.template")
    cv2.imwrite(str(tmp_path / "a.png"), quadrant_frame())
    done = run_once("a.jpg", "a.png", "-o", "{stem}.jpg", *base, cwd=tmp_path)  # a.png's map would be a.jpg
    assert done.returncode == 1, done.stderr
    assert f"a.png: its output {tmp_path / 'a.jpg'} is an input frame; writing it would replace that frame" in done.stderr
    assert frame.read_bytes() == original
    assert not (tmp_path / "a_depth.jpg").exists()


# -- provenance: which frame a map shows, and never a map as a frame ---------------------------


def test_a_map_made_from_an_older_version_is_made_again_after_a_restart(tmp_path, tiny_model):
    """v1's map landed after v2 was written (a kill in between): newer by mtime, yet stale."""
    d = DaemonProcess(tmp_path, tiny_model).start()
    frame, depth = d.watch / "frame.jpg", d.watch / "depth.jpg"
    try:
        write_by_rename(frame, jpeg_bytes(quadrant_frame(160, 96, "top-left")))
        wait_for(lambda: d.counts().get("done") == 1, what="v1's map")
    finally:
        d.kill()
    v1_map = depth.read_bytes()
    record = provenance.read(depth)
    assert record is not None and record["source"] == "frame.jpg" and record["size"] == frame.stat().st_size
    write_by_rename(frame, jpeg_bytes(quadrant_frame(160, 96, "bottom-right")))
    older = depth.stat().st_mtime_ns - 5 * 10**9
    os.utime(frame, ns=(older, older))  # the map is newer than v2, as after the kill
    d.start()
    try:
        wait_for(lambda: depth.read_bytes() != v1_map, what="v2's map")
        made = provenance.read(depth)
        st = frame.stat()
        assert (made["size"], made["mtime_ns"], made["inode"]) == (st.st_size, st.st_mtime_ns, st.st_ino)
        assert made["model"] == tiny_model.name and made["normalise"] == "stable"  # the default
    finally:
        assert d.stop() == 0


def test_own_outputs_are_never_input_under_any_template_or_name(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    d.start()
    forged = "x\n2026-01-01 00:00:00 ERROR   forged.jpg: forged line"
    try:
        write_by_rename(d.watch / "a.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / f"{forged}.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 2, what="two maps")
        write_by_rename(d.watch / "marker.jpg", jpeg_bytes(quadrant_frame()))  # queued after any own output
        wait_for(lambda: d.counts().get("done") == 3 and idle(d), what="the marker's map")
    finally:
        assert d.stop() == 0
    names = sorted(p.name for p in d.watch.iterdir())
    assert names == sorted(["a.jpg", "a_depth.jpg", f"{forged}.jpg", f"{forged}_depth.jpg", "marker.jpg", "marker_depth.jpg"])
    log = d.log()
    assert not any(line.startswith("2026-01-01") for line in log.splitlines()), "a name forged a log line"
    assert "x\\n2026-01-01 00:00:00 ERROR   forged.jpg: forged line.jpg -> " in log
    # Yesterday's maps under a new template, at the next start: still not frames.
    config = yaml.safe_load(d.config_path.read_text())
    config["output"]["template"] = "{stem}_map.jpg"
    d.config_path.write_text(yaml.safe_dump(config))
    d.start()
    try:
        wait_for(lambda: d.counts().get("done") == 3 and idle(d), what="the three frames mapped under the new template")
    finally:
        assert d.stop() == 0
    assert not list(d.watch.glob("*_depth_map.jpg"))
    assert sorted(p.name for p in d.watch.glob("*_map.jpg")) == sorted(["a_map.jpg", f"{forged}_map.jpg", "marker_map.jpg"])


def test_once_run_twice_does_not_map_its_own_maps(tmp_path, tiny_model):
    shots = tmp_path / "shots"
    shots.mkdir()
    for name in ("one", "two"):
        (shots / f"{name}.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    for _ in range(2):
        done = run_once(str(shots), "-o", "{stem}_map.png", "--model", str(tiny_model), "--profile", "midas-v21-small", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in shots.iterdir()) == ["one.jpg", "one_map.png", "two.jpg", "two_map.png"]
    assert provenance.read(shots / "one_map.png")["source"] == "one.jpg"
    done = run_once(str(shots / "one_map.png"), "--model", str(tiny_model), "--profile", "midas-v21-small", cwd=tmp_path)
    assert done.returncode == 1
    assert "one_map.png: is a depth map depthwatch made from one.jpg; not taken as input" in done.stderr


# -- the watch, the config, the temporary files --------------------------------------------------


def test_the_watch_comes_back_after_the_folder_is_recreated_with_the_same_inode(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map")
        inode = d.watch.stat().st_ino
        for _ in range(500):  # the inode is free again once the kernel drops its inotify watch
            shutil.rmtree(d.watch)
            d.watch.mkdir()
            if d.watch.stat().st_ino == inode:
                break
            time.sleep(0.02)
        else:
            pytest.skip("this filesystem never hands out the same inode number again")
        wait_for(lambda: "was replaced; watching it again" in d.log(), what="the recreate noticed")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(160, 96, "bottom-right")))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="a map in the recreated folder")
    finally:
        assert d.stop() == 0


def test_a_reload_leaves_the_daemons_own_temporary_files_alone(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        def start_number(pid: int) -> int:  # as the kernel keeps it: clock ticks after boot
            return int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[19])

        ours = d.watch / f".depth.jpg.{d.proc.pid}t{start_number(d.proc.pid)}-0123abcd.dwtmp"  # a write in flight
        theirs = d.watch / f".depth.jpg.{dead.pid}-0123abcd.dwtmp"  # a killed process's leftover
        old = d.watch / ".depth.jpg.0123abcd.dwtmp"  # an older depthwatch's: no pid in the name
        # A run before, of the same pid (a container's pid 1 at every start): swept all the same.
        reused = d.watch / f".depth.jpg.{d.proc.pid}t{start_number(d.proc.pid) - 1}-0123abcd.dwtmp"
        # Another container's pid 1 sharing the volume (or another host's, over NFS): its pid cannot be
        # asked here, so its write in flight stays; untouched for hours, it was left behind.
        there = "000000" if processes.own_host() != "000000" else "111111"
        elsewhere = d.watch / f".depth.jpg.1t99h{there}-0123abcd.dwtmp"
        abandoned = d.watch / f".depth.jpg.1t98h{there}-4567abcd.dwtmp"
        for path in (ours, theirs, old, reused, elsewhere, abandoned):
            path.write_bytes(b"half a map")
        hours_ago = time.time() - 2 * processes.FOREIGN_IDLE_S
        os.utime(abandoned, (hours_ago, hours_ago))
        config = yaml.safe_load(d.config_path.read_text())
        config["watch"]["patterns"] = ["frame.jpg", "other.jpg"]  # a watch change: the watch restarts
        d.config_path.write_text(yaml.safe_dump(config))
        wait_for(lambda: d.status().get("config_loads") == 2, what="the reload")
        wait_for(lambda: not theirs.exists() and not old.exists() and not reused.exists(), what="the dead processes' leftovers swept")
        assert not abandoned.exists()
        assert ours.exists() and elsewhere.exists()
    finally:
        assert d.stop() == 0


def test_a_dead_daemons_pid_taken_by_another_program_is_not_taken_for_the_daemon(tmp_path, tiny_model):
    """After a crash or a reboot a pid is some other program's: `depthwatch status` must not say
    "running", nor a start warn of a second daemon. The status names its process's start as the
    kernel keeps it (no wall clock: a clock step must not make a live daemon dead)."""
    from depthwatch.processes import start_token

    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        shown = subprocess.run([sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and f"running, pid {d.proc.pid}" in shown.stdout, shown.stdout
        assert d.status()["process_start"] == start_token(d.proc.pid)
    finally:
        assert d.stop() == 0
    other = subprocess.Popen(["sleep", "60"])  # the program that has the pid now
    try:
        data = json.loads(d.status_path.read_text())
        data.update(pid=other.pid, state="running")  # the daemon died without a word; its pid handed on
        d.status_path.write_text(json.dumps(data))
        shown = subprocess.run([sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 3 and "not running" in shown.stdout, shown.stdout + shown.stderr
    finally:
        other.kill()
        other.wait()


def test_a_status_file_that_went_is_written_again_and_a_folder_that_went_is_said_once(tmp_path, tiny_model):
    """A tmp cleaner or a cleared state folder: an idle daemon's status file must not stay gone
    (`depthwatch status`: "not running" while it runs), nor a missing folder be warned at every write."""
    d = DaemonProcess(tmp_path, tiny_model, daemon={"status_file": str(tmp_path / "state" / "status.json")})
    (tmp_path / "state").mkdir()
    d.status_path = tmp_path / "state" / "status.json"
    d.start()
    try:
        d.status_path.unlink()  # idle: nothing changes that would rewrite it
        wait_for(lambda: d.status_path.exists(), what="the status file written again")
        shutil.rmtree(tmp_path / "state")
        for n, corner in enumerate(("top-right", "bottom-left", "bottom-right")):
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright=corner)))
            wait_for(lambda n=n: d.log().count("frame.jpg -> depth.jpg") == n + 1, what=f"frame {n} mapped")
        wait_for(lambda: "status file: " in d.log(), what="the status file's trouble said")
        time.sleep(0.5)  # a few main-loop writes more: none of them says it again
        assert d.log().count("status file: ") == 1, d.log()[-2000:]
        (tmp_path / "state").mkdir()
        wait_for(lambda: d.status_path.exists() and d.counts().get("done") == 3, what="the status back, counting all three")
        # Said just after the write it tells of: waited for, not read in the instant between.
        wait_for(lambda: f"status file {d.status_path} written again" in d.log(), what="the status file said written again")
    finally:
        assert d.stop() == 0


def test_a_config_symlink_relinked_is_reloaded(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model)
    first = tmp_path / "first.yaml"
    d.config_path.rename(first)
    d.config_path.symlink_to(first.name)
    d.start()
    try:
        config = yaml.safe_load(first.read_text())
        config["watch"]["patterns"] = ["shot.jpg"]
        second = tmp_path / "second.yaml"
        second.write_text(yaml.safe_dump(config))
        link = tmp_path / ".config.yaml.new"
        link.symlink_to(second.name)
        link.replace(d.config_path)  # ln -sfn, atomically
        wait_for(lambda: d.status().get("config_loads") == 2, what="the relinked config reloaded")
        write_by_rename(d.watch / "shot.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="a map under the new pattern")
    finally:
        assert d.stop() == 0
    assert f"reloading the config ({d.config_path.name} changed)" in d.log()


def test_files_moved_in_are_complete_at_once_whatever_their_format(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model,
        watch={"patterns": ["*.tif", "*.jpg"], "incomplete_timeout_s": 3600},
        output={"template": "{stem}_depth.png"},
    ).start()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        (elsewhere / "shot.tif").write_bytes(cv2.imencode(".tif", quadrant_frame())[1].tobytes())
        (elsewhere / "notes.jpg").write_bytes(b"not a frame at all\n")
        os.rename(elsewhere / "shot.tif", d.watch / "shot.tif")
        os.rename(elsewhere / "notes.jpg", d.watch / "notes.jpg")
        wait_for(lambda: (d.watch / "shot_depth.png").exists(), what="the TIFF's map long before the timeout")
        wait_for(lambda: any("notes.jpg: not a JPEG, PNG, TIFF, WebP, EXR or DPX image" in line for line in error_lines(d)),
                 what="the unknown file's error long before the timeout")
        assert d.counts().get("incomplete") == 0
    finally:
        assert d.stop() == 0


# -- one daemon per folder -----------------------------------------------------------------------


def test_a_second_daemon_on_the_same_folder_refuses_to_start(tmp_path, tiny_model):
    first = DaemonProcess(tmp_path / "first", tiny_model).start()
    try:
        second = DaemonProcess(tmp_path / "second", tiny_model, watch={"folders": [str(first.watch)]})
        second.start(wait=False)
        try:
            assert second.proc.wait(60) == EX_TEMPFAIL
        finally:
            second.close()
        last = second.log().strip().splitlines()[-1]
        assert last == (
            f"depthwatch: another depthwatch (pid {first.proc.pid}) is already watching {first.watch}; "
            "stop it first, or watch another folder"
        )
    finally:
        first.kill()  # a crash: the kernel drops the lock, nothing stale is left
    third = DaemonProcess(tmp_path / "third", tiny_model, watch={"folders": [str(first.watch)]}).start()
    try:
        write_by_rename(first.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: third.counts().get("done") == 1, what="the third daemon at work")
    finally:
        assert third.stop() == 0


def test_a_reload_onto_a_folder_another_daemon_holds_keeps_the_old_folders(tmp_path, tiny_model):
    first = DaemonProcess(tmp_path / "first", tiny_model).start()
    second = DaemonProcess(tmp_path / "second", tiny_model).start()
    try:
        config = yaml.safe_load(second.config_path.read_text())
        config["watch"]["folders"] = [str(first.watch)]
        second.config_path.write_text(yaml.safe_dump(config))
        wait_for(lambda: second.status().get("config_loads") == 2, what="the reload")
        assert f"another depthwatch (pid {first.proc.pid}) is already watching {first.watch}" in second.status()["config_error"]
        assert second.status()["watching"] == [str(second.watch)]
        write_by_rename(second.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: second.counts().get("done") == 1, what="the second daemon still at work on its own folder")
        write_by_rename(first.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: first.counts().get("done") == 1, what="the first daemon's map")
        assert second.counts().get("done") == 1
    finally:
        assert second.stop() == 0
        assert first.stop() == 0


# -- minor: what each odd file is called -----------------------------------------------------------


def test_odd_files_are_called_what_they_are(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.jpg", "*.tif"]}, output={"template": "{stem}_depth.png"}
    ).start()
    try:
        os.symlink("missing.jpg", d.watch / ".dangling")
        os.replace(d.watch / ".dangling", d.watch / "dangling.jpg")
        os.symlink("loop.jpg", d.watch / ".loop")
        os.replace(d.watch / ".loop", d.watch / "loop.jpg")
        float_tiff = cv2.imencode(".tif", np.random.default_rng(1).random((48, 64, 3)).astype(np.float32))[1].tobytes()
        write_by_rename(d.watch / "float.tif", float_tiff)
        wait_for(lambda: d.counts().get("failed") == 3, what="three odd files reported")
    finally:
        assert d.stop() == 0
    lines = "\n".join(error_lines(d))
    assert "dangling.jpg: a symlink to 'missing.jpg', which does not exist" in lines
    assert "loop.jpg: a symlink loop; not followed" in lines
    assert "float.tif: the TIFF holds floating-point samples, an unsupported sample type" in lines
    assert "symlink to outside the watch folder" not in lines
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    done = run_once("a.jpg", "--model", str(folder), cwd=tmp_path)
    assert done.returncode == 78
    assert f"model file {folder} is a folder, not a file" in done.stderr


def test_a_half_decoded_jpeg_is_reported_as_damaged_and_libjpeg_stays_out_of_the_log(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    frame, depth = d.watch / "frame.jpg", d.watch / "depth.jpg"
    good = jpeg_bytes(quadrant_frame(640, 480))
    try:
        write_by_rename(frame, good)
        wait_for(lambda: d.counts().get("done") == 1, what="the good map")
        good_map = depth.read_bytes()
        write_by_rename(frame, good[: len(good) // 2] + b"\xff\xd9")  # cut short, end marker appended
        wait_for(lambda: d.counts().get("failed") == 1, what="the damaged frame reported")
        assert depth.read_bytes() == good_map  # no map with a made-up half
        write_by_rename(frame, jpeg_bytes(quadrant_frame(640, 480, "bottom-right")))
        wait_for(lambda: d.counts().get("done") == 2, what="the next good map")
    finally:
        assert d.stop() == 0
    lines = error_lines(d)
    assert len(lines) == 1 and lines[0].endswith(
        "frame.jpg: the JPEG data is damaged (Corrupt JPEG data: premature end of data segment); the picture is incomplete"
    ), lines
    raw = [line for line in d.log().splitlines() if "Corrupt JPEG data" in line and line not in lines]
    assert raw == [], "libjpeg wrote into the log"


def test_a_unix_socket_in_place_of_a_frame_is_named(tmp_path, tiny_model):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.jpg"))
        done = run_once("s.jpg", "--model", str(tiny_model), "--profile", "midas-v21-small", cwd=tmp_path)
    finally:
        sock.close()
    assert done.returncode == 1
    assert "s.jpg: is a socket, not an image file; not read" in done.stderr



@pytest.mark.parametrize(
    ("ext", "image"),
    [
        (".jpg", quadrant_frame(64, 48)[:, :, 0]),
        (".png", (np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16)),
        (".tif", (np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16)),
        (".tif", quadrant_frame(64, 48)[:, :, 0]),
    ],
)
def test_the_provenance_record_rides_inside_each_format_without_changing_a_pixel(tmp_path, ext, image):
    encoded = cv2.imencode(ext, image)[1].tobytes()
    (tmp_path / "x").write_bytes(b"frame")
    st = (tmp_path / "x").stat()
    record = provenance.record_for("a\nb.jpg", st, model="m.onnx", normalise="frame", invert=False)
    assert provenance.read(encoded) is None
    made = provenance.embed(encoded, record)
    assert provenance.read(made) == record
    path = tmp_path / f"map{ext}"
    path.write_bytes(made)
    assert provenance.read(path) == record
    assert provenance.same_version(record, st)
    plain = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_UNCHANGED)
    marked = cv2.imdecode(np.frombuffer(made, np.uint8), cv2.IMREAD_UNCHANGED)
    assert marked.dtype == plain.dtype and np.array_equal(marked, plain)


def test_a_status_file_holding_a_json_array_is_replaced_with_one_line(tmp_path, tiny_model):
    """Whatever JSON sits at the status file's path, the start reads it as no status of a running daemon."""
    status = tmp_path / "daemon.status.json"
    # Written by the wrapper, after the harness removed the old status file and before the daemon starts.
    put_array = ("sh", "-c", 'printf "[1, 2]\\n" > "$0" && exec "$@"', str(status))
    d = DaemonProcess(tmp_path, tiny_model, wrapper=put_array)
    assert d.status_path == status

    def running() -> bool:
        assert d.proc.poll() is None, d.log()
        try:
            data = json.loads(status.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("state") == "running"

    try:
        d.start(wait=False)
        wait_for(running, what="the daemon running, its own status written")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="a frame mapped after the start")
    finally:
        assert d.stop() == 0
    lines = [line for line in d.log().splitlines() if "is not one depthwatch wrote" in line]
    assert lines == [lines[0]] and f"status file {status} is not one depthwatch wrote (it holds a JSON list" in lines[0], d.log()
    assert "Traceback" not in d.log()
    status.write_text("[1, 2]\n")
    shown = subprocess.run(
        [sys.executable, "-m", "depthwatch", "status", "--status", str(status)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in shown.stderr, shown.stderr
    assert f"cannot read the status file {status}: it holds a JSON list, not a status" in shown.stdout, shown.stdout


# -- internal errors: their traceback at error level, and the thread goes on ------------------------


def test_an_internal_error_on_a_frame_is_logged_with_its_traceback(tmp_path, caplog):
    """A bug (here: settings without render options) fails its frame with one line and the traceback."""
    import dataclasses
    import logging

    from onnx_models import brightness_model

    from depthwatch.config import Config
    from depthwatch.frames.job import Job
    from depthwatch.frames.pipeline import Pipeline
    from depthwatch.frames.settings import Settings
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    model = brightness_model(tmp_path / "m.onnx")
    broken = dataclasses.replace(Settings.from_config(Config()), render=None)
    with Engine(ModelSpec(model, PROFILES["midas-v21-small"], providers=("cpu",))) as engine:
        engine.wait_ready()
        pipeline = Pipeline(engine, workers=1)
        try:
            with caplog.at_level(logging.INFO, logger="depthwatch"):
                result = pipeline.submit(Job.held(jpeg_bytes(quadrant_frame()), ".jpg"), broken).result(60)
                good = pipeline.submit(Job.held(jpeg_bytes(quadrant_frame()), ".jpg"), Settings()).result(60)
        finally:
            pipeline.close(5)
    assert result.error.startswith("internal error: AttributeError:"), result.error
    assert good.ok, good.error  # the worker went on
    [record] = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.getMessage() == "internal error on image body (a bug; please report it with this traceback)"
    assert "AttributeError" in caplog.text and "Traceback (most recent call last)" in caplog.text


def test_a_clip_result_handler_that_raises_does_not_end_the_clip_thread(tmp_path, caplog):
    import logging

    from onnx_models import brightness_model

    from depthwatch.daemon.clipthread import ClipRunner
    from depthwatch.clips.job import ClipJob
    from depthwatch.frames.settings import Settings
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    calls: list[int] = []
    results: list = []

    def settings() -> Settings:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the settings")  # an internal error of the first clip job
        return Settings()

    def on_result(job, result) -> None:
        results.append((job.source.name, result.error))
        if len(results) == 1:
            raise KeyError("a bug in the handler")

    model = brightness_model(tmp_path / "m.onnx")
    with Engine(ModelSpec(model, PROFILES["midas-v21-small"], providers=("cpu",))) as engine:
        engine.wait_ready()
        runner = ClipRunner(engine, settings, lambda: None, on_result).start()
        try:
            with caplog.at_level(logging.INFO, logger="depthwatch"):
                runner.submit(ClipJob(tmp_path / "a.mov", tmp_path / "a_depth.mov"))
                wait_for(lambda: len(results) == 1, what="the first clip's result")
                runner.submit(ClipJob(tmp_path / "b.mov", tmp_path / "b_depth.mov"))
                wait_for(lambda: len(results) == 2, what="the second clip's result: the thread lives on")
        finally:
            assert runner.stop(10)
    assert results[0] == ("a.mov", "internal error: RuntimeError: a bug in the settings")
    assert results[1][0] == "b.mov" and results[1][1]  # a clip that is not there: its own error
    errors = {r.getMessage(): r for r in caplog.records if r.levelno == logging.ERROR}
    for message in (
        f"internal error on clip {tmp_path / 'a.mov'} (a bug; please report it with this traceback)",
        f"internal error reporting clip {tmp_path / 'a.mov'} (a bug; please report it with this traceback)",
    ):
        assert message in errors and errors[message].exc_info is not None, list(errors)
