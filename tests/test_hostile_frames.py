"""Frames and requests shaped to hurt: a thin strip, a map no JPEG can hold, a name no file can have,
a folder under a frame's name, a body exactly at the API's limit. Each against the real daemon,
command or listener: one line (or the work done), the daemon alive, its memory small."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for
from onnx_models import brightness_model

from depthwatch.imaging.stabilise import motion
from depthwatch.model.contract import MAX_ASPECT, Contract, model_input_size
from depthwatch.model.profiles import PROFILES

#: A hostile strip: 1 x 70000 pixels, 0.07 megapixels, far under daemon.max_megapixels.
STRIP = 70_000
#: The daemon's peak resident memory with such a strip mapped stays under this (unbounded, it grows past 3 GB).
PEAK_RSS = 1 << 30


def strip_png(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng((width, height, seed))
    ok, buf = cv2.imencode(".png", rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " ERROR " in line]


def idle(d: DaemonProcess) -> bool:
    status = d.status()
    return status.get("queue_depth") == 0 and status.get("in_progress") == 0


def held_small(d: DaemonProcess, condition):
    """`condition`, waited for while the daemon's peak memory is watched: one over PEAK_RSS is
    killed at once (a strip that grows it does so by gigabytes a second), and the test fails."""

    def check():
        peak = d.peak_rss()
        if peak > PEAK_RSS:
            d.kill()
            raise AssertionError(f"the daemon's peak RSS reached {peak / 2**20:.0f} MiB")
        return condition()

    return check


# -- every size derived from a frame is bounded --------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "thumb"),
    [((1, STRIP), (1, motion.THUMB_HEIGHT)), ((STRIP, 1), (motion.THUMB_WIDTH, 1)), ((1, 1), (160, 160)), ((9, 100_000), (1, 640))],
)
def test_a_thumbnail_fits_its_box_whatever_the_frames_shape(size, thumb):
    """Bounded by both sides: at most THUMB_WIDTH x THUMB_HEIGHT (102,400) pixels, where a strip's
    thumbnail 160 wide would be 11.2 million rows."""
    w, h = size
    tw, th = motion.thumbnail_size(w, h)
    assert (tw, th) == thumb
    assert 1 <= tw <= motion.THUMB_WIDTH and 1 <= th <= motion.THUMB_HEIGHT
    assert motion.thumbnail(np.zeros((h, w, 3), np.uint8)).shape == (th, tw, 3)


def test_a_frame_of_ordinary_shape_keeps_its_thumbnail():
    assert motion.thumbnail_size(1920, 1080) == (160, 90)
    assert motion.thumbnail_size(1080, 1920) == (160, 284)
    assert motion.thumbnail_size(3840, 1600) == (160, 67)
    assert motion.thumbnail_size(64, 48) == (160, 120)  # small frames scaled up to the box, as the flow's units want


def test_a_strips_model_input_fits_the_box_and_an_ordinary_frame_keeps_its_own():
    profile = PROFILES["midas-v21-small"]  # a dynamic model's side: 256, multiples of 32
    dynamic = Contract("image", np.float32, "NCHW", None, None, "depth", (1, "h", "w"))
    for frame in ((1, STRIP), (STRIP, 1), (1, 1)):
        w, h = model_input_size(dynamic, profile, frame)
        assert max(w, h) <= MAX_ASPECT * 256 and min(w, h) <= 256, (frame, w, h)
    assert model_input_size(dynamic, profile, (1920, 1080)) == (448, 256)
    assert model_input_size(dynamic, profile, (6000, 1000)) == (1536, 256)  # a 6:1 panorama keeps its aspect


def test_the_flow_on_thumbnails_too_small_for_it_is_no_motion_and_never_ends_the_process():
    """The cut test's flow (DIS medium at level 1) ends the process on a thumbnail 12-15 pixels
    high: a 2000 x 160 frame's. Run apart, so a crash fails this test and not the suite."""
    code = textwrap.dedent(
        """
        import numpy as np
        from depthwatch.imaging.stabilise import motion
        rng = np.random.default_rng(1)
        for h in (1, 7, 12, 13, 15):
            a, b = (rng.integers(0, 256, (h, 160, 3), dtype=np.uint8) for _ in range(2))
            assert motion.measure(a, b, live=True) is None and motion.measure(a, b) is None, h
        a, b = (rng.integers(0, 256, (16, 160, 3), dtype=np.uint8) for _ in range(2))
        assert motion.measure(a, b, live=True) is not None
        print("held")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "held", (done.returncode, done.stderr[-2000:])


@pytest.fixture
def dynamic_model(tmp_path: Path) -> Path:
    """The brightness model with a dynamic height and width: its input follows the frame's aspect."""
    return brightness_model(tmp_path / "dynamic.onnx", size=None)


@pytest.mark.parametrize("normalise", ["stable", "frame"])
def test_a_thin_strip_is_mapped_with_little_memory(tmp_path, dynamic_model, normalise):
    d = DaemonProcess(
        tmp_path, dynamic_model, providers=["cpu"],
        watch={"patterns": ["*.png"]},
        output={"template": "{stem}_depth.png", "normalise": normalise, "refine": "edges", "error_sidecar": True},
    ).start()
    try:
        for name, (w, h) in (("tall.png", (1, STRIP)), ("wide.png", (STRIP, 1)), ("band.png", (2000, 156))):
            write_by_rename(d.watch / name, strip_png(w, h))
        # A second version of the band: its thumbnail (160 x 12) against the first's, through the cut test.
        wait_for(held_small(d, lambda: (d.watch / "band_depth.png").exists()), what="the band's map")
        write_by_rename(d.watch / "band.png", strip_png(2000, 156, seed=1))
        wait_for(held_small(d, lambda: d.counts().get("done", 0) + d.counts().get("failed", 0) >= 4 and idle(d)), what="four maps")
        counts, peak = d.counts(), d.peak_rss()
        assert d.proc.poll() is None
    finally:
        stopped = d.stop()  # killed already if it grew too large: that failure is the one to see
    assert stopped == 0
    print(f"peak RSS {peak / 2**20:.0f} MiB")
    assert peak < PEAK_RSS
    assert counts.get("done") == 4 and not counts.get("failed"), (counts, error_lines(d))
    for name, (w, h) in (("tall_depth.png", (1, STRIP)), ("wide_depth.png", (STRIP, 1)), ("band_depth.png", (2000, 156))):
        depth = cv2.imread(str(d.watch / name), cv2.IMREAD_UNCHANGED)
        assert depth is not None and depth.shape == (h, w), (name, None if depth is None else depth.shape)
    assert not d.temp_files()


# -- a map no JPEG can hold --------------------------------------------------------------------------------


def test_a_frame_taller_than_a_jpeg_can_be_gets_one_line_before_the_model(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.png"]}, output={"template": "{stem}_depth.jpg", "error_sidecar": True}
    ).start()
    try:
        write_by_rename(d.watch / "tall.png", strip_png(1, STRIP))
        wait_for(lambda: d.counts().get("failed") == 1, what="the tall frame refused")
        write_by_rename(d.watch / "frame.png", strip_png(64, 48))
        wait_for(lambda: d.counts().get("done") == 1 and idle(d), what="a frame after it mapped")
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
    lines = error_lines(d)
    assert len(lines) == 1, lines
    assert lines[0].endswith(
        f"tall.png: its map would be 1 x {STRIP} px, taller than a JPEG can be (65,535): "
        "choose a PNG or TIFF output.template (or once -o)"
    ), lines
    assert "internal error" not in d.log() and "Traceback" not in d.log()
    assert not (d.watch / "tall_depth.jpg").exists() and not d.temp_files()
    assert (d.watch / "tall.png.error.json").is_file()


def test_once_refuses_a_jpeg_map_taller_or_wider_than_a_jpeg_can_be_in_one_line(tmp_path, tiny_model):
    (tmp_path / "tall.png").write_bytes(strip_png(1, STRIP))
    (tmp_path / "wide.png").write_bytes(strip_png(STRIP, 1))
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", "tall.png", "wide.png", "-o", "{stem}_depth.jpg",
         "--model", str(tiny_model), "--profile", "midas-v21-small"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode != 0, done.stderr
    assert f"tall.png: its map would be 1 x {STRIP} px, taller than a JPEG can be (65,535)" in done.stderr, done.stderr
    assert f"wide.png: its map would be {STRIP} x 1 px, wider than a JPEG can be (65,535)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".onnx")) == ["tall.png", "wide.png"]


# -- the API ---------------------------------------------------------------------------------------------------


HTTP_TIMEOUT = 60


@pytest.fixture
def requests():
    """The HTTP client, and the API's server: both come with the `api` extra."""
    pytest.importorskip("waitress")
    return pytest.importorskip("requests")


def test_the_api_answers_a_map_no_jpeg_can_hold_with_a_4xx_and_one_line(api_daemon, requests):
    d = api_daemon(watch={"patterns": ["*.png"]}, output={"template": "{stem}_depth.jpg"})
    post = lambda **kw: requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT, **kw)  # noqa: E731
    tall = strip_png(1, STRIP)
    answer = post(data=tall, headers={"Content-Type": "image/png"})
    assert answer.status_code == 422, (answer.status_code, answer.text)
    assert answer.text == (
        f"the image/png body cannot be used: its map would be 1 x {STRIP} px, taller than a JPEG can be (65,535): "
        "ask for format=png\n"
    )
    answer = post(params={"format": "png"}, data=tall, headers={"Content-Type": "image/png"})
    assert answer.status_code == 200, answer.text
    assert cv2.imdecode(np.frombuffer(answer.content, np.uint8), cv2.IMREAD_UNCHANGED).shape == (STRIP, 1)

    write_by_rename(d.watch / "tall.png", tall)
    wait_for(lambda: d.counts().get("failed") == 1, what="the watcher to refuse the tall frame")
    answer = post(params={"frame": "tall.png"})
    assert answer.status_code == 422, (answer.status_code, answer.text)
    assert "tall.png: its map would be 1 x 70000 px, taller than a JPEG can be" in answer.text
    assert "internal error" not in d.log() and "Traceback" not in d.log()
    assert d.proc.poll() is None


def test_the_api_refuses_a_frame_name_no_file_can_have_in_one_line(api_daemon, requests):
    d = api_daemon()
    post = lambda **kw: requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT, **kw)  # noqa: E731
    for name in ("a" * 252 + ".png", "sub/" + "b" * 300 + ".png"):
        answer = post(params={"frame": name})
        assert answer.status_code == 403, (len(name), answer.status_code, answer.text)
        assert answer.text.count("\n") == 1, answer.text
        assert "is not a file name: a name in it is 256 bytes" in answer.text or "304 bytes" in answer.text, answer.text
    answer = post(params={"frame": "/".join(["c" * 200] * 30) + ".png"})  # each name fits, the path does not
    assert answer.status_code == 403 and answer.text.count("\n") == 1, (answer.status_code, answer.text[-200:])
    assert "internal error" not in d.log() and "Traceback" not in d.log()
    assert d.proc.poll() is None


def _png_of_exactly(size: int) -> bytes:
    """A real PNG of exactly `size` bytes: a small frame with a tEXt chunk that pads it out."""
    png = cv2.imencode(".png", quadrant_frame(64, 48))[1].tobytes()
    pad = size - len(png) - 12
    assert pad >= 0
    chunk = b"tEXt" + b"pad\x00" + b"x" * (pad - 4)
    chunk = len(chunk[4:]).to_bytes(4, "big") + chunk + zlib.crc32(chunk).to_bytes(4, "big")
    iend = png.rindex(b"IEND") - 4
    out = png[:iend] + chunk + png[iend:]
    assert len(out) == size
    return out


def test_a_body_of_exactly_max_body_mb_is_taken_and_one_byte_more_is_refused(api_daemon, requests):
    limit = 65_536
    d = api_daemon(api={"max_body_mb": limit / 2**20})
    post = lambda data: requests.post(  # noqa: E731
        f"{d.url}/predict", params={"format": "png"}, data=data, headers={"Content-Type": "image/png"}, timeout=HTTP_TIMEOUT
    )
    exactly = _png_of_exactly(limit)
    assert cv2.imdecode(np.frombuffer(exactly, np.uint8), cv2.IMREAD_COLOR).shape == (48, 64, 3)
    answer = post(exactly)
    assert answer.status_code == 200, (answer.status_code, answer.text)
    answer = post(_png_of_exactly(limit + 1))
    assert answer.status_code == 413, (answer.status_code, answer.text)
    assert answer.text == "the body is over api.max_body_mb (0.0625 MB); send a smaller image or raise api.max_body_mb\n"


# -- a folder is not a frame ------------------------------------------------------------------------------


def test_a_folder_under_a_frames_name_in_a_recursive_watch_is_a_folder(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["a*"], "recursive": True},
        output={"template": "{stem}_depth.png", "error_sidecar": True},
    )
    (d.watch / "a000_day1").mkdir()  # there at the start: the start-up scan meets it
    d.start()
    try:
        (d.watch / "a001_day2").mkdir()
        os.makedirs(d.watch / "elsewhere" / "a002_day3")
        os.rename(d.watch / "elsewhere" / "a002_day3", d.watch / "a002_day3")  # moved in
        write_by_rename(d.watch / "a001_day2" / "a001.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: d.counts().get("done") == 1 and idle(d), what="the frame inside the folder mapped")
        write_by_rename(d.watch / "a003.jpg", jpeg_bytes(quadrant_frame()))  # after the folders' events
        wait_for(lambda: d.counts().get("done") == 2 and idle(d), what="a frame beside the folders")
        counts = d.counts()
    finally:
        assert d.stop() == 0
    assert not counts.get("failed") and counts.get("last_error") is None, counts
    assert not error_lines(d), error_lines(d)
    assert "is a folder" not in d.log()
    assert not list(d.watch.rglob("*.error.json"))
    assert (d.watch / "a001_day2" / "a001_depth.png").is_file()
