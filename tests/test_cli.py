"""The command line as a user types it: overrides are checked like the file, `once` names outputs like the daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
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


def _imported_after(argv: list[str]) -> set[str]:
    """The modules a `depthwatch ARGV` process has loaded once its parser is built and its arguments read."""
    probe = (
        "import sys\n"
        "from depthwatch import cli\n"
        f"try:\n    cli.build_parser({argv!r}).parse_args({argv!r})\n"
        "except SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_a_subcommand_imports_only_its_own_module_and_every_name_is_still_known() -> None:
    commands = {f"depthwatch.commands.{name}" for name in ("run", "once", "worker", "check", "status", "models", "service")}
    status = _imported_after(["status", "--status", "nowhere.json"])
    assert commands & status == {"depthwatch.commands.status"}
    assert "numpy" not in status and "cv2" not in status  # what run, once, worker and check bring in
    run = _imported_after(["run", "--help"])
    assert commands & run == {"depthwatch.commands.run"}
    # Named nothing (the help that lists them all), every module is read for its line.
    assert commands <= _imported_after(["--help"])
    listed = depthwatch("--help")
    assert listed.returncode == 0
    for name in ("run", "once", "worker", "check", "status", "models", "service"):
        assert f"    {name} " in listed.stdout, listed.stdout
    wrong = depthwatch("stauts")
    assert wrong.returncode == 2
    assert "invalid choice: 'stauts' (choose from 'run', 'once', 'worker', 'check', 'status', 'models', 'service')" in wrong.stderr


def _threads_after_numpy(prelude: str, env: dict[str, str]) -> int:
    probe = f"{prelude}\nimport os, numpy\nprint(len(os.listdir('/proc/self/task')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts a process's threads in /proc (Linux)")
def test_numpys_blas_starts_no_threads_in_depthwatch_unless_the_user_asks() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    assert _threads_after_numpy("import depthwatch.cli", env) == 1
    if (os.cpu_count() or 1) > 1:  # the user's own setting wins
        assert _threads_after_numpy("import depthwatch.cli", {**env, "OPENBLAS_NUM_THREADS": "2"}) == 2
