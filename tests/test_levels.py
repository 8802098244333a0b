"""Levels as in a grading tool: exact grey levels for known maps, and float output without quantisation."""

from __future__ import annotations

import subprocess
import sys

import cv2
import numpy as np
import pytest
import yaml
from conftest import write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch.imaging import codec, render
from depthwatch.imaging.levels import Level, Levels, apply, parse_level
from depthwatch.imaging.render import RenderOptions

EX_CONFIG = 78
RAMP = np.array([[0.0, 0.25, 0.5, 0.75, 1.0]], np.float32)


def grey(levels: Levels, bits: int = 8, n: np.ndarray = RAMP) -> np.ndarray:
    return render.render(n, (n.shape[1], n.shape[0]), RenderOptions(bits=bits, refine="none", levels=levels))


def test_default_levels_leave_the_map_as_it_is():
    np.testing.assert_array_equal(grey(Levels()), [[0, 64, 128, 191, 255]])
    assert apply(RAMP, Levels()) is RAMP


def test_near_far_and_gamma_give_the_expected_grey_levels():
    levels = Levels(near=Level(0.75), far=Level(0.25), gamma=2.0)
    # (0.5 - 0.25) / 0.5 = 0.5, lifted by gamma 2 to 0.5 ** 0.5 = 0.70711.
    np.testing.assert_array_equal(grey(levels), [[0, 0, 180, 255, 255]])  # 0.70711 * 255 + 0.5 = 180.8
    np.testing.assert_array_equal(grey(levels, 16), [[0, 0, 46340, 65535, 65535]])  # * 65535 + 0.5 = 46340.7
    np.testing.assert_array_equal(grey(Levels(gamma=0.5)), [[0, 16, 64, 143, 255]])  # x ** 2
    np.testing.assert_array_equal(grey(Levels(near=Level(0.5))), [[0, 128, 255, 255, 255]])


def test_invert_swaps_black_and_white_after_the_levels():
    levels = Levels(near=Level(0.75), far=Level(0.25), gamma=2.0, invert=True)
    np.testing.assert_array_equal(grey(levels), [[255, 255, 75, 0, 0]])  # (1 - 0.70711) * 255 + 0.5 = 75.2
    np.testing.assert_array_equal(grey(Levels(invert=True)), [[255, 191, 128, 64, 0]])


def test_near_at_point_eight_clips_the_nearest_fifth_to_white():
    n = np.linspace(0, 1, 1001, dtype=np.float32).reshape(1, -1)
    v = grey(Levels(near=Level(0.8)), 32, n)
    assert v.dtype == np.float32
    white = v == 1.0
    np.testing.assert_array_equal(white, n >= np.float32(0.8))
    assert white.sum() == 201  # 0.800 .. 1.000: the nearest 20 % of the range
    assert v[~white].max() < 1.0
    np.testing.assert_allclose(v[~white], n[~white] / 0.8, rtol=1e-6)


def test_percentile_levels_follow_the_frames_pixels():
    n = (np.random.default_rng(3).random((100, 100)) ** 3).astype(np.float32)  # most pixels far
    v = grey(Levels(near=parse_level("80%"), far=parse_level("10%")), 32, n)
    assert abs((v == 1.0).mean() - 0.20) <= 0.0001  # the nearest 20 % of the pixels are white
    assert abs((v == 0.0).mean() - 0.10) <= 0.0001  # the farthest 10 % black
    assert Level(0.8).setting == 0.8 and parse_level("80%").setting == "80%"


def test_levels_are_applied_before_the_upscale_and_keep_edges_clean():
    n = np.array([[0.0, 1.0]], np.float32)
    v = render.render(n, (8, 1), RenderOptions(bits=8, refine="none", levels=Levels(near=Level(0.5))))
    assert v.shape == (1, 8) and v[0, 0] == 0 and v[0, -1] == 255
    assert np.all(np.diff(v.astype(int)) >= 0)  # a monotone step, no overshoot


# -- float output ---------------------------------------------------------------------------------


def test_float_tiff_round_trips_the_map_exactly():
    n = cv2.GaussianBlur(np.random.default_rng(4).random((224, 224)).astype(np.float32), (0, 0), 3)
    n = (n - n.min()) / (n.max() - n.min())
    options = RenderOptions(bits=codec.bits_for(".tif", 32), refine="none", levels=Levels(gamma=1.7))
    depth = render.render(n, (640, 360), options)
    assert depth.dtype == np.float32
    back = cv2.imdecode(np.frombuffer(codec.encode(depth, ".tif"), np.uint8), cv2.IMREAD_UNCHANGED)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, depth)
    # Not quantised: far more distinct values than 16 bits would leave on this map.
    on_grid = np.abs(back * 65535 - np.round(back * 65535)) < 1e-3
    assert on_grid.mean() < 0.01


# -- through the daemon and the command line ------------------------------------------------------


def ramp_frame(width: int = 320, height: int = 96) -> bytes:
    """Brightness (= nearness for the tiny model) rising left to right."""
    row = np.linspace(0, 255, width).astype(np.uint8)
    frame = np.repeat(np.repeat(row[None, :, None], height, axis=0), 3, axis=2)
    return cv2.imencode(".png", frame)[1].tobytes()


def middle(path) -> float:
    depth = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    return float(depth[40:56, 150:170].mean()) / 65535


def test_a_live_reload_changes_the_levels_for_the_next_frame_and_a_bad_extension_is_refused(tmp_path, tiny_model):
    d = DaemonProcess(
        tmp_path,
        tiny_model,
        watch={"patterns": ["frame.png"]},
        output={"template": "depth.png", "refine": "none"},
    ).start()
    try:
        write_by_rename(d.watch / "frame.png", ramp_frame())
        out = d.watch / "depth.png"
        wait_for(lambda: out.exists(), what="the first map")
        before = middle(out)
        assert 0.4 < before < 0.6

        config = yaml.safe_load(d.config_path.read_text())
        config["output"]["gamma"] = 2.0
        write_by_rename(d.config_path, yaml.safe_dump(config).encode())
        wait_for(lambda: d.status().get("config_loads") == 2, what="the reload")
        out.unlink()
        write_by_rename(d.watch / "frame.png", ramp_frame())
        wait_for(lambda: out.exists(), what="the map after the reload")
        assert middle(out) == pytest.approx(before**0.5, abs=0.02)

        config["output"]["template"] = "depth.bmp"
        write_by_rename(d.config_path, yaml.safe_dump(config).encode())
        wait_for(lambda: d.status().get("config_error"), what="the bad template to be refused")
        assert "output.template 'depth.bmp' must end in .jpg, .png, .tif or .exr" in d.status()["config_error"]
        out.unlink()
        write_by_rename(d.watch / "frame.png", ramp_frame())
        wait_for(lambda: out.exists(), what="a map on the last good config")
        assert middle(out) == pytest.approx(before**0.5, abs=0.02)
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0


def test_once_takes_near_far_and_gamma(tmp_path, tiny_model):
    source = tmp_path / "ramp.png"
    source.write_bytes(ramp_frame())

    def once(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "depthwatch", "once", str(source), "-o", str(tmp_path / "out.png"),
             "--model", str(tiny_model), "--profile", "midas-v21-small", *flags],
            capture_output=True, text=True, timeout=120,
        )

    assert once("--refine", "none").returncode == 0
    plain = middle(tmp_path / "out.png")
    done = once("--refine", "none", "--near", "0.75", "--far", "25%", "--gamma", "2")
    assert done.returncode == 0, done.stderr
    depth = cv2.imread(str(tmp_path / "out.png"), cv2.IMREAD_UNCHANGED)
    assert middle(tmp_path / "out.png") > plain + 0.1
    assert depth[:, -20:].min() == 65535 and depth[:, :20].max() == 0

    bad = once("--near", "2")
    assert bad.returncode == EX_CONFIG
    assert bad.stderr.strip() == "depthwatch: --near: output.near must be a fraction between 0 and 1 (or a percentile like '80%'), not 2"
    crossed = once("--near", "0.2", "--far", "0.5")
    assert crossed.returncode == EX_CONFIG and "output.near (0.2) must be above output.far (0.5)" in crossed.stderr


def test_the_pipeline_writes_float_tiff_without_quantising(tmp_path, tiny_model):
    from depthwatch.frames.job import Job
    from depthwatch.frames.pipeline import Pipeline
    from depthwatch.frames.settings import Settings
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    source = tmp_path / "ramp.png"
    source.write_bytes(ramp_frame())
    levels = Levels(near=Level(0.9), gamma=1.3)
    spec = ModelSpec(path=tiny_model, profile=PROFILES["midas-v21-small"], providers=("cpu",))
    with Engine(spec) as engine:
        pipeline = Pipeline(engine)
        for name, bits in (("depth.tif", 32), ("depth.png", 16)):
            settings = Settings(render=RenderOptions(levels=levels), png_bits=bits)
            assert pipeline.process(Job(source, tmp_path / name), settings).ok
        pipeline.close()
    floats = cv2.imread(str(tmp_path / "depth.tif"), cv2.IMREAD_UNCHANGED)
    sixteen = cv2.imread(str(tmp_path / "depth.png"), cv2.IMREAD_UNCHANGED)
    assert floats.dtype == np.float32 and floats.shape == sixteen.shape == (96, 320)
    assert 0.0 <= floats.min() and floats.max() == 1.0  # levels applied: near 0.9 and above is white
    # The same map, the 16-bit one rounded to its grid; the float one off that grid.
    assert np.abs(floats - sixteen / 65535).max() <= 1.5 / 65535
    assert (np.abs(floats * 65535 - np.round(floats * 65535)) > 1e-3).mean() > 0.5
