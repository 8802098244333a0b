"""A user's own files and folders, against the real daemon, `once` and the HTTP API.

depthwatch replaces only files it made itself (their provenance record says
so), and writes a frame's map only into the folder that frame was read from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

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

    model = slow_model(tmp_path / "slow.onnx", layers=400, size=256)  # about a second per frame on the CPU provider
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

        # Three runs of a model of a second or more (many more on a loaded machine): a generous wait.
        wait_for(lambda: len(refused() | written_before_the_swap()) == 3 and idle(d), timeout=240, what="each frame refused or done")
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

    model = slow_model(tmp_path / "slow.onnx", layers=400, size=256)  # a second or more in the model
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
