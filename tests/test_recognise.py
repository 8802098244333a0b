"""A model is run with the profile its contents call for, never one guessed from its file name.

Through the CLI as a user types it: FastDepth copied to `depth.onnx` (or saved
under a MiDaS file name) runs as FastDepth, and a model nobody can recognise is
refused with the profiles to choose from, exit 78, before any map is written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import quadrant_frame
from onnx import TensorProto
from onnx_models import brightness_model

from depthwatch.model.profiles import PROFILES

PROFILE_LIST = ", ".join(sorted(PROFILES))


def depthwatch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def fastdepth_like(path: Path) -> Path:
    """FastDepth's I/O (uint8 NHWC 224x224 in, [1,224,224,1] out) with brightness as its "depth" (larger = farther)."""
    return brightness_model(path, layout="NHWC", dtype=TensorProto.UINT8, size=(224, 224), output="1HW1")


def frame_file(folder: Path) -> Path:
    path = folder / "frame.png"
    cv2.imwrite(str(path), quadrant_frame(160, 96, "top-left"))
    return path


def top_left_is_bright(depth_path: Path) -> bool:
    depth = cv2.imread(str(depth_path), cv2.IMREAD_GRAYSCALE)
    h, w = depth.shape[0] // 2, depth.shape[1] // 2
    return depth[:h, :w].mean() > depth[h:, w:].mean()


def test_a_fastdepth_graph_renamed_to_depth_onnx_runs_as_fastdepth_not_inverted(tmp_path):
    model = fastdepth_like(tmp_path / "depth.onnx")
    frame = frame_file(tmp_path)

    done = depthwatch(tmp_path, "once", str(frame), "--model", str(model))

    assert done.returncode == 0, done.stderr
    assert "depth.onnx: profile fastdepth-nyu, recognised by its graph" in done.stderr
    # The model's output is larger where the frame is bright; for FastDepth larger is
    # farther, so the bright corner must come out dark (white = near). The generic
    # MiDaS guess would make it white: an inverted map without a word.
    assert not top_left_is_bright(tmp_path / "frame_depth.jpg")


def test_the_real_fastdepth_under_other_names_is_recognised_by_its_checksum(tmp_path, fastdepth):
    from skimage import data

    photo = tmp_path / "photo.jpg"
    cv2.imwrite(str(photo), data.astronaut()[:, :, ::-1])
    named = depthwatch(tmp_path, "once", str(photo), "--model", str(fastdepth), "--profile", "fastdepth-nyu", "-o", "named.png")
    assert named.returncode == 0, named.stderr
    for name in ("depth.onnx", "model-small.onnx"):
        copy = tmp_path / name
        shutil.copyfile(fastdepth, copy)

        checked = depthwatch(tmp_path, "check", "--model", str(copy))
        done = depthwatch(tmp_path, "once", str(photo), "--model", str(copy), "-o", f"{copy.stem}.png")

        assert checked.returncode == 0, checked.stderr
        assert "(profile fastdepth-nyu, loaded in" in checked.stdout
        assert f"{name}: profile fastdepth-nyu, recognised by its checksum" in checked.stderr
        assert done.returncode == 0, done.stderr
        # The same pixels; the bytes differ by the provenance record, which names the model file.
        made = cv2.imread(str(tmp_path / f"{copy.stem}.png"), cv2.IMREAD_UNCHANGED)
        assert np.array_equal(made, cv2.imread(str(tmp_path / "named.png"), cv2.IMREAD_UNCHANGED))


@pytest.mark.parametrize("command", ["once", "check", "run"])
def test_a_model_nobody_recognises_is_refused_with_the_profiles_to_choose_from(tmp_path, command):
    model = brightness_model(tmp_path / "depth.onnx")  # float NCHW 32x32: no known model's graph
    frame = frame_file(tmp_path)
    args = {"once": ["once", str(frame)], "check": ["check"], "run": ["run", "--watch", str(tmp_path)]}[command]

    done = depthwatch(tmp_path, *args, "--model", str(model))

    assert done.returncode == 78
    assert done.stderr.splitlines()[-1] == (
        f"depthwatch: cannot tell which profile model depth.onnx needs: its graph (input 'image' float32 NCHW 32x32 -> "
        f"output 'depth' [1x32x32]) is not one depthwatch knows; name one with --profile NAME or model.profile "
        f"({PROFILE_LIST}); a guess could invert the map"
    )
    assert "ready" not in done.stderr
    assert not (tmp_path / "frame_depth.jpg").exists() and not (tmp_path / "depth.jpg").exists()

    named = depthwatch(tmp_path, *args[:2], "--model", str(model), "--profile", "midas-v21-small") if command == "once" else None
    if named is not None:
        assert named.returncode == 0, named.stderr
        assert top_left_is_bright(tmp_path / "frame_depth.jpg")


def test_a_graph_several_profiles_fit_takes_the_file_name_or_asks(tmp_path):
    frame = frame_file(tmp_path)
    large = brightness_model(tmp_path / "model-f6b98070.onnx", size=(384, 384))
    anonymous = tmp_path / "mine.onnx"
    shutil.copyfile(large, anonymous)

    by_name = depthwatch(tmp_path, "check", "--model", str(large))
    asked = depthwatch(tmp_path, "once", str(frame), "--model", str(anonymous))

    assert by_name.returncode == 0, by_name.stderr
    assert "model-f6b98070.onnx: profile midas-v21-large, recognised by its file name and graph" in by_name.stderr
    assert asked.returncode == 78
    assert "its graph (input 'image' float32 NCHW 384x384 -> output 'depth' [1x384x384]) fits midas-v21-large, dpt-hybrid, dpt-large" in asked.stderr


def test_a_file_name_never_overrides_the_graph(tmp_path):
    frame = frame_file(tmp_path)
    model = fastdepth_like(tmp_path / "model-small.onnx")  # named like MiDaS small, built like FastDepth

    done = depthwatch(tmp_path, "once", str(frame), "--model", str(model))

    assert done.returncode == 0, done.stderr
    assert "model-small.onnx is named like a midas-v21-small model but its graph is fastdepth-nyu's" in done.stderr
    assert not top_left_is_bright(tmp_path / "frame_depth.jpg")


def test_a_model_in_the_config_without_a_profile_is_refused_the_same_way(tmp_path):
    brightness_model(tmp_path / "depth.onnx")
    config = tmp_path / "depthwatch.yaml"
    config.write_text("model:\n  path: depth.onnx\n", encoding="utf-8")

    refused = depthwatch(tmp_path, "check", "-c", str(config))
    config.write_text("model:\n  path: depth.onnx\n  profile: midas-v21-small\n", encoding="utf-8")
    named = depthwatch(tmp_path, "check", "-c", str(config))

    assert refused.returncode == 78 and "--profile NAME or model.profile" in refused.stderr
    assert named.returncode == 0, named.stderr
    assert named.stdout.splitlines()[-1] == "ok"
