"""The command line as a user types it: overrides are checked like the file, `once` names outputs like the daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
from conftest import quadrant_frame

from depthwatch.errors import EX_CONFIG


def depthwatch(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "depthwatch", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_a_bad_command_line_override_is_refused_at_start_like_a_bad_config(tmp_path: Path, tiny_model: Path) -> None:
    watch = tmp_path / "watch"
    watch.mkdir()
    common = ["run", "--watch", str(watch), "--model", str(tiny_model), "--profile", "midas-v21-small"]
    done = depthwatch(*common, "--output", "x.txt")
    assert done.returncode == EX_CONFIG
    assert done.stderr.strip().splitlines()[-1] == (
        "depthwatch: --output: output.template 'x.txt' must end in .jpg, .png, .tif or .exr (or {ext} for the frame's own)"
    )
    done = depthwatch(*common[:-2], "--profile", "midas-v21-smal")
    assert done.returncode == EX_CONFIG
    assert "--profile: model.profile must be one of" in done.stderr and "did you mean 'midas-v21-small'?" in done.stderr
    done = depthwatch(*common, "--watch", str(tmp_path / "no" / "such" / "folder"))
    assert done.returncode == EX_CONFIG
    assert "--watch: watch.folders" in done.stderr and "does not exist, nor does its parent" in done.stderr


def test_once_takes_every_frame_in_a_folder_and_skips_only_its_own_outputs(tmp_path: Path, tiny_model: Path) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    for name in ("shot_depth_of_field.jpg", "a.jpg"):
        cv2.imwrite(str(frames / name), quadrant_frame())
    args = ["once", str(frames), "--model", str(tiny_model), "--profile", "midas-v21-small"]
    first = depthwatch(*args)
    assert first.returncode == 0, first.stderr
    made = sorted(p.name for p in frames.iterdir())
    assert made == ["a.jpg", "a_depth.jpg", "shot_depth_of_field.jpg", "shot_depth_of_field_depth.jpg"]
    again = depthwatch(*args)  # its own outputs are not frames: no a_depth_depth.jpg
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in frames.iterdir()) == made


def test_once_refuses_to_write_a_map_over_its_frame(tmp_path: Path, tiny_model: Path) -> None:
    frame = tmp_path / "a.jpg"
    cv2.imwrite(str(frame), quadrant_frame())
    before = frame.read_bytes()
    done = depthwatch("once", str(frame), "-o", str(frame), "--model", str(tiny_model), "--profile", "midas-v21-small")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"depthwatch: {frame}: its output would overwrite the frame itself; change output.template"]
    assert frame.read_bytes() == before
