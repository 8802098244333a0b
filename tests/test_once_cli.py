"""`depthwatch once` as people and scripts type it: paths from the current folder, typos, a summary line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from conftest import quadrant_frame
from daemon_process import machine_factor


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
    # A frame named twice is one frame: one map, counted once (not 3).
    again = once(tmp_path, "shots/a.jpg", "shots/a.jpg", "./shots/a.jpg", "--model", str(tiny_model))
    assert again.returncode == 0 and again.stdout.startswith("1 depth map written, 0 failed, in "), again.stdout
    # So is a folder named by itself and by a link to it (not 6 for 3 maps on disk).
    (tmp_path / "link").symlink_to(tmp_path / "shots")
    both = once(tmp_path, "shots", "link", "--model", str(tiny_model))
    assert both.returncode == 0 and both.stdout.startswith("3 depth maps written, 0 failed, in "), both.stdout
    # A frame that is a link to another (a held frame) is a frame of its own, with its own map.
    (tmp_path / "shots" / "d.jpg").symlink_to("a.jpg")
    held = once(tmp_path, "shots", "--model", str(tiny_model))
    assert held.returncode == 0 and held.stdout.startswith("4 depth maps written, 0 failed, in "), held.stdout
    assert (tmp_path / "shots" / "d_depth.jpg").is_file()


def test_the_summary_counts_failures_too(tmp_path, tiny_model):
    frames(tmp_path / "shots", "a.jpg")
    (tmp_path / "shots" / "b.jpg").write_bytes(b"not an image")

    done = once(tmp_path, "shots", "--model", str(tiny_model))

    assert done.returncode == 1
    assert done.stdout.startswith("1 depth map written, 1 failed, in ")
    assert "b.jpg" in done.stderr


def test_error_sidecars_are_written_and_removed_by_once_as_by_the_daemon(tmp_path, tiny_model):
    """`output.error_sidecar` holds for `once` as for the daemon: a failed frame gets its record, a good
    one none, and the record goes once the frame is fixed and mapped, so a pipeline reading it never
    sees a failure beside a good map."""
    frames(tmp_path / "shots", "good.jpg")
    (tmp_path / "shots" / "bad.jpg").write_text("not a picture")
    (tmp_path / "records.yaml").write_text("output:\n  error_sidecar: true\n")
    run = ("shots", "-c", "records.yaml", "--model", str(tiny_model))
    done = once(tmp_path, *run)
    assert done.returncode == 1, done.stderr
    record = tmp_path / "shots" / "bad.jpg.error.json"
    assert "not a JPEG" in json.loads(record.read_text())["error"], record.read_text()
    assert not (tmp_path / "shots" / "good.jpg.error.json").exists()
    frames(tmp_path / "shots", "bad.jpg")  # fixed
    assert once(tmp_path, *run).returncode == 0
    assert (tmp_path / "shots" / "bad_depth.jpg").exists() and not record.exists()


def test_a_still_under_an_output_that_names_a_depth_clip_is_refused_not_written_elsewhere(tmp_path):
    """`once frame.png -o out.mov`: -o names a depth clip (or an image sequence), which a still cannot
    give; its map must not go unasked to depth.jpg beside the frame, with the run saying it was written."""
    frames(tmp_path / "in", "frame.png", "b.png")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")  # refused before the model loads: loading it would fail with exit 78 first
    for args in (["in/frame.png", "-o", "out.mov"], ["in", "-o", "seq/{frame:04d}.png"]):
        done = once(tmp_path, *args, "--model", str(broken))
        assert done.returncode == 78, done.stderr
        assert done.stderr.startswith(f"depthwatch: -o {args[2]} names a depth clip or an image sequence, and "), done.stderr
        assert "is not a clip (.avi .m2ts" in done.stderr and len(done.stderr.splitlines()) == 1
        assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["b.png", "broken.onnx", "frame.png", "in"]


def test_a_killed_runs_temporary_files_go_at_the_next_run_beside_them(tmp_path, tiny_model):
    """The daemon sweeps its folders at every start; a `once` killed mid-write has no next start, so the
    next `once` writing there sweeps: a dead writer's temporary files go, a live one's and a user's stay."""
    from depthwatch.files import temp_name_for

    shots = tmp_path / "shots"
    frames(shots, "a.jpg")
    dead = shots / ".a_depth.jpg.999999999-0123abcd.dwtmp"  # pid 999999999: no such process
    dead.write_bytes(b"half a map")
    live = temp_name_for(shots / "b_depth.jpg")  # this test's own pid: a writer still at work
    live.write_bytes(b"being written")
    mine = shots / ".notes.dwtmp"  # not depthwatch's naming
    mine.write_text("the editor's")

    done = once(tmp_path, "shots", "--model", str(tiny_model))

    assert done.returncode == 0, done.stderr
    assert not dead.exists() and live.exists() and mine.exists()
    assert "removed 1 temporary file(s) a stopped depthwatch left in" in done.stderr
    assert (shots / "a_depth.jpg").is_file()


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


def pan(folder: Path, count: int) -> list[Path]:
    """A slow pan across a real photograph, `shot_1001.jpg` on (96x64): one shot, with motion to follow."""
    from skimage import data

    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        frame = cv2.resize(photo[100 : 100 + 192, 50 + 4 * i : 50 + 4 * i + 288], (96, 64), interpolation=cv2.INTER_AREA)
        paths.append(folder / f"shot_{1001 + i}.jpg")
        assert cv2.imwrite(str(paths[-1]), frame, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return paths


def starter(cwd: Path, *args: str) -> Callable[[], subprocess.Popen[bytes]]:
    """How to start `once ARGS` in the background, its output in pipes."""
    return lambda: subprocess.Popen(
        [sys.executable, "-m", "depthwatch", "once", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
    )


def slow_config(tmp_path: Path) -> Path:
    """A model slow enough (on the CPU, not measured against others) that pass 1 of 8 frames takes about 2 s:
    after pass 1 reads a frame, the model still has that frame and the ones after it to run (over a second)
    before pass 2 can read it again, while the test needs one rename."""
    import yaml
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.25, size=128, channels=64)
    config = tmp_path / "config.yaml"
    # fp32 pinned beside the CPU provider: with `precision: auto` every `once` quantized the model to
    # int8 and measured both before its first frame (8 s of CPU each), the model's time then no longer
    # being the one it was made for.
    config.write_text(yaml.safe_dump({"model": {"path": str(model), "profile": "midas-v21-small", "providers": ["cpu"], "precision": "fp32"}}))
    return config


def test_a_frame_rewritten_between_the_two_passes_is_mapped_from_its_new_version(tmp_path):
    """Shot-stable `once` reads a frame twice: for the model (pass 1), then for the edges and the write.

    A frame rewritten in between (a render landing late) must not get pass 1's
    depth under a record naming the new version, which neither a resume nor
    the daemon's start-up scan would ever redo: it is mapped from the version
    there now, exactly as a fresh run maps it.
    """
    from depthwatch.frames.rules import map_is_current
    from file_events import FileEvents, assert_read_once_before_the_rewrite_and_again_after, new_version, rewritten_between_the_passes

    paths = pan(tmp_path / "frames", 8)
    config = slow_config(tmp_path)
    frame, out = paths[3], tmp_path / "maps"
    new = new_version(frame)
    args = (*map(str, paths), "-o", str(out), "-c", str(config))
    events = FileEvents(frame.parent)
    try:
        with rewritten_between_the_passes(frame, new, starter(tmp_path, *args), events) as proc:
            stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr.decode()
        assert stdout.decode().startswith("8 depth maps written, 0 failed, in "), stdout.decode()
        assert_read_once_before_the_rewrite_and_again_after(events, frame.name)
    finally:
        events.close()
    ours = out / "shot_1004_depth.jpg"
    assert map_is_current(frame, ours)
    fresh = subprocess.run(  # the same frames, as they are now, mapped from scratch
        [sys.executable, "-m", "depthwatch", "once", *map(str, paths), "-o", str(tmp_path / "fresh"), "-c", str(config)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )
    assert fresh.returncode == 0, fresh.stderr
    got, want = (cv2.imread(str(p), cv2.IMREAD_GRAYSCALE).astype(int) for p in (ours, tmp_path / "fresh" / ours.name))
    differs = np.abs(got - want).max()
    assert differs <= 2, f"the map is not the new version's: {differs} grey levels off a fresh run's in places"


def test_a_frame_rewritten_again_while_its_shot_is_mapped_again_fails_with_no_map(tmp_path):
    """The second time round, a frame that changes yet again between its passes fails with its
    line: no map, rather than one that names a version it was not made from."""
    from file_events import FileEvents, new_version, rewritten_between_the_passes

    paths = pan(tmp_path / "frames", 8)
    config = slow_config(tmp_path)
    frame, out = paths[3], tmp_path / "maps"
    new = new_version(frame)
    args = (*map(str, paths), "-o", str(out), "-c", str(config))
    events = FileEvents(frame.parent)
    try:
        with rewritten_between_the_passes(frame, new, starter(tmp_path, *args), events) as proc:
            # Read by pass 2 (refused: not pass 1's version), then by pass 1 of its shot's second time round.
            events.wait_for(lambda seen: seen.count(("read", frame.name)) >= 3, "the shot's second pass 1 to read it")
            os.replace(new_version(paths[2]), frame)
            stdout, stderr = proc.communicate(timeout=300)
        seen = events.take()
    finally:
        events.close()
    reads = [i for i, event in enumerate(seen) if event == ("read", frame.name)]
    moves = [i for i, event in enumerate(seen) if event == ("moved in", frame.name)]
    assert len(reads) == 4 and reads[0] < moves[0] < reads[1] and reads[2] < moves[1] < reads[3], seen
    assert proc.returncode == 1, stderr.decode()
    assert stdout.decode().startswith("7 depth maps written, 1 failed, in "), stdout.decode()
    lines = [line for line in stderr.decode().splitlines() if line.startswith("depthwatch: ")]
    assert lines == [
        f"depthwatch: {frame}: changed again while its shot was being mapped again; no map written (map it once it is settled)"
    ]
    assert not (out / "shot_1004_depth.jpg").exists()
    assert sorted(p.name for p in out.iterdir()) == [f"shot_{n}_depth.jpg" for n in range(1001, 1009) if n != 1004]


def test_ctrl_c_says_what_it_leaves(tmp_path):
    """Ctrl-C in the middle of a run: one line, exit 130 (not nothing at all)."""
    import signal
    import time

    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.5)
    names = [f"f{i}.png" for i in range(12)]
    frames(tmp_path / "in", *names)
    config = tmp_path / "config.yaml"  # one engine, as it is: no measuring of others first (seconds a run each)
    config.write_text(f"model:\n  path: {model}\n  profile: midas-v21-small\n  providers: [cpu]\n  precision: fp32\n")
    job = subprocess.Popen(
        [sys.executable, "-m", "depthwatch", "once", "in", "-c", str(config), "--normalise", "frame"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120 * machine_factor()  # a bound that grows with the load, as every wait here
        while not list((tmp_path / "in").glob("*_depth.jpg")):
            assert job.poll() is None and time.monotonic() < deadline, "no map came"
            time.sleep(0.05)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait()
    assert job.returncode == 130
    assert err.strip().splitlines()[-1] == "depthwatch: interrupted (Ctrl-C): the maps written so far stay (a frame in flight may be written too); the rest were not made"
    made = list((tmp_path / "in").glob("*_depth.jpg"))
    assert 1 <= len(made) < len(names) and out == ""
    assert sorted(p.name for p in (tmp_path / "in").iterdir() if p.name.startswith(".")) == []  # no temporary file


def test_a_users_file_named_as_maps_are_named_is_left_out_of_a_folder_with_a_line(tmp_path, tiny_model):
    """`once FOLDER` leaves out a user's own matte_depth.png (no record of depthwatch's: not a map it
    made) with a line, not without a word with the summary counting only the others."""
    frames(tmp_path / "in", "a.png", "matte_depth.png")
    done = once(tmp_path, "in", "-o", "{stem}_depth.png", "--model", str(tiny_model))
    assert done.returncode == 0, done.stderr
    assert f"depthwatch: {tmp_path / 'in'}: left out 1 file(s) named as -o names depth maps (matte_depth.png); " in done.stderr
    assert done.stdout.startswith("1 depth map written, 0 failed")
    by_name = once(tmp_path, "in/matte_depth.png", "-o", "{stem}_depth.png", "--model", str(tiny_model))
    assert by_name.returncode == 0 and (tmp_path / "in" / "matte_depth_depth.png").is_file(), by_name.stderr
    frames(tmp_path / "only", "matte_depth.png")  # nothing else: "no frames found" says why
    alone = once(tmp_path, "only", "-o", "{stem}_depth.png", "--model", str(tiny_model))
    assert alone.returncode == 78 and "left out 1 file(s) named as -o names depth maps (matte_depth.png)" in alone.stderr, alone.stderr


def test_a_sequence_cut_into_range_tasks_gets_the_maps_one_run_gives(tmp_path):
    """A farm manager's tasks over an image sequence (`once DIR --frames A-B` each): a task that planned
    its frames alone would make the grey levels jump at every task's edge, so each sees the
    frames about its range, as a clip's range task does: the maps are those of one whole run."""
    from conftest import FASTDEPTH
    from skimage import data

    from benchmarks.frames import pan_frames

    if not FASTDEPTH.is_file():
        import pytest

        pytest.skip(f"the real model {FASTDEPTH} is not here")
    shots = pan_frames(data.astronaut(), (128, 80), 14, 3, seed=1) + pan_frames(data.coffee(), (128, 80), 7, 3, seed=2)
    for folder in ("whole", "tasks"):
        (tmp_path / folder).mkdir()
        for n, jpeg in enumerate(shots, start=1001):
            (tmp_path / folder / f"pan.{n}.jpg").write_bytes(jpeg)
    model = ("--model", str(FASTDEPTH), "--profile", "fastdepth-nyu")

    def run(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "depthwatch", "once", *args, "-o", "{stem}_depth.png", *model],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr

    run("whole")
    for task in ("1001-1007", "1008", "1009-1021"):  # the first shot split three ways, one task a single frame
        run("tasks", "--frames", task)
    for n in range(1001, 1022):
        whole, task = (cv2.imread(str(tmp_path / f / f"pan.{n}_depth.png"), cv2.IMREAD_UNCHANGED).astype(np.float64) for f in ("whole", "tasks"))
        assert np.abs(whole - task).max() <= 257, n  # within one 8-bit level


def test_a_cancelled_join_says_its_segments_stay():
    """A join cancelled by a farm manager says what stays: no partial depth clip, and the segments it
    joins. A range task's line ("nothing of this task stays") would be wrong there: a join makes no segment."""
    from depthwatch.cli import _interrupted, build_parser

    said = {
        " ".join(argv): _interrupted(build_parser().parse_args(["once", *argv]), "SIGTERM")
        for argv in (["A.mov", "--join", "-o", "A_depth.mov"], ["A.mov", "--frames", "1001-1100"], ["shots", "--farm", "tcp://h:8786"])
    }
    assert said == {
        "A.mov --join -o A_depth.mov": "interrupted (SIGTERM): no partial depth clip stays, and the segments stay until a join ends; "
        "the same command again joins them",
        "A.mov --frames 1001-1100": "interrupted (SIGTERM): nothing of this task stays (its partial segment is removed); run it again",
        "shots --farm tcp://h:8786": "interrupted (SIGTERM): the maps written so far stay; the same command again maps only the frames still missing",
    }


def test_a_range_task_cancelled_with_sigterm_leaves_nothing_and_says_so(tmp_path):
    """Farm managers cancel and requeue a task with SIGTERM: a range task says so in one line, exit 143,
    and removes its partial segment, which would otherwise stay on shared storage for good (megabytes
    to gigabytes)."""
    import signal
    import time

    from onnx_models import slow_model

    from benchmarks.clips import pan_clip_frames, write_clip

    model = slow_model(tmp_path / "slow.onnx", seconds=0.05)
    source = tmp_path / "A.mov"
    write_clip(source, pan_clip_frames((96, 64), 200, step=1, shot=200), codec="prores")
    config = tmp_path / "config.yaml"
    config.write_text(f"model:\n  path: {model}\n  profile: midas-v21-small\n  providers: [cpu]\n  precision: fp32\n")
    job = subprocess.Popen(
        [sys.executable, "-m", "depthwatch", "once", "A.mov", "--frames", "0-199", "-c", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    segments = tmp_path / ".A_depth.mov.farm"
    try:
        deadline = time.monotonic() + 120 * machine_factor()  # a bound that grows with the load, as every wait here
        while not list(segments.glob(".*.part")):  # its segment being written
            assert job.poll() is None and time.monotonic() < deadline, job.stderr.read() if job.poll() is not None else "no segment came"
            time.sleep(0.02)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait()
    assert job.returncode == 143, err
    assert err.strip().splitlines()[-1] == "depthwatch: interrupted (SIGTERM): nothing of this task stays (its partial segment is removed); run it again"
    assert list(segments.glob(".*.part")) == []
