"""A user's own files and folders, against the real daemon, `once` and the HTTP API.

depthwatch replaces only files it made itself (their provenance record says
so), and writes a frame's map only into the folder that frame was read from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, strace_works, wait_for

from depthwatch.frames import provenance


def png_bytes(frame) -> bytes:
    return cv2.imencode(".png", frame)[1].tobytes()


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


def idle(d: DaemonProcess) -> bool:
    status = d.status()
    return status.get("queue_depth") == 0 and status.get("in_progress") == 0


def run_once(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- never replace a user's file --------------------------------------------------------------------


def test_once_on_a_folder_refuses_a_template_that_would_replace_an_input_and_writes_nothing(tmp_path, tiny_model):
    """shot.png, the user's master, is not shot.jpg's map under -o '{stem}.png'; nor x_depth.jpg x.jpg's."""
    base = ["--model", str(tiny_model), "--profile", "midas-v21-small"]
    cases = [
        ({"shot.jpg": jpeg_bytes(quadrant_frame()), "shot.png": png_bytes(quadrant_frame(64, 64, "bottom-right"))},
         ["-o", "{stem}.png"], "shot.png"),
        ({"x.jpg": jpeg_bytes(quadrant_frame()), "x_depth.jpg": jpeg_bytes(quadrant_frame(64, 64, "bottom-right"))},
         [], "x_depth.jpg"),
    ]
    for i, (files, args, victim) in enumerate(cases):
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        before = snapshot(folder)
        done = run_once(str(folder), *base, *args, cwd=tmp_path)
        assert done.returncode != 0, done.stdout + done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and victim in lines[0] and "not a depth map depthwatch made" in lines[0], done.stderr
        assert snapshot(folder) == before, "once wrote or replaced something"
    # A map depthwatch made itself is replaced as ever: a second run over the same folder.
    folder = tmp_path / "ours"
    folder.mkdir()
    (folder / "x.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    for _ in range(2):
        done = run_once(str(folder), *base, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert provenance.read(folder / "x_depth.jpg")["source"] == "x.jpg"


def test_the_daemon_never_replaces_a_master_that_has_a_maps_name(tmp_path, tiny_model):
    """Patterns *.jpg and *.png with the template {stem}.png: shot.png is the user's, not shot.jpg's map."""
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.jpg", "*.png"]}, output={"template": "{stem}.png"})
    master = png_bytes(quadrant_frame(64, 64, "bottom-right"))
    (d.watch / "shot.png").write_bytes(master)
    d.start()
    try:
        clash = [line for line in d.log().splitlines() if " WARNING " in line and "*.png" in line and "{stem}.png" in line]
        assert len(clash) == 1, d.log()
        write_by_rename(d.watch / "shot.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "other.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1 and d.counts().get("failed") == 1 and idle(d), what="one map, one refusal")
        refused = [line for line in error_lines(d) if "shot.jpg" in line]
        assert len(refused) == 1 and "shot.png" in refused[0] and "not a depth map depthwatch made" in refused[0], refused
        assert (d.watch / "shot.png").read_bytes() == master
        assert provenance.read(d.watch / "other.png")["source"] == "other.jpg"
        write_by_rename(d.watch / "other.jpg", jpeg_bytes(quadrant_frame(160, 96, "bottom-right")))  # its own map: replaced
        wait_for(lambda: d.counts().get("done") == 2, what="other.jpg's second map")
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
    assert not d.temp_files()


# -- a frame's map goes into the folder the frame was read from, or nowhere --------------------------


def test_maps_never_land_in_a_folder_swapped_in_while_their_frames_were_in_flight(tmp_path):
    """proj -> showA re-pointed to showB, and a watch folder swapped for a link to outside, frames in flight.

    showA's frames were read from showA: their maps are refused (one line
    each), never written into showB beside showB's own frames of the same
    names, nor outside.
    """
    from onnx_models import slow_model

    # Two seconds a frame on the CPU provider: the first frame's run is the margin for the swaps after its
    # frames are seen in flight (the status file's lag, a rename or two).
    model = slow_model(tmp_path / "slow.onnx", seconds=2.0, size=256)
    show_a, show_b, outside = tmp_path / "showA" / "shots", tmp_path / "showB" / "shots", tmp_path / "outside"
    for folder in (show_a, show_b, outside):
        folder.mkdir(parents=True)
    for name in ("a0.jpg", "a1.jpg"):
        (show_b / name).write_bytes(jpeg_bytes(quadrant_frame(64, 64, "bottom-right")))  # showB's own frames
    proj = tmp_path / "proj"
    proj.symlink_to(show_a.parent)
    d = DaemonProcess(
        tmp_path, model,
        watch={"folders": [str(proj / "shots"), str(tmp_path / "watch")], "patterns": ["a*.jpg", "w*.jpg"]},
        output={"template": "{stem}_depth.jpg", "error_sidecar": True},
        daemon={"workers": 1},
        providers=["cpu"],  # that slow on onnxruntime's CPU provider (auto may pick OpenVINO, faster)
    )
    d.start()
    try:
        for name in ("a0.jpg", "a1.jpg"):
            write_by_rename(show_a / name, jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "w0.jpg", jpeg_bytes(quadrant_frame()))
        try:
            wait_for(lambda: d.status().get("in_progress") == 3, what="three frames in flight")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status {d.status()}; log:\n{d.log()[-3000:]}") from None
        relink = tmp_path / ".proj-new"
        relink.symlink_to(show_b.parent)
        os.replace(relink, proj)  # proj -> showB, in one step
        (tmp_path / "watch").rename(tmp_path / "watch.moved")
        (tmp_path / "watch").symlink_to(outside)
        frames = ("a0.jpg", "a1.jpg", "w0.jpg")
        originals = (show_a, tmp_path / "watch.moved")

        def refused() -> set[str]:
            lines = [line for line in error_lines(d) if "is no longer the folder the frame was read from" in line]
            return {name for name in frames for line in lines if f"/{name}: " in line}

        def written_before_the_swap() -> set[str]:  # a frame whose map was done first: in its own folder
            return {p.name.replace("_depth", "") for folder in originals for p in folder.glob("*_depth.jpg")}

        def settled() -> bool:
            # Refused, or done before the swap; or, for showA's frames, superseded before inference by
            # showB's frame of the same name that the swap put at their path (a loaded machine gets
            # there: "in flight" counts a frame still being read), whose map is then showB's own.
            done = refused() | written_before_the_swap()
            return len(done) + d.counts().get("superseded", 0) >= 3 and idle(d)

        # Three runs of a model of a second or more (many more on a loaded machine): a generous wait.
        wait_for(settled, timeout=240, what="each frame refused, done or superseded")
        assert refused(), "no map was in flight at the swap"
        assert not refused() & written_before_the_swap()
        for map_ in show_b.glob("*_depth.jpg"):  # any map there is of showB's own frame
            record = provenance.read(map_)
            assert provenance.same_version(record, (show_b / record["source"]).stat()), map_
        assert list(outside.iterdir()) == []
        assert sorted(p.name for p in show_b.iterdir() if not p.name.endswith("_depth.jpg")) == ["a0.jpg", "a1.jpg"]
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


# -- the HTTP API's jobs get the watcher's checks ---------------------------------------------------


def test_a_predict_request_whose_output_folder_turns_into_a_link_outside_is_refused_like_the_watchers(tmp_path):
    """POST /predict queues the job for a frame whose map is current (so the watcher queued none).

    The output folder is then swapped for a link to outside while the frame
    is in the model: the request's own job is refused at write time, as the
    watcher's would be, and nothing is written outside.
    """
    import threading

    requests = __import__("pytest").importorskip("requests")
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=2.0, size=256)  # two seconds or more in the model: the margin for the swap
    outside = tmp_path / "outside"
    outside.mkdir()
    d = DaemonProcess(
        tmp_path, model,
        watch={"patterns": ["*.jpg"]}, output={"template": "maps/{stem}_depth.jpg"},
        api={"enabled": True, "port": 0}, daemon={"workers": 1},
        providers=["cpu"],  # that slow on onnxruntime's CPU provider, and no engine measurement beside it
    )
    maps = d.watch / "maps"
    maps.mkdir()
    frame = d.watch / "shot.jpg"
    frame.write_bytes(jpeg_bytes(quadrant_frame()))
    record = provenance.record_for("shot.jpg", frame.stat(), model="slow.onnx", normalise="stable", invert=False)
    (maps / "shot_depth.jpg").write_bytes(provenance.embed(jpeg_bytes(quadrant_frame(64, 64)), record))  # current
    d.start()
    try:
        url = wait_for(lambda: d.status().get("api"), what="the API address")
        answers: list = []
        post = threading.Thread(target=lambda: answers.append(requests.post(f"{url}/predict?frame=shot.jpg", timeout=120)))
        post.start()
        wait_for(lambda: d.status().get("in_progress") == 1, what="the request's job in flight")
        maps.rename(d.watch / "maps.real")
        maps.symlink_to(outside)
        post.join(120)
        assert answers and answers[0].status_code != 200, answers and answers[0].text
        assert "outside the configured folders" in answers[0].text, answers[0].text
        wait_for(lambda: idle(d), what="the daemon idle")
        assert list(outside.iterdir()) == []
        assert d.counts().get("done", 0) == 0
    finally:
        assert d.stop() == 0


# -- the size a decoder will use ------------------------------------------------------------------


def packbits_tiff(sizes: list[tuple[int, int]]) -> bytes:
    """A gray 8-bit TIFF whose one IFD lists ImageWidth/ImageLength once per entry of `sizes`, in order.

    Its pixels (PackBits, one strip) are enough for the first size, the one
    libtiff (OpenCV's decoder) takes.
    """
    import struct

    width, height = sizes[0]
    runs, rest = divmod(width, 128)
    row = b"\x81\x00" * runs + (bytes([257 - rest, 0]) if rest else b"")
    pixels = row * height
    size_tags = [entry for w, h in sizes for entry in ((256, 4, w), (257, 4, h))]
    tags = size_tags + [(258, 3, 8), (259, 3, 32773), (262, 3, 1), (273, 4, 0), (277, 3, 1), (278, 4, height), (279, 4, len(pixels))]
    data_at = 8 + 2 + 12 * len(tags) + 4
    ifd = struct.pack("<H", len(tags))
    for tag, kind, value in tags:
        value = data_at if tag == 273 else value
        ifd += struct.pack("<HHI", tag, kind, 1) + (struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value))
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + pixels


def test_a_tiff_that_lists_its_size_twice_is_refused_in_one_line(tmp_path, tiny_model):
    """15000x15000 first (what libtiff decodes: 225 MP), 100x100 second: refused, whichever a reader takes."""
    import numpy as np

    decoded = cv2.imdecode(np.frombuffer(packbits_tiff([(300, 300), (100, 100)]), np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded is not None and decoded.shape[:2] == (300, 300)  # OpenCV (libtiff) takes the first size
    d = DaemonProcess(tmp_path, tiny_model, watch={"patterns": ["*.tif"]}, output={"template": "{stem}_depth.jpg"}).start()
    try:
        write_by_rename(d.watch / "twice.tif", packbits_tiff([(15000, 15000), (100, 100)]))  # 3.5 MB on disk
        write_by_rename(d.watch / "small.tif", packbits_tiff([(100, 100)]))
        wait_for(lambda: d.counts().get("failed") == 1 and d.counts().get("done") == 1 and idle(d), what="one refused, one mapped")
        lines = [line for line in error_lines(d) if "twice.tif" in line]
        assert len(lines) == 1 and "lists its size more than once (15000x15000, 100x100)" in lines[0], lines
        assert not (d.watch / "twice_depth.jpg").exists()
        assert (d.watch / "small_depth.jpg").exists()
        assert d.proc.poll() is None
        assert d.peak_rss() < 600 * 2**20, f"peak RSS {d.peak_rss() / 2**20:.0f} MB: the image was decoded"
    finally:
        assert d.stop() == 0


# -- a prediction that is no depth map ----------------------------------------------------------------


def bright_frame(width: int = 96, height: int = 64):
    """Bright everywhere (sqrt_model maps it), with a gradient (so its map is not constant)."""
    import numpy as np

    ramp = np.linspace(160, 250, width, dtype=np.float32)
    return np.repeat(np.repeat(ramp[None, :, None], height, 0), 3, 2).astype(np.uint8)


def test_nan_predictions_fail_their_frames_and_several_in_a_row_are_a_health_error(tmp_path):
    from onnx_models import sqrt_model

    d = DaemonProcess(tmp_path, sqrt_model(tmp_path / "sqrt.onnx"), output={"error_sidecar": True}).start()
    frame, depth, record = d.watch / "frame.jpg", d.watch / "depth.jpg", d.watch / "frame.jpg.error.json"
    try:
        write_by_rename(frame, jpeg_bytes(bright_frame()))
        wait_for(lambda: d.counts().get("done") == 1, what="the good map")
        good = depth.read_bytes()
        for i in range(1, 6):
            write_by_rename(frame, jpeg_bytes(quadrant_frame(96, 64)))  # dark pixels: NaN there
            wait_for(lambda i=i: d.counts().get("failed") == i, what=f"NaN prediction {i} refused")
        lines = [line for line in error_lines(d) if "frame.jpg: " in line]
        assert len(lines) == 5 and all("the model returned NaN or infinite values" in line for line in lines), lines
        assert depth.read_bytes() == good
        assert "NaN" in __import__("json").loads(record.read_text())["error"]
        health = wait_for(lambda: d.status().get("health_error"), what="the health error")
        assert "last 5 predictions were unusable" in health
        shown = subprocess.run(
            [sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)], capture_output=True, text=True, timeout=60
        )
        assert "health:" in shown.stdout and "last 5 predictions were unusable" in shown.stdout, shown.stdout
        write_by_rename(frame, jpeg_bytes(bright_frame(64, 48)))
        wait_for(lambda: d.counts().get("done") == 2, what="a good map again")
        wait_for(lambda: d.status().get("health_error") is None and "health error cleared" in d.log(), what="the health error cleared")
        assert not record.exists()
    finally:
        assert d.stop() == 0


def test_once_with_a_model_that_predicts_one_value_everywhere_writes_nothing(tmp_path):
    from onnx_models import constant_model

    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    done = run_once(str(tmp_path / "a.jpg"), "--model", str(constant_model(tmp_path / "c.onnx")), "--profile", "midas-v21-small", cwd=tmp_path)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "a.jpg" in line]
    assert len(lines) == 1 and "the model returned the same value (0.5) at every pixel of a frame that is not one flat colour" in lines[0], done.stderr
    assert not (tmp_path / "a_depth.jpg").exists()


# -- a model fixed after a failed load --------------------------------------------------------------


def test_a_model_fixed_after_a_failed_load_is_picked_up_by_a_save_or_a_sighup(tmp_path, tiny_model):
    import signal

    import yaml
    from onnx_models import brightness_model

    d = DaemonProcess(tmp_path, tiny_model).start()
    try:
        for name, nudge in (("b.onnx", "save"), ("c.onnx", "sighup")):
            model = tmp_path / name
            model.write_bytes(b"not a model yet")
            config = yaml.safe_load(d.config_path.read_text())
            config["model"]["path"] = str(model)
            write_by_rename(d.config_path, yaml.safe_dump(config).encode())
            error = wait_for(lambda: d.status().get("model_error"), what=f"{name}'s failed load in the status")
            assert error.startswith(f"cannot load model {model}"), error
            shown = subprocess.run(
                [sys.executable, "-m", "depthwatch", "status", "--status", str(d.status_path)],
                capture_output=True, text=True, timeout=60,
            )
            assert "model error:" in shown.stdout and f"cannot load model {model}" in shown.stdout, shown.stdout
            loads = d.status()["config_loads"]
            brightness_model(tmp_path / f".{name}.tmp")
            os.replace(tmp_path / f".{name}.tmp", model)  # fixed, the config unchanged
            if nudge == "save":
                write_by_rename(d.config_path, d.config_path.read_bytes())  # saved again, same text
            else:
                d.send(signal.SIGHUP)
            wait_for(lambda: d.status().get("config_loads", 0) > loads, what=f"the reload after the {nudge}")
            wait_for(lambda model=model: d.status().get("model") == str(model) and d.status().get("model_error") is None,
                     what=f"{name} in service after the {nudge}")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: provenance.read(d.watch / "depth.jpg") is not None, what="a map")
        assert provenance.read(d.watch / "depth.jpg")["model"] == "c.onnx"
    finally:
        assert d.stop() == 0


# -- sidecars and error records: only depthwatch's own are replaced or removed -----------------------


def test_sidecars_and_error_records_never_replace_or_remove_a_users_file_of_their_name(tmp_path, tiny_model):
    """shot_depth.jpg.json and bad.jpg.error.json, the user's own: they stay through a map, a failure and a fix;
    depthwatch's own sidecars and records are replaced and removed as ever."""
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.jpg"]},
        output={"template": "{stem}_depth.jpg", "sidecar": True, "error_sidecar": True},
    )
    theirs = {"shot_depth.jpg.json": '{"shot": "A001", "notes": "mine"}\n', "bad.jpg.error.json": "not even JSON\n"}
    for name, text in theirs.items():
        (d.watch / name).write_text(text)
    d.start()
    try:
        write_by_rename(d.watch / "shot.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "other.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "bad.jpg", b"this is a shot list, not a frame\n")
        write_by_rename(d.watch / "junk.jpg", b"this is a shot list, not a frame\n")
        wait_for(lambda: d.counts().get("done") == 2 and d.counts().get("failed") == 2 and idle(d), what="two maps, two failures")
        assert json.loads((d.watch / "other_depth.jpg.json").read_text())["source"] == "other.jpg"
        assert json.loads((d.watch / "junk.jpg.error.json").read_text())["source"] == "junk.jpg"
        write_by_rename(d.watch / "bad.jpg", jpeg_bytes(quadrant_frame()))  # fixed: its map lands
        write_by_rename(d.watch / "junk.jpg", jpeg_bytes(quadrant_frame()))
        write_by_rename(d.watch / "other.jpg", jpeg_bytes(quadrant_frame(160, 96, "bottom-right")))
        wait_for(lambda: d.counts().get("done") == 5 and idle(d), what="the fixed frames' maps")
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
    for name, text in theirs.items():
        assert (d.watch / name).read_text() == text, name
    assert not (d.watch / "junk.jpg.error.json").exists()  # depthwatch's own record: gone with the fix
    assert json.loads((d.watch / "other_depth.jpg.json").read_text())["source_bytes"] == (d.watch / "other.jpg").stat().st_size
    warned = [line for line in d.log().splitlines() if " WARNING " in line and "shot_depth.jpg.json" in line]
    assert len(warned) == 1 and "is not a file depthwatch wrote; not replacing it" in warned[0], warned
    assert provenance.read(d.watch / "shot_depth.jpg")["source"] == "shot.jpg"
    assert not d.temp_files()


# -- temporary files a killed depthwatch left, in the output folders too ------------------------------


def test_the_start_sweeps_dead_temporaries_from_the_output_folders_and_only_its_own(tmp_path, tiny_model):
    """A SIGKILL mid-write leaves a temporary file in out/ or in a clip's own folder: the next start removes it.

    A live writer's, a user's file that only looks like one, and anything outside the output folders stay.
    """
    dead = "999999999-0123abcd"
    live = f"{os.getpid()}-0123abcd"  # this test process: alive, like a `once` beside the daemon
    d = DaemonProcess(
        tmp_path / "flat", tiny_model, watch={"patterns": ["*.jpg", "*.mov"]},
        output={"template": "out/{stem}_depth.jpg", "clip_template": "{stem}_clips/{stem}_depth.mov"},
    )
    out, clips, other = d.watch / "out", d.watch / "A001_clips", d.watch / "other"
    files = {
        out / f".a_depth.jpg.{dead}.dwtmp": False,
        clips / f".A001_depth.mov.{dead}.dwtmp": False,
        out / f".b_depth.jpg.{live}.dwtmp": True,
        out / ".notes.dwtmp": True,  # not depthwatch's naming
        other / f".c_depth.jpg.{dead}.dwtmp": True,  # no output goes there
    }
    for path in files:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"\0" * 4096)
    d.start()
    try:
        wait_for(lambda: f"removed 1 temporary file(s) left in {clips}" in d.log(), what="the clip folder swept")
        assert f"removed 1 temporary file(s) left in {out}" in d.log()
    finally:
        assert d.stop() == 0
    assert {path: path.exists() for path in files} == files
    # Recursive: every folder below a watch folder is one a frame's output goes to.
    r = DaemonProcess(tmp_path / "deep", tiny_model, watch={"patterns": ["*.jpg"], "recursive": True}, output={"template": "{stem}_depth.jpg"})
    nested = r.watch / "shots" / "sh010" / f".f_depth.jpg.{dead}.dwtmp"
    nested.parent.mkdir(parents=True)
    nested.write_bytes(b"\0" * 4096)
    r.start()
    try:
        wait_for(lambda: not nested.exists(), what="the nested temporary file swept")
    finally:
        assert r.stop() == 0


# -- renames that take a free name only, or swap two -------------------------------------------------


def test_the_rename_primitives_on_this_system_and_without_them(tmp_path, monkeypatch):
    """renameat2 really runs here (Linux); without it (an older glibc) the fallbacks give the same ends."""
    from depthwatch import files

    if not sys.platform.startswith("linux"):
        pytest.skip("the Linux path")
    assert files._RENAMER is not None and files._RENAMER[1:] == (files.RENAME_NOREPLACE, files.RENAME_EXCHANGE, -100)
    for renamer in (files._RENAMER, None):
        monkeypatch.setattr(files, "_RENAMER", renamer)
        case = tmp_path / ("native" if renamer else "fallback")
        new, old = case / "new", case / "old"
        for folder, frame in ((new, b"new"), (old, b"old")):
            folder.mkdir(parents=True)
            (folder / "0000.png").write_bytes(frame)
        assert files.exchange(new, old) is (renamer is not None)
        assert (old / "0000.png").read_bytes() == b"new" and (new / "0000.png").read_bytes() == b"old"
        (case / "mine.txt").write_text("the user's")
        (case / "map.tmp").write_text("ours")
        try:
            files.rename_noreplace(case / "map.tmp", case / "mine.txt")
            raise AssertionError("rename_noreplace replaced a file")
        except FileExistsError:
            pass
        assert (case / "mine.txt").read_text() == "the user's" and (case / "map.tmp").read_text() == "ours"
        folder = os.open(case, os.O_RDONLY)
        try:
            files.rename_noreplace("map.tmp", "map.png", src_dir_fd=folder, dst_dir_fd=folder)
        finally:
            os.close(folder)
        assert (case / "map.png").read_text() == "ours" and not (case / "map.tmp").exists()
        assert sorted(p.name for p in case.iterdir()) == ["map.png", "mine.txt", "new", "old"]


def test_macos_gets_renameatx_np_with_its_own_flags(tmp_path, monkeypatch):
    """macOS's call is chosen by name with RENAME_EXCL / RENAME_SWAP and its AT_FDCWD (-2); here it is played by
    Linux's renameat2 with those flags translated, so what depthwatch passes is checked on a real filesystem."""
    import ctypes

    from depthwatch import files

    calls = []
    libc = ctypes.CDLL(None, use_errno=True)

    class MacLibc:
        @staticmethod
        def renameatx_np(src_fd, src, dst_fd, dst, flags):
            calls.append((src_fd, dst_fd, flags))
            linux = {files.RENAME_EXCL: files.RENAME_NOREPLACE, files.RENAME_SWAP: files.RENAME_EXCHANGE}[flags]
            at = {-2: -100}
            return libc.renameat2(at.get(src_fd, src_fd), src, at.get(dst_fd, dst_fd), dst, linux)

    assert files.choose_renamer("darwin", object()) is None  # before macOS 10.12: the fallbacks
    assert files.choose_renamer("linux", object()) is None  # glibc before 2.28
    assert files.choose_renamer("win32", MacLibc()) is None
    chosen = files.choose_renamer("darwin", MacLibc())
    assert chosen is not None and chosen[1:] == (files.RENAME_EXCL, files.RENAME_SWAP, -2)
    monkeypatch.setattr(files, "_RENAMER", chosen)
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    assert files.exchange(tmp_path / "a", tmp_path / "b") is True
    assert (tmp_path / "a").read_text() == "b"
    try:
        files.rename_noreplace(tmp_path / "a", tmp_path / "b")
        raise AssertionError("rename_noreplace replaced a file")
    except FileExistsError:
        pass
    files.rename_noreplace(tmp_path / "a", tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "c"]
    assert calls == [(-2, -2, files.RENAME_SWAP), (-2, -2, files.RENAME_EXCL), (-2, -2, files.RENAME_EXCL)]


def test_a_new_map_takes_its_free_name_only_while_it_is_free(tmp_path, tiny_model):
    """The first map of a frame lands by renameat2(RENAME_NOREPLACE): a user's file saved under that name
    between the check and the rename is never replaced. The next map replaces depthwatch's own one."""
    from daemon_process import strace_works

    why = strace_works()
    if why:
        pytest.skip(why)
    (tmp_path / "shot.jpg").write_bytes(jpeg_bytes(quadrant_frame()))
    traces = []
    for run in range(2):
        trace = tmp_path / f"trace{run}.txt"
        traces.append(trace.name)
        done = subprocess.run(
            ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=renameat2,rename,renameat", "-e", "signal=none", "-o", str(trace),
             sys.executable, "-m", "depthwatch", "once", "shot.jpg", "--model", str(tiny_model), "--profile", "midas-v21-small"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    first, second = ((tmp_path / t).read_text() for t in traces)
    into = r'renameat2\(\d+, "\.shot_depth\.jpg\.\d+(?:t\d+)?(?:h[0-9a-f]{6})?-[0-9a-f]{8}\.dwtmp", \d+, "shot_depth\.jpg", RENAME_NOREPLACE\) = 0'
    assert re.search(into, first), first[-2000:]
    assert not re.search(into, second) and re.search(r'rename(at2?)?\(.*"shot_depth\.jpg"', second), second[-2000:]
    assert provenance.read(tmp_path / "shot_depth.jpg")["source"] == "shot.jpg"


#: Seconds after onnxruntime loads by which its telemetry has looked up its collector (about 9.3 s), and a margin.
TELEMETRY_FIRST_UPLOAD_S = 15.0


def test_the_daemon_looks_up_no_host_and_leaves_nothing_in_the_users_cache_or_temp(tmp_path, tiny_model, monkeypatch):
    """onnxruntime's wheels start Microsoft's telemetry as they load (see depthwatch/__init__.py): DNS
    lookups, a device id under the cache folder, a file in $TMPDIR. The daemon switches it off itself."""
    if (why := strace_works()) is not None:
        pytest.skip(why)
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)  # the suite's own switch, not the daemon's
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    trace = tmp_path / "strace.txt"
    strace = shutil.which("strace")
    assert strace is not None
    d = DaemonProcess(tmp_path / "d", tiny_model, wrapper=(strace, "-f", "-e", "trace=socket,connect,sendto,sendmsg", "-o", str(trace)))
    started = time.monotonic()
    d.start()
    try:
        depth = d.watch / "depth.jpg"
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(depth.exists, what="the depth map")
        # onnxruntime 1.32 looks its collector up about 10 s after it loads, then every 5 s: the
        # daemon stays up past that (idle), so the trace would hold the lookups if there were any.
        time.sleep(max(0.0, started + TELEMETRY_FIRST_UPLOAD_S - time.monotonic()))
        os.kill(d.status()["pid"], signal.SIGTERM)
        assert d.proc.wait(60) == 0
    finally:
        d.close()
    calls = trace.read_text().splitlines()
    assert any("exited with 0" in line for line in calls), "strace never saw the daemon end: the trace is not working"
    internet = [line for line in calls if "AF_INET" in line or "htons(53)" in line]
    assert internet == [], internet[:5]
    assert list(temp.iterdir()) == []
    cache = Path(os.environ["XDG_CACHE_HOME"])
    assert not (cache / "Microsoft").exists(), sorted(str(p) for p in (cache / "Microsoft").rglob("*"))
