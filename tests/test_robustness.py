"""Hostile files, failing disks and models: the daemon says why, keeps going, loses nothing."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import fill_disk, jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, privileges, wait_for
from onnx_models import failing_model, spec_for

from depthwatch.errors import EX_CONFIG
from depthwatch.frames import provenance
from depthwatch.frames.job import Job
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.reading import read_source
from depthwatch.frames.settings import Settings
from depthwatch.model.engine import Engine


def png_bytes(image: np.ndarray) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


def jpeg_bomb() -> bytes:
    """A small, complete JPEG whose header declares 60000 x 60000 pixels."""
    data = bytearray(jpeg_bytes(quadrant_frame(64, 48)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    return bytes(data)


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


def test_bad_inputs_are_reported_once_and_the_last_good_map_stays(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"incomplete_timeout_s": 0.5}, output={"error_sidecar": True}
    ).start()
    frame, depth, record = d.watch / "frame.jpg", d.watch / "depth.jpg", d.watch / "frame.jpg.error.json"
    good = jpeg_bytes(quadrant_frame(320, 180))
    png = png_bytes(quadrant_frame(320, 180))
    rng = np.random.default_rng(7)
    cases = [
        ("zero bytes", b"", "the file is empty (0 bytes)"),
        ("random bytes", b"\x00" + rng.bytes(5000), "not a JPEG, PNG, TIFF, WebP, EXR or DPX image"),
        ("text", b"this is a shot list, not a frame\n", "not a JPEG, PNG, TIFF, WebP, EXR or DPX image"),
        ("png named .jpg", png, "is a PNG image but its name says .jpg; rename it"),
        ("bomb", jpeg_bomb(), "60000x60000 is 3600 megapixels, over the limit of 100"),
    ]
    cases += [(f"jpeg cut at {n}", good[:n], "still incomplete after 0.5 s") for n in (3, 200, len(good) // 2, len(good) - 1)]
    cases += [(f"png cut at {n}", png[:n], "still incomplete after 0.5 s") for n in (10, 40, len(png) // 2, len(png) - 5)]
    try:
        write_by_rename(frame, good)
        wait_for(lambda: depth.exists(), what="the first good map")
        wait_for(lambda: d.counts().get("done") == 1, what="the first frame counted")
        good_map = depth.read_bytes()
        for n, (case, data, reason) in enumerate(cases, start=1):
            write_by_rename(frame, data)
            wait_for(lambda: d.counts().get("failed") == n, what=f"{case} to be reported")
            lines = error_lines(d)
            assert len(lines) == n, (case, lines)
            assert f"{frame}: " in lines[-1] and reason in lines[-1], (case, lines[-1])
            assert json.loads(wait_for(lambda: record.exists() and record.read_text(), what="the error record"))[
                "error"
            ] in lines[-1]
            assert depth.read_bytes() == good_map, case
            assert d.temp_files() == []
            record.unlink()
        write_by_rename(frame, jpeg_bytes(quadrant_frame(320, 180, "bottom-right")))
        wait_for(lambda: d.counts().get("done") == 2, what="a good frame after all that")
        assert depth.read_bytes() != good_map
        assert not record.exists()
    finally:
        assert d.stop() == 0


def test_an_error_record_older_than_a_current_map_goes_at_the_next_start(tmp_path, tiny_model):
    """A kill between a map's rename and its error record's removal leaves "failed" beside a good,
    current map: the start-up scan, finding the map current, removes the record too (it does not stop
    at the map), and says so, without mapping the frame again."""
    from depthwatch.frames.errorrecords import write_error_record

    d = DaemonProcess(tmp_path, tiny_model, output={"error_sidecar": True})
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
    d.start()
    try:
        wait_for(lambda: d.counts().get("done") == 1, what="the map")
    finally:
        assert d.stop() == 0
    record = d.watch / "frame.jpg.error.json"
    write_error_record(record, d.watch / "frame.jpg", "not a JPEG, PNG, TIFF, WebP, EXR or DPX image")  # the window a kill hit
    d.start()
    try:
        wait_for(lambda: not record.exists(), what="the stale record to go")
        assert "frame.jpg: its map is current; removed its error record from before it" in d.log()
        assert (d.watch / "depth.jpg").exists() and d.counts().get("done", 0) == 0  # not mapped again
    finally:
        assert d.stop() == 0


def test_a_plate_written_as_imagemagick_writes_it_is_mapped_without_a_false_empty_error(tmp_path, tiny_model):
    """ImageMagick opens its output, closes it empty, and opens it again to write it once it is encoded
    (seconds for a 4K plate): "the file is empty (0 bytes)" is not logged as a failure in between.
    A file written empty in place and left so is still reported, at the incomplete timeout."""
    d = DaemonProcess(tmp_path, tiny_model, watch={"incomplete_timeout_s": 3}).start()
    frame, depth = d.watch / "frame.jpg", d.watch / "depth.jpg"
    try:
        with open(frame, "wb"):
            pass  # opened, closed empty
        time.sleep(1.0)  # encoding (well past watch.settle_ms)
        with open(frame, "wb") as f:
            f.write(jpeg_bytes(quadrant_frame(320, 180)))
        wait_for(lambda: d.counts().get("done") == 1, what="the plate's map")
        assert depth.exists() and not d.counts().get("failed") and error_lines(d) == []
        with open(frame, "wb"):
            pass  # a writer that left it empty
        wait_for(lambda: d.counts().get("failed") == 1, what="the empty file to be reported")
        lines = error_lines(d)
        assert len(lines) == 1 and f"{frame}: the file is empty (0 bytes) 3 s after it was written" in lines[0], lines
    finally:
        assert d.stop() == 0


def exif_rotated_jpeg() -> bytes:
    """Stored 200x100 with its left half white, EXIF orientation 6: shown 100x200, top half white."""
    from PIL import Image

    stored = np.full((100, 200, 3), 20, np.uint8)
    stored[:, :100] = 235
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes(), quality=95)
    return out.getvalue()


def test_odd_but_valid_images_and_names(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.jpg", "*.png", "*.tif"]}, output={"template": "{stem}_depth.png"}
    ).start()
    gray16 = (np.linspace(0, 65535, 96 * 160).reshape(96, 160)).astype(np.uint16)
    rgba = np.dstack([quadrant_frame(), np.full((96, 160), 90, np.uint8)])
    long_stem = "shot_" + "x" * 200
    files = {
        "sixteen.png": (cv2.imencode(".png", gray16)[1].tobytes(), (160, 96)),
        "tiff16.tif": (cv2.imencode(".tif", gray16)[1].tobytes(), (160, 96)),
        "gray.jpg": (jpeg_bytes(quadrant_frame()[:, :, 0]), (160, 96)),
        "alpha.png": (png_bytes(rgba), (160, 96)),
        "one pixel wide.png": (png_bytes(quadrant_frame(1, 50)), (1, 50)),
        "panorama.jpg": (jpeg_bytes(quadrant_frame(6000, 200)), (6000, 200)),
        "rotated.jpg": (exif_rotated_jpeg(), (100, 200)),
        "ünïcødé 名前.jpg": (jpeg_bytes(quadrant_frame()), (160, 96)),
        f"{long_stem}.jpg": (jpeg_bytes(quadrant_frame()), (160, 96)),
        ".hidden.jpg": (jpeg_bytes(quadrant_frame()), None),  # hidden files are editors' temporaries: skipped
    }
    try:
        for name, (data, _) in files.items():
            write_by_rename(d.watch / name, data)
        expected = {name: size for name, (_, size) in files.items() if size}
        settled = lambda: d.counts().get("done", 0) + d.counts().get("failed", 0) >= len(expected)  # noqa: E731
        wait_for(settled, what="every valid image's map")
        assert d.counts()["failed"] == 0 and d.counts()["done"] == len(expected), d.log()
        for name, size in expected.items():
            depth = cv2.imread(str(d.watch / f"{Path(name).stem}_depth.png"), cv2.IMREAD_UNCHANGED)
            assert depth is not None and depth.dtype == np.uint16, name
            assert (depth.shape[1], depth.shape[0]) == size, name
        rotated = cv2.imread(str(d.watch / "rotated_depth.png"), cv2.IMREAD_UNCHANGED)
        assert rotated[:90].mean() > 60000 and rotated[110:].mean() < 5000  # as the editor shows it
        gradient = cv2.imread(str(d.watch / "sixteen_depth.png"), cv2.IMREAD_UNCHANGED).astype(np.int64)
        assert gradient[-1].mean() > gradient[0].mean()  # brighter rows, nearer
        assert not (d.watch / ".hidden_depth.png").exists()
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0


def test_links_to_outside_are_not_followed_and_outputs_stay_inside(tmp_path, tiny_model):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"}).start()
    try:
        (d.watch / "inside.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
        os.symlink(outside / "secret.jpg", d.watch / "escape.jpg")
        os.symlink(d.watch / "inside.jpg", d.watch / "alias.jpg")
        os.symlink(outside, d.watch / "linked_folder")
        wait_for(lambda: (d.watch / "alias_depth.jpg").exists() and (d.watch / "inside_depth.jpg").exists(), what="maps")
        wait_for(lambda: d.counts().get("failed") == 1, what="the escaping link to be reported")
        assert "escape.jpg: a symlink to outside the watch folder; not followed" in d.log()
        assert not (d.watch / "escape_depth.jpg").exists()
        assert sorted(p.name for p in outside.iterdir()) == ["secret.jpg"]
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("watch", [{}, {"follow_symlinks": True}, {"recursive": True}], ids=["plain", "follow_symlinks", "recursive"])
def test_a_watch_folder_that_is_a_symlink_gets_live_frames_too(tmp_path, tiny_model, watch):
    """The observer watches a link itself, not its folder: the daemon watches the folder it leads to."""
    real = tmp_path / "shots"
    (real / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    (real / "old.jpg").write_bytes(jpeg_bytes(quadrant_frame()))  # there before the start
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"folders": [str(link)], "patterns": ["*.jpg"], **watch}, output={"template": "{stem}_depth.jpg"}
    ).start()
    try:
        wait_for(lambda: (real / "old_depth.jpg").exists(), what="the frame found at start")
        write_by_rename(link / "live.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(real / "direct.jpg", jpeg_bytes(quadrant_frame(bright="bottom-right")))
        wait_for(lambda: (real / "live_depth.jpg").exists(), what="a live frame dropped through the link")
        wait_for(lambda: (real / "direct_depth.jpg").exists(), what="a live frame dropped into the folder itself")
        if watch.get("recursive"):
            write_by_rename(link / "sub" / "deep.jpg", jpeg_bytes(quadrant_frame()))
            wait_for(lambda: (real / "sub" / "deep_depth.jpg").exists(), what="a live frame in a subfolder")
        assert f"watching {link} (a link to {real}) for *.jpg" in d.log()
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0


def _watch_limit(watches: int) -> tuple[str, ...]:
    """A command prefix that runs the daemon in a user namespace of its own, allowed `watches` inotify watches."""
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", "echo 1 > /proc/sys/user/max_inotify_watches"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"no user namespace with its own inotify limit here: {probe.stderr.decode(errors='replace').strip()[:200]}")
    script = f'echo {watches} > /proc/sys/user/max_inotify_watches && exec "$@"'
    return ("unshare", "--user", "--map-root-user", "sh", "-c", script, "sh")


def _recursive_over_the_limit(tmp_path: Path, model: Path, shots: int, watches: int) -> tuple[Path, list[Path], DaemonProcess]:
    """A running daemon watching `watch/` recursively (its `shots` shot folders made first), allowed `watches` watches."""
    watch = tmp_path / "watch"
    folders = [watch / f"shot{i:02d}" for i in range(shots)]
    for folder in folders:
        folder.mkdir(parents=True)
    d = DaemonProcess(
        tmp_path, model, wrapper=_watch_limit(watches),
        watch={"recursive": True, "patterns": ["*.jpg"], "incomplete_timeout_s": 1}, output={"template": "{stem}_depth.jpg"},
    ).start()
    return watch, folders, d


def test_folders_beyond_the_inotify_watch_limit_are_said_and_scanned_not_silently_dropped(tmp_path, tiny_model):
    """watchdog skips a folder it cannot watch without a word, so the folders of a recursive watch
    beyond the user's inotify limit (8192 on many systems, shared with every program) are said, counted
    in the status and scanned: their frames are mapped, not left while the daemon says it is watching."""
    watch, shots, d = _recursive_over_the_limit(tmp_path, tiny_model, shots=8, watches=3)
    try:
        late = watch / "late"
        late.mkdir()  # a folder made while running, beyond the limit too
        for i, shot in enumerate([*shots, late]):
            write_by_rename(shot / f"frame{i}.jpg", jpeg_bytes(quadrant_frame()))
        (late / "broken.jpg").write_bytes(b"not a picture")
        line = "folder(s) under {} are not watched: the system's limit on inotify watches is reached (user.max_inotify_watches = 3"
        wait_for(lambda: line.format(watch) in d.log(), what="the limit said")
        # The watch line says what is watched: the folder alone, not a recursive watch.
        assert f"watching {watch} for *.jpg (recursive, but only this folder is watched: the system's limit on inotify" in d.log()
        for i, shot in enumerate([*shots, late]):
            wait_for(lambda: (shot / f"frame{i}_depth.jpg").exists(), what=f"the frame in {shot.name}")
        # Three watches: the watch folder and at most two shots are watched (watchdog gives a recursive
        # watch up at the first folder over the limit; depthwatch then watches the folder itself alone),
        # so 7 to all 9 of the shots and the late folder are not, and the status counts them.
        wait_for(lambda: 7 <= d.status().get("unwatched", {}).get(str(watch), 0) <= 9, what="the status to count them")
        wait_for(lambda: d.counts().get("failed") == 1, what="the broken frame failed")
        # Scanned like a watch sees: a frame that fails is not tried (and counted) again at every scan.
        write_by_rename(late / "after.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (late / "after_depth.jpg").exists(), what="a frame after the broken one")
        scans = [text for text in d.log().splitlines() if f"{late} not watched, scanned:" in text]
        assert scans and scans[-1].split("scanned: ")[1].startswith("1 frame(s)"), scans  # the new frame alone
        assert d.counts()["failed"] == 1
        assert "Traceback" not in d.log()
    finally:
        assert d.stop() == 0


def _raise_watch_limit(daemon: DaemonProcess, watches: int) -> None:
    """What a user does when told to: raise the limit (here, that of the daemon's own user namespace)."""
    script = f"echo {watches} > /proc/sys/user/max_inotify_watches"
    subprocess.run(["nsenter", "--target", str(daemon.proc.pid), "--user", "sh", "-c", script], check=True, timeout=60)


def test_a_recursive_watch_cut_short_by_the_inotify_limit_is_watched_whole_once_the_limit_is_raised(tmp_path, tiny_model):
    """Raising the inotify limit takes effect without a restart: the daemon watches the whole tree once the
    limit allows it, says so, and stops scanning every 5 s the folders under the watch folder."""
    watch, shots, d = _recursive_over_the_limit(tmp_path, tiny_model, shots=6, watches=3)
    try:
        unwatched = lambda: d.status().get("unwatched", {}).get(str(watch), 0)  # noqa: E731
        # Refused whole (7 folders, 3 watches): the folder alone is watched, the six shots are scanned.
        wait_for(lambda: unwatched() == 6, what="the six shots counted as not watched")
        _raise_watch_limit(d, 10)
        wait_for(lambda: f"watching {watch} whole now: the limit on inotify watches allows it" in d.log(), what="the whole tree watched")
        wait_for(lambda: unwatched() == 0, what="the status to count none")
        wait_for(lambda: f"every folder under {watch} is watched again" in d.log(), what="it said")
        scans = d.log().count("not watched, scanned")
        for i, shot in enumerate(shots):
            write_by_rename(shot / f"frame{i}.jpg", jpeg_bytes(quadrant_frame()))
        for i, shot in enumerate(shots):
            wait_for(lambda: (shot / f"frame{i}_depth.jpg").exists(), what=f"the frame in {shot.name}")
        assert d.log().count("not watched, scanned") == scans  # seen by the watch, not found by a scan

        # Watched whole, then folders made beyond the limit (10 watches: 3 of these 5 fit) ...
        later = [watch / f"later{i}" for i in range(5)]
        for folder in later:
            folder.mkdir()
        wait_for(lambda: unwatched() == 2, what="two later folders counted as not watched")
        # ... are watched when it is raised again: the watch made anew, the tree scanned once.
        _raise_watch_limit(d, 100)
        wait_for(lambda: unwatched() == 0, what="the later folders watched")
        assert d.log().count(f"watching {watch} for *.jpg (recursive)\n") == 1, d.log()  # the new watch, whole
        for i, folder in enumerate(later):
            write_by_rename(folder / f"late{i}.jpg", jpeg_bytes(quadrant_frame()))
        for i, folder in enumerate(later):
            wait_for(lambda: (folder / f"late{i}_depth.jpg").exists(), what=f"the frame in {folder.name}")
        assert "Traceback" not in d.log()
    finally:
        assert d.stop() == 0


def test_a_watch_folder_refused_for_the_inotify_limit_is_said_once_and_scanned_not_waited_for(tmp_path, tiny_model):
    """A watch folder the kernel's inotify limit refuses is said once, for that limit (not "No space left on
    device" every second), counted as not watched rather than gone, and scanned: its frames are mapped."""
    d = DaemonProcess(
        tmp_path, tiny_model, wrapper=_watch_limit(0),
        watch={"patterns": ["*.jpg"], "incomplete_timeout_s": 1}, output={"template": "{stem}_depth.jpg"},
    ).start()
    try:
        line = (f"cannot watch {d.watch} (the system's limit on inotify watches is reached (user.max_inotify_watches = 0)); "
                "frames in it are found by a scan every 5 s")
        wait_for(lambda: line in d.log(), what="the limit said")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "frame_depth.jpg").exists(), what="the frame mapped by a scan")
        write_by_rename(d.watch / "second.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "second_depth.jpg").exists(), what="a second frame, at a later scan")
        status = d.status()
        assert status["waiting_for"] == [] and status["unwatched"] == {str(d.watch): 1}, status
        shown = subprocess.run(
            [sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)], capture_output=True, text=True, timeout=60
        ).stdout
        assert f"1 folder(s) of {d.watch} (the system's inotify watch limit" in shown and "gone" not in shown, shown
        log = d.log()
        assert log.count(f"cannot watch {d.watch}") == 1, log  # not once a second
        assert "No space left on device" not in log
    finally:
        assert d.stop() == 0


def test_the_watch_limit_is_judged_per_drive_when_two_watch_folders_are_drives_roots(tmp_path):
    """Two drives' roots share an inode number (1 on tmpfs, 2 on ext4): the kernel's list of watches is
    read per drive, so folders beyond the watch limit on either drive are found. Searched for the root's
    inode alone, it would be found on two devices and nothing said, nor any folder scanned."""
    import ctypes

    from depthwatch.daemon.coverage import unwatched, watched_folders

    libc = ctypes.CDLL(None, use_errno=True)

    drives = [tmp_path / "a", tmp_path / "b"]
    mounted = []
    try:
        for drive in drives:
            drive.mkdir()
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(drive)], capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
            mounted.append(drive)
            (drive / "shot1").mkdir()
            (drive / "shot2").mkdir()
        assert os.stat(drives[0]).st_ino == os.stat(drives[1]).st_ino  # as two drives' roots are
        inotify = libc.inotify_init1(os.O_CLOEXEC)  # as watchdog's: both roots, and one shot of the second drive
        assert inotify >= 0, os.strerror(ctypes.get_errno())
        try:
            for folder in (drives[0], drives[1], drives[1] / "shot2"):
                assert libc.inotify_add_watch(inotify, os.fsencode(folder), 0x100) >= 0  # IN_CREATE
            watched = watched_folders()
            assert watched is not None
            assert sorted(unwatched(drives[0], watched)) == [drives[0] / "shot1", drives[0] / "shot2"]
            assert unwatched(drives[1], watched) == [drives[1] / "shot1"]
        finally:
            os.close(inotify)
    finally:
        for drive in mounted:
            subprocess.run(["umount", "-l", str(drive)], check=False)


def test_frames_written_while_the_watch_folder_cannot_be_searched_are_mapped_once_it_can(tmp_path, tiny_model):
    """A share's permissions fixed up, a chmod: no traceback per frame, no frames dropped for good
    (the old map showing the version before, and the status saying nothing failed)."""
    d = DaemonProcess(tmp_path, tiny_model, restricted=True).start()  # permissions bind, as for a user
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map")
        os.chmod(d.watch, 0)
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright="bottom-right")))  # the test keeps root's reach
        wait_for(lambda: "frame.jpg: cannot be looked at (Permission denied" in d.log(), what="the folder it cannot search said")
        os.chmod(d.watch, 0o755)
        wait_for(lambda: d.counts().get("done") == 2, what="the frame written meanwhile, mapped")
        assert "Traceback" not in d.log() and not d.counts().get("failed")
        record = provenance.read(d.watch / "depth.jpg")
        st = os.stat(d.watch / "frame.jpg")
        assert record is not None and (record["size"], record["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
    finally:
        os.chmod(d.watch, 0o755)
        assert d.stop() == 0


def test_unreadable_frame_is_reported(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, restricted=True).start()
    try:
        (d.watch / ".f").write_bytes(jpeg_bytes(quadrant_frame()))
        os.chmod(d.watch / ".f", 0)
        (d.watch / ".f").rename(d.watch / "frame.jpg")
        wait_for(lambda: d.counts().get("failed") == 1, what="the unreadable frame to be reported")
        assert f"{d.watch / 'frame.jpg'}: permission denied reading the file; check its permissions" in d.log()
        os.chmod(d.watch / "frame.jpg", 0o644)
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="service to go on")
    finally:
        assert d.stop() == 0


def test_unwritable_folder_is_retried_once_writable_again(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model, restricted=True, daemon={"retries": 6}).start()
    depth = d.watch / "depth.jpg"
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: depth.exists(), what="the first map")
        before = depth.read_bytes()
        os.chmod(d.watch, 0o555)
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(bright="bottom-right")))
        wait_for(lambda: "permission denied (is the folder writable?); try 1 of 6" in d.log(), what="the first failure")
        assert depth.read_bytes() == before and d.temp_files() == []
        os.chmod(d.watch, 0o755)
        wait_for(lambda: depth.read_bytes() != before, what="the retry to land")
        assert d.counts()["failed"] == 0 and d.counts()["retried"] >= 1
        assert d.temp_files() == []
    finally:
        os.chmod(d.watch, 0o755)
        assert d.stop() == 0


def test_full_disk_leaves_nothing_half_written_and_retries(tmp_path, tiny_model, small_disk):
    d = DaemonProcess(tmp_path, tiny_model, watch={"folders": [str(small_disk)]}, daemon={"retries": 6})
    d.watch = small_disk
    d.start()
    depth = small_disk / "depth.jpg"
    try:
        write_by_rename(small_disk / "frame.jpg", jpeg_bytes(quadrant_frame(320, 180)))
        wait_for(lambda: depth.exists(), what="the first map")
        frame = jpeg_bytes(quadrant_frame(320, 180, "bottom-right"))
        write_by_rename(small_disk / "frame.jpg", frame)  # the frame fits; then nothing else does
        wait_for(lambda: d.counts().get("done") == 2, what="the second map")
        filler = fill_disk(small_disk)
        after = depth.read_bytes()
        with open(small_disk / "frame.jpg", "r+b") as f:
            f.write(frame)  # rewritten in place: needs no new space, so it lands even now
        wait_for(lambda: "the disk is full; try 1 of 6" in d.log(), what="the full disk to be reported")
        assert depth.read_bytes() == after and d.temp_files() == []
        filler.unlink()
        wait_for(lambda: d.counts().get("done") == 3, what="the retry once space is back")
        assert d.temp_files() == []
    finally:
        assert d.stop() == 0


def test_a_disk_with_room_for_a_small_file_but_not_the_map_counts_its_frame_failed_once(tmp_path, tiny_model, small_disk):
    """The folder looks writable (free space, permission) but the map does not fit: the frame is counted
    once and its pauses grow, rather than coming back from the parked lot every five seconds for good,
    each time +1 failed, +2 retried and three log lines (15,000 "failed" a weekend for one frame)."""
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"folders": [str(small_disk)]},
        output={"template": "depth.png", "png_compression": 0}, daemon={"retries": 1, "log_level": "debug"},
    )
    d.watch = small_disk
    d.start()
    depth = small_disk / "depth.png"
    try:
        write_by_rename(small_disk / "frame.jpg", jpeg_bytes(quadrant_frame(640, 360), quality=50))
        wait_for(lambda: d.counts().get("done") == 1, what="the first map")
        size = depth.stat().st_size
        assert size > 3 * 64 * 1024, size  # a map larger than the room the parked lot asks for
        depth.unlink()
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        (small_disk / "filler").write_bytes(b"\0" * max(0, free - size // 2))
        write_by_rename(small_disk / "frame.jpg", jpeg_bytes(quadrant_frame(640, 360, "bottom-right"), quality=50))
        wait_for(lambda: d.counts().get("failed") == 1, what="the map that does not fit")
        wait_for(lambda: d.log().count("still cannot be written, looked at again later") >= 2, timeout=120,
                 what="the frame back from the parked lot twice")
        counts = d.counts()
        assert counts["failed"] == 1 and counts["retried"] == 1, counts
        assert d.log().count("made again once") == 1 and d.temp_files() == []
        # The status says a frame waits (not "0 queued, 0 in progress", its old map showing).
        wait_for(lambda: d.status().get("parked") == 1, what="the parked frame in the status")
        (small_disk / "filler").unlink()
        wait_for(lambda: d.counts().get("done") == 2, timeout=120, what="the map once there is room")
        wait_for(lambda: d.status().get("parked") == 0, what="nothing parked any more")
    finally:
        assert d.stop() == 0


def test_watch_folder_deleted_and_recreated_is_watched_again(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        assert d.status()["waiting_for"] == []
        shutil.rmtree(d.watch)
        wait_for(lambda: "disappeared or was replaced" in d.log(), what="the loss to be noticed")
        # Not only the log: the status says no frame can come from it (not that all is well).
        wait_for(lambda: d.status().get("waiting_for") == [str(d.watch)], what="the status to say the folder is gone")
        d.watch.mkdir()
        wait_for(lambda: d.log().count(f"watching {d.watch} for frame.jpg") == 2, what="the watch to come back")
        wait_for(lambda: d.status().get("waiting_for") == [], what="the status to say it is back")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="a map in the recreated folder")
    finally:
        assert d.stop() == 0


def test_inference_error_fails_one_frame_and_the_daemon_serves_on(tmp_path):
    model = failing_model(tmp_path / "fails.onnx")
    d = DaemonProcess(tmp_path, model).start()
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(np.full((40, 40, 3), 255, np.uint8)))
        wait_for(lambda: d.counts().get("failed") == 1, what="the failing frame")
        assert "frame.jpg: inference failed:" in d.log()
        assert d.status().get("health_error") is None  # one frame may be the frame's fault
        # Frame after frame, the model's: said in the status, as unusable predictions are (not
        # health_error null and /health "running" while the model fails every frame).
        for i in range(2, 6):
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(np.full((40 + i, 40, 3), 255, np.uint8)))
            wait_for(lambda i=i: d.counts().get("failed") == i, what=f"failing frame {i}")
        health = wait_for(lambda: d.status().get("health_error"), what="the health error")
        assert "last 5 predictions were unusable (inference failed:" in health, health
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(np.full((40, 40, 3), 90, np.uint8)))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="the next frame's map")
        wait_for(lambda: d.status().get("health_error") is None, what="the health error cleared")
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("problem", ["missing", "unreadable", "corrupt"])
def test_model_problems_at_start_exit_78_with_one_line(tmp_path, problem):
    model = tmp_path / "model.onnx"
    if problem != "missing":
        model.write_bytes(b"\x08\x07garbage" * 10)
    if problem == "unreadable":
        model.chmod(0)
    config = tmp_path / "config.yaml"
    config.write_text(f"model:\n  path: {model}\n")
    done = subprocess.run(
        [*privileges(True), sys.executable, "-m", "depthwatch", "run", "-c", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == EX_CONFIG
    lines = done.stderr.strip().splitlines()
    expected = {
        "missing": f"depthwatch: model file {model} does not exist; check model.path (or --model)",
        "unreadable": f"depthwatch: model file {model} is not readable; check its permissions",
        "corrupt": f"depthwatch: cannot load model {model}: ",
    }[problem]
    assert lines[-1].startswith(expected), done.stderr
    assert "Traceback" not in done.stderr


def test_corrupt_model_on_reload_keeps_the_old_one(tmp_path, tiny_model):
    import yaml

    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        broken = tmp_path / "broken.onnx"
        broken.write_bytes(b"not a model")
        config = yaml.safe_load(d.config_path.read_text())
        config["model"]["path"] = str(broken)
        write_by_rename(d.config_path, yaml.safe_dump(config).encode())
        wait_for(lambda: (d.status().get("config_error") or "").startswith("cannot load model"), what="the failed swap")
        assert d.status()["model"] == str(tiny_model)
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="service on the old model")
    finally:
        assert d.stop() == 0


def test_a_frame_that_changed_or_vanished_after_its_event_is_skipped_not_failed(tmp_path, tiny_model):
    source = tmp_path / "frame.jpg"
    source.write_bytes(jpeg_bytes(quadrant_frame()))
    st = source.stat()
    found = (st.st_size, st.st_mtime_ns, st.st_ino)
    write_by_rename(source, jpeg_bytes(quadrant_frame(bright="bottom-left")))  # a newer version
    with Engine(spec_for(tiny_model)) as engine:
        pipeline = Pipeline(engine)
        changed = pipeline.process(Job(source, tmp_path / "depth.jpg", signature=found), Settings())
        source.unlink()
        vanished = pipeline.process(Job(source, tmp_path / "depth.jpg"), Settings())
        pipeline.close()
    assert changed.superseded and changed.error == "the file changed after it was found complete"
    assert vanished.superseded and vanished.error == "the file vanished before it could be read"
    assert not (tmp_path / "depth.jpg").exists()
    with pytest.raises(Exception, match="vanished"):
        read_source(source)


def test_unmounted_and_remounted_volume_is_watched_again(tmp_path, tiny_model):
    """A network or external volume going away and coming back (a tmpfs here; needs root)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(volume)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    d = DaemonProcess(tmp_path, tiny_model, watch={"folders": [str(volume)]})
    d.watch = volume
    try:
        d.start()
        write_by_rename(volume / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (volume / "depth.jpg").exists(), what="a map on the volume")
        # The map is visible at its rename; the job still holds the folder (its fsync, the record)
        # a moment longer, and umount says "target is busy" meanwhile, as it would to a user. Once
        # the job is counted the daemon holds nothing there (inotify watches do not pin a mount):
        # a daemon that kept the volume open would leave it busy and fail here.
        wait_for(lambda: d.counts()["done"] >= 1, what="the job to be done")
        wait_for(lambda: subprocess.run(["umount", str(volume)], capture_output=True).returncode == 0, what="the unmount")
        wait_for(lambda: "disappeared or was replaced" in d.log(), what="the unmount to be noticed")
        wait_for(lambda: d.log().count(f"watching {volume} for frame.jpg") >= 2, what="the folder to be watched again")
        assert subprocess.run(mount, capture_output=True).returncode == 0
        # The daemon may find the new mount when it watches the folder again, or at its next health
        # check (one more "watching" line): either way a frame dropped there now gets its map (the
        # old map went with the old mount). Counting the lines would race the mount against the re-watch.
        write_by_rename(volume / "frame.jpg", jpeg_bytes(quadrant_frame(bright="bottom-right")))
        wait_for(lambda: (volume / "depth.jpg").exists(), what="a map on the remounted volume")
        assert d.counts()["failed"] == 0
    finally:
        code = d.stop()
        subprocess.run(["umount", "-l", str(volume)], capture_output=True)
    assert code == 0


@pytest.mark.parametrize("follow", [False, True], ids=["not followed", "follow_symlinks"])
def test_a_dangling_link_a_loop_and_links_to_kernel_files_get_one_line_and_one_record_each(tmp_path, tiny_model, follow):
    kernel = [p for p in ("/proc/cpuinfo", "/sys/devices/system/cpu/online") if os.path.isfile(p)]
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.jpg"], "follow_symlinks": follow},
        output={"template": "{stem}_depth.jpg", "error_sidecar": True},
    ).start()
    links = {"dangling.jpg": "missing.jpg", "loop.jpg": "loop.jpg", **{f"kernel{i}.jpg": p for i, p in enumerate(kernel)}}
    try:
        for name, target in links.items():
            os.symlink(target, d.watch / f".{name}")
            os.replace(d.watch / f".{name}", d.watch / name)
        wait_for(lambda: d.counts().get("failed") == len(links), what="each link reported")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "frame_depth.jpg").exists(), what="a frame after them")
        assert d.counts()["failed"] == len(links)
    finally:
        assert d.stop() == 0
    errors = [line for line in d.log().splitlines() if " ERROR " in line]
    expected = {
        "dangling.jpg": "a symlink to 'missing.jpg', which does not exist",
        "loop.jpg": "a symlink loop; not followed",
    }
    for i, target in enumerate(kernel):
        expected[f"kernel{i}.jpg"] = (
            f"a symlink to {target!r}, a file of the kernel's, not an image file; not read" if follow
            else "a symlink to outside the watch folder; not followed"
        )
    for name, reason in expected.items():
        lines = [line for line in errors if f"/{name}: " in line]
        assert len(lines) == 1 and reason in lines[0], (name, errors)
        record = json.loads((d.watch / f"{name}.error.json").read_text())
        assert reason in record["error"], record
