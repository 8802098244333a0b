"""The daemon's process against a hostile machine: signal floods, idle sockets, unwritable
folders, a second daemon from another environment, a full disk. Real process, real sockets."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import fill_disk, jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch.daemon.locks import EX_TEMPFAIL
from depthwatch.errors import EX_CONFIG
from depthwatch.frames import provenance


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


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
        kept = ("keeping the watch section and output.template, output.clip_template, output.png_bits, "
                "output.error_sidecar of the last good config (the rest of the edit applies)")
        assert sum(kept in line for line in good.log().splitlines()) == 1
    finally:
        locked.chmod(0o755)


# -- the HTTP API against idle connections ---------------------------------------------------------------

requests = pytest.importorskip("requests")


def _raise_fd_limit(wanted: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def test_a_plugin_gets_through_while_another_program_holds_two_hundred_idle_connections(api_daemon):
    pytest.importorskip("waitress")
    _raise_fd_limit(4096)
    d = api_daemon()
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        """One byte on each connection every second: never idle long enough for an idle timeout."""
        while not stop.wait(1.0):
            for s in list(held):
                try:
                    s.send(b"x")
                except OSError:
                    pass  # closed by the daemon: what it should do

    for _ in range(200):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, int(port)))  # completes in the listen backlog even while not accepted
        held.append(s)
    for s in held:
        try:
            socket.socket.setblocking(s, True)
            s.settimeout(5)
            s.send(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n\xff\xd8")
        except OSError:
            pass
    trickler = threading.Thread(target=trickle, name="trickler")
    trickler.start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        answer = requests.post(f"{d.url}/predict", timeout=60)
        assert (answer.status_code, answer.text) == (200, "DONE")
        assert requests.get(f"{d.url}/health", timeout=60).status_code == 200
    finally:
        stop.set()
        trickler.join()
        for s in held:
            s.close()
    assert d.stop() == 0
    assert "Traceback" not in d.log()


def test_requests_during_a_graceful_stop_get_503_not_a_dropped_connection(tmp_path):
    pytest.importorskip("waitress")
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.6, size=256)  # over half a second per frame
    d = DaemonProcess(
        tmp_path / "d", model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"},
        api={"enabled": True, "port": 0}, daemon={"shutdown_timeout_s": 19},
    ).start()
    url = wait_for(lambda: d.status().get("api"), what="the API address")
    image = jpeg_bytes(quadrant_frame(64, 64))
    answers: list[object] = []

    def post_image() -> None:
        try:
            answers.append(requests.post(f"{url}/predict", data=image, headers={"Content-Type": "image/jpeg"}, timeout=60))
        except requests.RequestException as exc:
            answers.append(exc)

    try:
        for i in range(4):
            write_by_rename(d.watch / f"f{i}.jpg", image)
        wait_for(lambda: d.status().get("in_progress", 0) >= 2, what="frames in flight")
        early = [threading.Thread(target=post_image) for _ in range(3)]
        for t in early:
            t.start()
        d.send(signal.SIGTERM)
        wait_for(lambda: d.state() == "stopping", what="the graceful stop to begin")
        late = [threading.Thread(target=post_image) for _ in range(3)]
        for t in late:
            t.start()
        for t in early + late:
            t.join(120)
        assert d.proc.wait(120) == 0
    finally:
        d.close()
    dropped = [a for a in answers if not isinstance(a, requests.Response)]
    assert dropped == [], dropped
    codes = sorted(a.status_code for a in answers)
    assert set(codes) <= {200, 503} and codes.count(503) >= 3, codes
    for a in answers:
        if a.status_code == 503:
            assert a.text == "the daemon is stopping; try again once it is back\n", a.text
    log = d.log()
    assert "Traceback" not in log and "internal error" not in log and "CancelledError" not in log, log[-3000:]


# -- one daemon per folder, whatever the environment --------------------------------------------------------


def _refused(d: DaemonProcess) -> str:
    d.start(wait=False)
    try:
        assert d.proc.wait(60) == EX_TEMPFAIL, d.log()
    finally:
        d.close()
    return d.log().strip().splitlines()[-1]


def test_a_second_daemon_with_another_runtime_folder_is_refused(tmp_path, tiny_model):
    first = DaemonProcess(tmp_path / "first", tiny_model).start()
    try:
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        second = DaemonProcess(tmp_path / "second", tiny_model, watch={"folders": [str(first.watch)]})
        second.env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(runtime)}
        assert _refused(second) == (
            f"depthwatch: another depthwatch (pid {first.proc.pid}) is already watching {first.watch}; "
            "stop it first, or watch another folder"
        )
    finally:
        assert first.stop() == 0


def test_a_recursive_parent_and_a_daemon_on_its_child_are_refused_whichever_starts_first(tmp_path, tiny_model):
    shows = tmp_path / "shows"
    child = shows / "watch"
    parent = DaemonProcess(tmp_path / "parent", tiny_model, watch={"folders": [str(shows)], "recursive": True}).start()
    try:
        line = _refused(DaemonProcess(shows, tiny_model))
        assert line == (
            f"depthwatch: another depthwatch (pid {parent.proc.pid}) is watching {shows} with its subfolders, which holds {child}; "
            "stop it first, or list both folders in one daemon's watch.folders"
        ), line
    finally:
        assert parent.stop() == 0
    inner = DaemonProcess(shows, tiny_model).start()
    try:
        line = _refused(DaemonProcess(tmp_path / "parent", tiny_model, watch={"folders": [str(shows)], "recursive": True}))
        assert line.startswith(f"depthwatch: another depthwatch (pid {inner.proc.pid}) is watching a folder inside {shows};"), line
        sibling = DaemonProcess(tmp_path / "sibling", tiny_model).start()  # beside it, not inside: fine
        assert sibling.stop() == 0
    finally:
        assert inner.stop() == 0


def _flocks_given_up(trace: Path) -> list[str]:
    """The flock calls in an `strace -e trace=flock,close` trace that failed on a descriptor holding a lock.

    flock(2) changes a lock by letting go of it first: such a failure leaves the
    descriptor holding nothing, where another daemon can take the lock.
    """
    held: dict[str, str] = {}
    pending: dict[str, tuple[str, str]] = {}
    given_up = []
    for line in trace.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        rest = rest.lstrip()
        call = re.match(r"(flock|close)\((\d+)(?:, ([A-Z_|]+))?", rest)
        if call and "<unfinished" in rest:
            pending[pid] = (call.group(1), call.group(2))
            continue
        resumed = re.match(r"<\.\.\. (flock|close) resumed>", rest)
        if call:
            name, fd = call.group(1), call.group(2)
        elif resumed and pid in pending:
            name, fd = pending.pop(pid)
        else:
            continue
        result = rest.rsplit(" = ", 1)[-1]
        if name == "close":
            held.pop(fd, None)
        elif result.startswith("0"):
            held[fd] = rest
        elif fd in held:
            given_up.append(f"{held.pop(fd)}  then  {rest}")
    return given_up


def test_a_reload_refused_for_a_lock_upgrade_keeps_the_shared_lock_it_held(tmp_path, tiny_model):
    """A daemon on shows/a holds the shows tree shared, beside one on shows/b; reloaded to watch
    shows with its subfolders, it would need that lock exclusive. It is refused, and never lets go
    of the shared one (flock's upgrade that fails would have), so no third daemon can slip in."""
    from daemon_process import strace_works

    if (why := strace_works()) is not None:
        pytest.skip(why)
    shows = tmp_path / "shows"
    (shows / "a").mkdir(parents=True)
    (shows / "b").mkdir()
    trace = tmp_path / "a.trace"
    a = DaemonProcess(
        tmp_path / "A", tiny_model, watch={"folders": [str(shows / "a")]},
        wrapper=("strace", "-f", "--seccomp-bpf", "-e", "trace=flock,close", "-o", str(trace)),
    )
    b = DaemonProcess(tmp_path / "B", tiny_model, watch={"folders": [str(shows / "b")]}).start()
    try:
        a.start()
        config = yaml.safe_load(a.config_path.read_text())
        config["watch"].update(folders=[str(shows)], recursive=True)
        a.config_path.write_text(yaml.safe_dump(config))
        wait_for(lambda: a.status().get("config_loads") == 2, what="the reload")
        assert f"is watching a folder inside {shows}" in a.status()["config_error"], a.status()["config_error"]
        assert a.status()["watching"] == [str(shows / "a")]
        write_by_rename(shows / "a" / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: a.counts().get("done") == 1, what="the daemon at work on its old folder")
        line = _refused(DaemonProcess(tmp_path / "C", tiny_model, watch={"folders": [str(shows)], "recursive": True}))
        assert f"is watching a folder inside {shows}" in line, line
    finally:
        assert b.stop() == 0
        pid = a.status().get("pid")  # the daemon's, not strace's: strace would only detach on SIGTERM
        if pid:
            os.kill(pid, signal.SIGTERM)
        code = a.proc.wait(60) if pid else None
        a.close()
    assert code == 0
    assert _flocks_given_up(trace) == []
    assert re.search(r"flock\(\d+, LOCK_SH\|LOCK_NB\) += 0", trace.read_text())  # the trace does see the locks


def test_a_lock_that_cannot_be_taken_back_is_reported_and_forgotten_not_swallowed(tmp_path):
    """What is left when a change let go of a lock and another daemon took it meanwhile (a race the
    test cannot time, so set up as it ends): the rollback says so, naming the holder."""
    import fcntl

    from depthwatch.daemon import locks

    key = locks._key(locks.TREE, str(tmp_path))
    mine = os.open(locks.lock_path(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)  # its flock let go of
    theirs = locks._lock(key, fcntl.LOCK_EX)  # the other daemon's, recording its pid (ours, here)
    try:
        with pytest.raises(locks.LockLost) as lost:
            locks._restore(mine, key, fcntl.LOCK_SH)
    finally:
        os.close(mine)
        os.close(theirs)
    assert str(lost.value).startswith(
        f"lost the lock on {tmp_path} while changing it: another depthwatch (pid {os.getpid()}) took it meanwhile"
    ), lost.value
    assert lost.value.exit_code == EX_TEMPFAIL


def test_a_parent_watched_without_subfolders_and_a_daemon_on_its_child_both_run(tmp_path, tiny_model):
    """Without `recursive` the parent's daemon never sees the child's frames: nothing to refuse."""
    shows = tmp_path / "shows"
    parent = DaemonProcess(tmp_path / "parent", tiny_model, watch={"folders": [str(shows)]}).start()
    try:
        inner = DaemonProcess(shows, tiny_model).start()
        try:
            write_by_rename(inner.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
            wait_for(lambda: inner.counts().get("done") == 1, what="the child's map")
            assert parent.proc.poll() is None
        finally:
            assert inner.stop() == 0
    finally:
        assert parent.stop() == 0


# -- special files dropped under a frame pattern ----------------------------------------------------------------


def test_a_fifo_a_folder_and_a_socket_dropped_directly_get_one_line_and_one_record_each(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.png", "error_sidecar": True}).start()
    sock = socket.socket(socket.AF_UNIX)
    try:
        os.mkfifo(d.watch / "pipe.jpg")
        (d.watch / "folder.jpg").mkdir()
        sock.bind(str(d.watch / "sock.jpg"))
        wait_for(lambda: d.counts().get("failed") == 3, what="three special files reported")
        fd = os.open(d.watch / "pipe.jpg", os.O_RDWR | os.O_NONBLOCK)  # written to and closed: no second line
        os.write(fd, b"x")
        os.close(fd)
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="a good frame after them: nothing hung")
    finally:
        sock.close()
        assert d.stop() == 0
    lines = error_lines(d)
    assert len(lines) == 3, lines
    assert any(line.endswith("pipe.jpg: is a FIFO (named pipe), not an image file; not read") for line in lines), lines
    assert any(line.endswith("folder.jpg: is a folder, not an image file; not read") for line in lines), lines
    assert any(line.endswith("sock.jpg: is a socket, not an image file; not read") for line in lines), lines
    for name in ("pipe.jpg", "folder.jpg", "sock.jpg"):
        assert (d.watch / f"{name}.error.json").is_file(), name


# -- a big folder scanned --------------------------------------------------------------------------------------


def test_a_frame_elsewhere_is_mapped_while_a_big_folder_is_scanned_again(tmp_path, tiny_model):
    """A watch folder replaced by one holding thousands of frames (a volume remounted, a
    folder restored) is scanned on its own thread: the other folder's frames go on meanwhile."""
    shots, other = tmp_path / "shots", tmp_path / "other"
    other.mkdir()
    d = DaemonProcess(tmp_path, tiny_model, watch={"folders": [str(shots), str(other)], "patterns": ["*.jpg"]},
                      output={"template": "{stem}_depth.png"})
    restored = tmp_path / "restored"
    restored.mkdir()
    # Six thousand frames whose maps are already there (newer, so current): the scan must
    # look at each of them and finds nothing to do. That takes a while; a frame elsewhere must not wait for it.
    for i in range(6_000):
        (restored / f"f{i:05d}.jpg").write_bytes(b"x")
    for i in range(6_000):
        (restored / f"f{i:05d}_depth.png").write_bytes(b"")
    d.start()
    try:
        shots.rename(tmp_path / "gone")
        os.rename(restored, shots)
        wait_for(lambda: f"watch folder {shots} disappeared or was replaced" in d.log(), what="the swap to be noticed")
        write_by_rename(other / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: f"{shots} scanned again: 0 frame(s) to map" in d.log(), what="the big folder's scan")
        wait_for(lambda: d.counts().get("done") == 1, what="the other frame's map")
    finally:
        assert d.stop() == 0
    lines = d.log().splitlines()
    mapped = next(i for i, line in enumerate(lines) if "frame.jpg -> frame_depth.png" in line)
    scanned = next(i for i, line in enumerate(lines) if "scanned again:" in line)
    assert mapped < scanned, "the frame elsewhere waited for the scan:\n" + "\n".join(lines[-6:])


def test_a_folder_moved_into_a_recursive_watch_is_scanned_once_off_the_event_thread(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"], "recursive": True}, output={"template": "{stem}_depth.png"})
    deep = tmp_path / "take"
    (deep / "a" / "b" / "c").mkdir(parents=True)
    for folder in (deep, deep / "a", deep / "a" / "b", deep / "a" / "b" / "c"):
        write_by_rename(folder / "frame.jpg", jpeg_bytes(quadrant_frame()))
    d.start()
    try:
        os.rename(deep, d.watch / "take")
        wait_for(lambda: d.counts().get("done") == 4, what="the four moved-in frames")
        wait_for(lambda: "take moved in:" in d.log(), what="the scan's line")
    finally:
        assert d.stop() == 0
    assert sum("moved in:" in line for line in d.log().splitlines()) == 1  # its subfolders' events add no scans
    assert d.counts().get("done") == 4 and d.counts().get("failed", 0) == 0


# -- a full disk, then space again ------------------------------------------------------------------------------


def test_a_frame_whose_tries_ran_out_on_a_full_disk_is_made_once_space_is_back(tmp_path, tiny_model, small_disk):
    d = DaemonProcess(tmp_path, tiny_model, watch={"folders": [str(small_disk)]}, daemon={"retries": 1})
    d.watch = small_disk
    d.start()
    depth = small_disk / "depth.jpg"
    try:
        write_by_rename(small_disk / "frame.jpg", jpeg_bytes(quadrant_frame(320, 180)))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map")
        frame = jpeg_bytes(quadrant_frame(320, 180, "bottom-right"))
        write_by_rename(small_disk / "frame.jpg", frame)
        wait_for(lambda: d.counts().get("done") == 2, what="the second map")
        filler = fill_disk(small_disk)
        stale = depth.read_bytes()
        with open(small_disk / "frame.jpg", "r+b") as f:
            f.write(frame)  # rewritten in place: needs no new space, so it lands even now
        wait_for(lambda: d.counts().get("failed") == 1, what="the tries to run out")
        assert depth.read_bytes() == stale and d.temp_files() == []
        filler.unlink()
        wait_for(lambda: d.counts().get("done") == 3, what="the frame made again once space is back")
        assert depth.read_bytes() != stale and d.temp_files() == []
    finally:
        assert d.stop() == 0
    assert "made again once" in d.log()


# -- minor: what reaches the log --------------------------------------------------------------------------------


def _png_with_a_bad_text_chunk() -> bytes:
    """A PNG libpng decodes whole, after warning on stderr that a tEXt chunk fails its CRC."""
    import struct
    import zlib

    import cv2

    png = cv2.imencode(".png", quadrant_frame(64, 48))[1].tobytes()
    chunk = b"tEXt" + b"Comment\x00hello"
    bad = struct.pack(">I", len(chunk) - 4) + chunk + struct.pack(">I", (zlib.crc32(chunk) ^ 1) & 0xFFFFFFFF)
    return png[:33] + bad + png[33:]


def test_a_bidi_name_a_libpng_warning_and_a_photo_of_a_map_each_get_one_clean_line(tmp_path, tiny_model):
    from depthwatch.frames import provenance

    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg", "*.png"]}, output={"template": "maps/{stem}.png"}).start()
    try:
        write_by_rename(d.watch / "shot\u202egnp.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "crc.png", _png_with_a_bad_text_chunk())
        wait_for(lambda: d.counts().get("done") == 2, what="both maps")
        record = {"source": "elsewhere.jpg", "size": 1, "mtime_ns": 1, "ino": 1}
        write_by_rename(d.watch / "copied.jpg", provenance.embed(jpeg_bytes(quadrant_frame()), record))
        wait_for(lambda: d.counts().get("own_maps") == 1, what="the copied map counted")
    finally:
        assert d.stop() == 0
    log = d.log()
    assert "\u202e" not in log and "shot\\u202egnp.jpg" in log
    assert "libpng warning" not in log and "CRC error" not in log
    warnings = [line for line in log.splitlines() if " WARNING " in line and "copied.jpg" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "copied.jpg carries depthwatch's record (a depth map, or an image saved from one); not taken as a frame"
    ), warnings


def test_a_config_path_that_is_a_fifo_is_called_one(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "depthwatch", "run", "-c", str(fifo)], capture_output=True, text=True, timeout=60)
    assert done.returncode == EX_CONFIG
    assert done.stderr.strip().splitlines()[-1] == f"depthwatch: config file {fifo} is a FIFO (named pipe), not a file; check the -c path"


def test_temporary_files_that_cannot_be_removed_are_not_reported_as_removed(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, restricted=True)
    left = d.watch / ".depth.jpg.999999-0123abcd.dwtmp"
    left.write_bytes(b"half a map")
    d.watch.chmod(0o555)
    try:
        d.start()
        assert d.stop() == 0
    finally:
        d.watch.chmod(0o755)
    assert left.exists()
    assert "removed 1 temporary file(s)" not in d.log()
    assert f"cannot remove 1 temporary file(s) left in {d.watch} (is the folder writable?)" in d.log()


def test_file_events_the_kernel_dropped_are_made_up_by_a_rescan(tmp_path, tiny_model):
    """inotify's queue overflows while the daemon cannot read it (stopped here, busy in life):
    the events beyond it, the frame's among them, are lost; watchdog says so only in a log record."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        d.send(signal.SIGSTOP)
        try:
            for i in range(limit):  # each raises create and close-after-write, both asked for: twice the queue
                (d.watch / f"notes{i:05d}.txt").write_bytes(b"")
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))  # beyond the queue: lost
        finally:
            d.send(signal.SIGCONT)
        wait_for(lambda: d.counts().get("done") == 1, what="the frame whose event was lost")
    finally:
        assert d.stop() == 0
    lines = d.log().splitlines()
    assert any(line.endswith("file events were lost (the kernel's inotify queue overflowed); rescanning the watch folders") for line in lines)
    assert not any(line.startswith("Inotify queue overflowed") for line in lines), "watchdog's raw line reached the log"


def test_a_finished_shot_folder_moved_into_a_recursive_watch_is_not_mapped_again(tmp_path, tiny_model):
    """watchdog reports each file of a folder moved in as created; those whose maps are
    current (their record names this very version) need nothing."""
    first = DaemonProcess(tmp_path / "first", tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.png"}).start()
    try:
        for i in range(3):
            write_by_rename(first.watch / f"f{i}.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: first.counts().get("done") == 3, what="the shot's maps")
    finally:
        assert first.stop() == 0
    d = DaemonProcess(tmp_path / "second", tiny_model, watch={"patterns": ["*.jpg"], "recursive": True},
                      output={"template": "{stem}_depth.png"}).start()
    try:
        os.rename(first.watch, d.watch / "shot")
        wait_for(lambda: "shot moved in: 0 frame(s) to map" in d.log(), what="the moved-in folder's scan")
        write_by_rename(d.watch / "shot" / "new.jpg", jpeg_bytes(quadrant_frame()))  # after the others' events
        wait_for(lambda: (d.watch / "shot" / "new_depth.png").exists(), what="the new frame's map")
        wait_for(lambda: d.counts().get("done") == 1, what="the count")
    finally:
        assert d.stop() == 0
    mapped = [line for line in d.frame_lines()]
    assert len(mapped) == 1 and "new.jpg" in mapped[0], mapped


def test_a_frame_the_process_keeps_ending_on_is_named_then_set_aside_until_it_changes(tmp_path):
    """A frame that crashes the model's runtime natively ends the process with no line; without a note of
    it, every restart would meet it again and crash again, for good. Named at the next start and tried
    once more, it is set aside once it has ended the process twice, until it changes (a kill during its
    run stands in for the crash)."""
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.5)
    d = DaemonProcess(tmp_path, model, providers=["cpu"], output={"error_sidecar": True})
    note = tmp_path / "daemon.status.json.inference"
    frame = d.watch / "frame.jpg"
    write_by_rename(frame, jpeg_bytes(quadrant_frame()))

    def ended_in_its_run() -> None:
        d.start()
        wait_for(lambda: note.exists() and b"frame.jpg" in note.read_bytes(), what="the model to be running on the frame")
        d.kill()  # as a segfault inside the runtime ends it: no line, no status
        d.proc.wait(60)

    try:
        ended_in_its_run()
        ended_in_its_run()  # tried once more, and it ends the run again
        assert "frame.jpg: the model was running on it when the last run ended without stopping; it is tried once more" in d.log()
        d.start()
        wait_for(lambda: d.counts().get("failed") == 1, what="the frame set aside")
        assert "frame.jpg: the process ended 2 times while the model ran on this version of it" in d.log()
        assert not (d.watch / "depth.jpg").exists()
        assert "set aside" in (d.watch / "frame.jpg.error.json").read_text()
        assert d.stop() == 0 and not note.exists()  # a clean stop leaves no note
        d.start()  # set aside across starts, without a run of its own
        wait_for(lambda: d.counts().get("failed") == 1, what="the frame set aside again")
        write_by_rename(frame, jpeg_bytes(quadrant_frame(bright="bottom-right")))  # replaced: a frame like any other
        # Counted done once its map is written and its record removed (the map lands a moment before).
        wait_for(lambda: d.counts().get("done") == 1, timeout=120, what="the new version mapped")
        assert (d.watch / "depth.jpg").exists() and not (d.watch / "frame.jpg.error.json").exists()
    finally:
        d.close()


def test_a_frame_the_process_crashed_on_is_set_aside_at_the_next_start(tmp_path):
    """A native crash (SIGSEGV in a provider, here sent to the process while the model runs on the frame)
    is told apart from a kill: the crash file faulthandler wrote makes the next start set the frame aside
    at once, so the frame is met once, never in a loop; the crash, with every thread's stack, is kept."""
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.5)
    d = DaemonProcess(tmp_path, model, providers=["cpu"], output={"error_sidecar": True})
    note = tmp_path / "daemon.status.json.inference"
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
    try:
        d.start()
        wait_for(lambda: note.exists() and b"frame.jpg" in note.read_bytes(), what="the model to be running on the frame")
        d.send(signal.SIGSEGV)  # as a segfault inside the runtime: faulthandler writes it down, then the process dies
        assert d.proc.wait(60) == -signal.SIGSEGV
        d.close()  # the dead run's harness (its memory sampler) let go
        d.start()
        d.wait_for(lambda: d.counts().get("failed") == 1, what="the frame set aside")
        said = d.log()
        assert "frame.jpg: the process crashed (Segmentation fault) while the model ran on this version of it; it is set aside" in said, said
        assert "tried once more" not in said
        assert not (d.watch / "depth.jpg").exists()
        assert "set aside" in (d.watch / "frame.jpg.error.json").read_text()
        crash = (tmp_path / "daemon.status.json.crash.last").read_text()
        assert "Segmentation fault" in crash and "Thread 0x" in crash, crash  # every thread's stack
        assert d.stop() == 0
        assert not (tmp_path / "daemon.status.json.crash").exists()  # a clean stop leaves no crash file
    finally:
        d.close()


def test_an_output_folder_never_written_to_is_made_with_its_parents(tmp_path):
    """The drive check makes a new output folder whose parent is missing too (~/Depth/ProjectX/ with
    neither there yet), and makes it again once cleared: only a folder written on a mount that is gone waits."""
    from depthwatch.frames.writer import ensure_folder

    folder = tmp_path / "Depth" / "ProjectX"
    ensure_folder(folder, (folder,))
    assert folder.is_dir()
    shutil.rmtree(tmp_path / "Depth")  # an old output tree cleared: made again, on the same disk
    ensure_folder(folder, (folder,))
    assert folder.is_dir()


def test_a_parked_frame_deleted_while_its_disk_stays_full_is_no_longer_waiting(tmp_path, tiny_model, small_disk):
    """A frame parked for a full disk and then deleted (a render cleared to make room) stops waiting at once,
    while the disk is still full: it is neither counted as waiting for its folder nor kept in memory."""
    d = DaemonProcess(tmp_path, tiny_model, watch={"folders": [str(small_disk)], "patterns": ["*.jpg"]},
                      output={"template": "{stem}_depth.png"}, daemon={"retries": 1})
    d.watch = small_disk
    d.start()
    try:
        frame = small_disk / "render_0001.jpg"
        frame.write_bytes(jpeg_bytes(quadrant_frame(320, 180)))  # before the disk fills: the frame is there, its map is not
        fill_disk(small_disk)
        os.utime(frame)  # looked at again: its map cannot be written
        wait_for(lambda: d.status().get("parked") == 1, what="the frame parked")
        frame.unlink()
        wait_for(lambda: d.status().get("parked") == 0, what="the deleted frame no longer waiting")
        assert (small_disk / "filler").exists()  # the disk is still full
    finally:
        assert d.stop() == 0


def test_a_status_file_on_a_disk_that_was_full_catches_up_once_there_is_room(tmp_path, tiny_model, small_disk):
    """A failed write of the status is not taken as written: once space is back an idle daemon's status
    catches up (3 done with 3 maps on disk, not the 1 of before the disk filled) and says so."""
    status = small_disk / "status.json"
    d = DaemonProcess(tmp_path, tiny_model, daemon={"status_file": str(status)})
    d.status_path = status
    d.start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map counted")
        filler = fill_disk(small_disk)
        for n, corner in enumerate(("top-right", "bottom-left")):
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright=corner)))
            wait_for(lambda n=n: d.log().count("frame.jpg -> depth.jpg") == n + 2, what=f"map {n + 2}")
        wait_for(lambda: "status file: " in d.log(), what="the full disk said")
        assert d.counts()["done"] == 1  # what it last held
        filler.unlink()  # room again; no frame comes
        wait_for(lambda: d.counts().get("done") == 3, what="the status to catch up")
        wait_for(lambda: f"status file {status} written again" in d.log(), what="said written again")
    finally:
        assert d.stop() == 0


def test_maps_for_an_ejected_cache_drive_wait_for_it_and_never_land_on_the_system_disk(tmp_path, tiny_model):
    """An output template on a cache drive (/media/…/CACHE/Depth/{stem}.png): while the drive is ejected, its
    frames wait, said in a line each, and nothing is made on the system disk under the mount point (maps there
    would be said done while the drive keeps an older version's); once it is back, the current maps land on it."""
    drive = tmp_path / "CACHE"
    drive.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(drive)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": f"{drive}/Depth/{{stem}}.png"},
                      daemon={"retries": 1})
    try:
        d.start()
        write_by_rename(d.watch / "a.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (drive / "Depth" / "a.png").exists() and d.counts().get("done") == 1, what="the first map, on the drive")
        subprocess.run(["umount", "-l", str(drive)], check=True)  # ejected; its mount point stays, as fstab's does
        write_by_rename(d.watch / "a.jpg", jpeg_bytes(quadrant_frame(bright="bottom-right")))
        write_by_rename(d.watch / "b.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.log().count("is no longer mounted (its drive ejected?); the map is made once it is back") >= 2,
                 what="both frames said waiting for the drive")
        assert list(drive.iterdir()) == []  # nothing on the system disk where the drive was
        assert d.counts()["done"] == 1 and "Traceback" not in d.log()
        subprocess.run(mount, check=True)  # back (empty, as another machine may have cleaned it)
        wait_for(lambda: (drive / "Depth" / "a.png").exists() and (drive / "Depth" / "b.png").exists(), timeout=120,
                 what="both maps, on the drive once it is back")
        record = provenance.read(drive / "Depth" / "a.png")
        assert record is not None and record["size"] == (d.watch / "a.jpg").stat().st_size
    finally:
        assert d.stop() == 0
        subprocess.run(["umount", "-l", str(drive)], capture_output=True)


_BLACK_BOX = """
import logging, sys
from pathlib import Path
from depthwatch.daemon.blackbox import BlackBox
from depthwatch.frames.job import signature_of
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
box = BlackBox(Path(sys.argv[1]))
box.open()
box.note((sys.argv[2], signature_of(Path(sys.argv[2]))))
print("noted", flush=True)
if sys.argv[3] == "stay":
    sys.stdin.read()  # until the test kills it, as a crash would end it
box.note(None)
box.close()
print("closed", flush=True)
"""


def _black_box(status: Path, frame: Path, then: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _BLACK_BOX, str(status), str(frame), then],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_full_disk_under_the_status_file_costs_the_black_box_not_the_process(tmp_path, small_disk):
    """On a full disk the black box cannot keep its note: it says so in a line and the process goes on.
    A note kept in a file mapped into memory would be a store into a page with no block there, and the
    process would die of SIGBUS with no line, at every restart."""
    fill_disk(small_disk)
    frame = tmp_path / "frame.jpg"
    frame.write_bytes(b"x")
    box = _black_box(small_disk / "daemon.status.json", frame, "end")
    out, err = box.communicate(timeout=60)
    assert box.returncode == 0, f"ended by signal {-box.returncode}" if box.returncode < 0 else err
    assert out.split() == ["noted", "closed"]
    assert "cannot keep" in err and "daemon.status.json.inference" in err and "a frame that crashes" in err, err


def test_a_second_daemon_on_one_status_file_neither_clears_nor_reads_the_first_ones_note(tmp_path, caplog):
    """Two daemons given one status file: the second says so and leaves the first's live note alone, neither
    truncating it at its start nor removing it at its clean stop, nor taking it for a crash; so a crash of the
    first on a frame is still named at its next start."""
    from depthwatch.daemon.blackbox import BlackBox

    status = tmp_path / "daemon.status.json"
    frame = tmp_path / "frame.jpg"
    frame.write_bytes(b"x")
    first = _black_box(status, frame, "stay")
    try:
        assert first.stdout.readline().strip() == "noted"
        second = BlackBox(status)
        with caplog.at_level("INFO", logger="depthwatch"):
            second.open()
            second.note((str(tmp_path / "other.jpg"), (4, 5, 6)))
            second.close()
        said = caplog.text
        assert "another depthwatch keeps" in said and "give each daemon its own daemon.status_file" in said, said
        assert "was running on it" not in said  # the first one's live note is no crash
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert b"frame.jpg" in status.with_name(status.name + ".inference").read_bytes()
    caplog.clear()
    with caplog.at_level("INFO", logger="depthwatch"):
        restarted = BlackBox(status)
        restarted.open()
        restarted.close()
    assert "frame.jpg: the model was running on it when the last run ended without stopping" in caplog.text, caplog.text


def test_a_log_file_on_a_full_disk_says_how_many_lines_are_missing_not_a_traceback_each(tmp_path, tiny_model, small_disk):
    """$DEPTHWATCH_LOG_FILE (the LaunchAgent's) on a full disk: no line becomes Python's 30-line
    "--- Logging error ---" on stderr, and once there is room the log says how many lines are missing."""
    log_file = small_disk / "depthwatch.log"
    d = DaemonProcess(tmp_path, tiny_model, wrapper=("env", f"DEPTHWATCH_LOG_FILE={log_file}"))
    d.start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map")
        with open(log_file, "ab") as f:  # its last page filled, so the next line needs a new one
            f.write(b"#" * (4095 - log_file.stat().st_size % 4096) + b"\n")
        filler = fill_disk(small_disk)
        for n, corner in enumerate(("top-right", "bottom-left", "bottom-right"), 2):
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright=corner)))
            wait_for(lambda n=n: d.counts().get("done") == n, what=f"map {n}")
        filler.unlink()
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: "log line(s) are missing before this one: the log file could not be written" in log_file.read_text(),
                 what="the gap said in the log")
    finally:
        assert d.stop() == 0
    stderr = d.log()
    assert "Logging error" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.count("cannot write the log file") == 1, stderr[-2000:]
    assert "No space left on device" in log_file.read_text()
