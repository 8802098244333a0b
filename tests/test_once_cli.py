"""`depthwatch once` as people and scripts type it: paths from the current folder, typos, a summary line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
from conftest import quadrant_frame


def once(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run as a script does: stdout and stderr are pipes, not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args, "--profile", "midas-v21-small"],
        capture_output=True, text=True, cwd=cwd, timeout=120, check=False,
    )


def frames(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        cv2.imwrite(str(folder / name), quadrant_frame())
    return [folder / name for name in names]


def test_a_relative_output_is_taken_from_the_current_folder(tmp_path, tiny_model):
    frames(tmp_path / "shots", "a.jpg", "b.jpg")
    (tmp_path / "maps").mkdir()

    to_folder = once(tmp_path, "shots", "-o", "maps", "--model", str(tiny_model))
    to_template = once(tmp_path, "shots/a.jpg", "-o", "out/{stem}.png", "--model", str(tiny_model))
    by_name = once(tmp_path, "shots/b.jpg", "-o", "{stem}_map.png", "--model", str(tiny_model))

    for done in (to_folder, to_template, by_name):
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["a_depth.jpg", "b_depth.jpg"]
    assert (tmp_path / "out" / "a.png").is_file()
    assert not (tmp_path / "shots" / "out").exists() and not (tmp_path / "shots" / "maps").exists()
    assert (tmp_path / "shots" / "b_map.png").is_file()  # a bare name template: beside each input


def test_a_mistyped_path_is_no_such_file_and_fails_before_the_model_loads(tmp_path):
    frames(tmp_path / "shots", "a.jpg")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")  # loading it would fail with exit 78 first

    done = once(tmp_path, "shots/a.jpg", "shots/frame.jpg", "nofolder", "--model", str(broken))

    assert done.returncode == 66
    assert done.stderr == "depthwatch: no such file or folder: shots/frame.jpg, nofolder; check the path\n"
    assert done.stdout == ""
    assert not (tmp_path / "shots" / "a_depth.jpg").exists()


def test_a_script_gets_one_summary_line(tmp_path, tiny_model):
    frames(tmp_path / "shots", "a.jpg", "b.jpg", "c.jpg")

    done = once(tmp_path, "shots", "--model", str(tiny_model))

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("3 depth maps written, 0 failed, in "), done.stdout
    assert lines[0].endswith(" s")


def test_the_summary_counts_failures_too(tmp_path, tiny_model):
    frames(tmp_path / "shots", "a.jpg")
    (tmp_path / "shots" / "b.jpg").write_bytes(b"not an image")

    done = once(tmp_path, "shots", "--model", str(tiny_model))

    assert done.returncode == 1
    assert done.stdout.startswith("1 depth map written, 1 failed, in ")
    assert "b.jpg" in done.stderr


def test_two_frames_that_map_to_one_output_are_refused_before_anything_is_written(tmp_path, tiny_model):
    """`A.0001.jpg` and `A.0001.tif` under `{stem}_depth.jpg`: one map would replace the other.

    Refused as a whole, with one line naming both frames, before the model
    loads (the broken model would exit 78 first) and before any map is written.
    """
    shots = tmp_path / "shots"
    frames(shots, "A.0001.jpg", "A.0001.tif", "B.0001.jpg")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")

    done = once(tmp_path, "shots", "--model", str(broken))

    assert done.returncode == 78, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "A.0001.jpg" in lines[0] and "A.0001.tif" in lines[0] and "A.0001_depth.jpg" in lines[0], lines
    assert done.stdout == ""
    assert sorted(p.name for p in shots.iterdir()) == ["A.0001.jpg", "A.0001.tif", "B.0001.jpg"]

    by_name = once(tmp_path, "shots", "-o", "{name}_depth.png", "--model", str(tiny_model))

    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout.startswith("3 depth maps written, 0 failed, in ")
