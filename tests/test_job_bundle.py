"""`once INPUT --job-bundle DIR`, checked and run with Open Job Description's own tools, as a farm runs it.

`openjd check` and `openjd summary` read every kind of bundle depthwatch
writes; `openjd run` runs its steps task by task in sessions of its own, each
task `depthwatch once` in a process of its own, as Deadline Cloud's workers
would. The depth clip the tasks and the join make is checked against local
`once CLIP` (ffprobe: frame count, rate, timecode, pixel aspect; every frame's
pixels), and a folder's maps against local `once DIR`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

av = pytest.importorskip("av", reason="clips need the video extra: pip install -e '.[video]'")

from benchmarks.clips import pan_clip_frames, write_clip  # noqa: E402
from onnx_models import busy_brightness_model  # noqa: E402

pytestmark = pytest.mark.timeout(240)

OPENJD = shutil.which("openjd") or str(Path(sys.executable).with_name("openjd"))
#: The tasks' command: this venv's `depthwatch` (PYTHONPATH, inherited through openjd, picks the tree under test).
DEPTHWATCH = str(Path(sys.executable).with_name("depthwatch"))
SIZE = (64, 48)
FRAMES = 40  # two 20-frame shots; chunks of 16 cut the first one


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    for tool in (OPENJD, DEPTHWATCH):
        if not Path(tool).is_file():
            pytest.skip(f"{tool} is missing: pip install -e '.[test]' (openjd-cli) into the venv")
    if shutil.which("ffprobe") is None:
        pytest.skip("ffprobe is missing (Debian's ffmpeg package)")


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a model, a config naming it, a ProRes clip with a timecode and 4:3 pixels, and a folder of frames."""
    root = tmp_path_factory.mktemp("shot")
    model = busy_brightness_model(root / "busy.onnx")
    config = {"model": {"path": str(model), "profile": "midas-v21-small", "providers": ["cpu"], "precision": "fp32"}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    write_clip(root / "A001.mov", pan_clip_frames(SIZE, FRAMES, step=3, shot=20), codec="prores", timecode="01:00:00:00", sar=Fraction(4, 3))
    (root / "plates").mkdir()
    for n, frame in enumerate(pan_clip_frames(SIZE, 26, step=3, shot=12), start=1001):
        cv2.imwrite(str(root / "plates" / f"A001.{n}.png"), frame)
    return root


def once(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "depthwatch", "once", *args], capture_output=True, text=True, cwd=cwd, timeout=180)


def openjd(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OPENJD, *args], capture_output=True, text=True, cwd=cwd, timeout=180)


def values(bundle: Path, **more: str) -> str:
    """parameter_values.yaml (Deadline Cloud's form) as `openjd -p file://` takes them, with `more` over them."""
    said = yaml.safe_load((bundle / "parameter_values.yaml").read_text())["parameterValues"]
    plain = {item["name"]: item["value"] for item in said}
    plain.update(more)
    text = json.dumps(plain)
    path = bundle.parent / f"{bundle.name}-values-{hashlib.sha256(text.encode()).hexdigest()[:8]}.json"
    path.write_text(text)
    return f"file://{path}"


def bundle(cwd: Path, *args: str) -> Path:
    folder = cwd / f"bundle-{sum(p.is_dir() for p in cwd.glob('bundle-*'))}"
    done = once(cwd, *args, "--job-bundle", str(folder))
    assert done.returncode == 0, done.stderr
    assert f"job bundle {folder}" in done.stdout and "deadline bundle submit" in done.stdout, done.stdout
    return folder


def run_step(template: Path, step: str, params: str, *more: str) -> subprocess.CompletedProcess[str]:
    return openjd(template.parent, "run", str(template / "template.yaml"), "--step", step, "-p", params, *more)


def ffprobe(path: Path) -> dict[str, object]:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,r_frame_rate,sample_aspect_ratio:stream_tags=timecode", "-of", "json", str(path)],
        capture_output=True, text=True, check=True, timeout=60,
    )
    stream = json.loads(done.stdout)["streams"][0]
    return {"frames": int(stream["nb_read_frames"]), "rate": stream["r_frame_rate"],
            "sar": stream.get("sample_aspect_ratio"), "timecode": (stream.get("tags") or {}).get("timecode")}


def frames_of(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="gray16le") for f in container.decode(video=0)]


def test_every_bundle_passes_openjd_check_and_summary_and_names_no_path_of_this_machine(shot: Path, tmp_path: Path) -> None:
    config = ("-c", str(shot / "config.yaml"))
    cases = {
        "a clip, an output, a model file": (str(shot / "A001.mov"), "-o", str(tmp_path / "out" / "A001_depth.mkv"), *config, "--gamma", "1.5"),
        "a clip beside itself, a catalogue model": (str(shot / "A001.mov"), "--model", "midas-v21-small", "--timeline"),
        "a folder into a folder": (str(shot / "plates"), "-o", str(tmp_path / "maps"), *config),
        "a sequence's frames, a name template": (*sorted(str(p) for p in (shot / "plates").glob("A001.10*.png")),
                                                 "-o", "{stem}_depth.png", *config, "--normalise", "frame"),
    }
    for case, args in cases.items():
        folder = bundle(tmp_path, *args)
        assert sorted(p.name for p in folder.iterdir()) == ["asset_references.yaml", "parameter_values.yaml", "template.yaml"], case
        checked = openjd(tmp_path, "check", str(folder / "template.yaml"))
        assert checked.returncode == 0 and "passes validation checks" in checked.stdout, (case, checked.stdout + checked.stderr)
        summary = openjd(tmp_path, "summary", str(folder / "template.yaml"), "-p", values(folder), "--output", "json")
        assert summary.returncode == 0, (case, summary.stdout + summary.stderr)
        said = json.loads(summary.stdout)
        steps = [step["name"] for step in said["steps"]]
        assert steps == (["Map", "Join"] if "clip" in case else ["Map"]), (case, said)
        for name in ("template.yaml", "asset_references.yaml"):  # the job's paths are its parameter values only
            text = (folder / name).read_text()
            assert str(shot) not in text and str(tmp_path) not in text and "/work/" not in text, (case, name, text)
        template = yaml.safe_load((folder / "template.yaml").read_text())
        params = {p["name"]: p for p in template["parameterDefinitions"]}
        given = {item["name"]: item["value"] for item in yaml.safe_load((folder / "parameter_values.yaml").read_text())["parameterValues"]}
        assert params["Input"]["type"] == "PATH" and params["Input"]["dataFlow"] == "IN"
        assert params["Input"]["objectType"] == ("FILE" if "clip" in case else "DIRECTORY")
        assert params["ChunkSize"]["default"] == 100 and params["DepthwatchCommand"]["default"] == "depthwatch"
        if "catalogue" in case:
            assert params["Model"]["type"] == "STRING" and given["Model"] == "midas-v21-small" and "Output" not in params
        else:
            assert params["Model"]["type"] == "PATH" and given["Model"] == str(shot / "busy.onnx")
        if "Output" in params:
            assert params["Output"]["dataFlow"] == "OUT" and Path(given["Output"]).is_absolute()
    assert given["Frames"] == "1001-1026" and given["Normalise"] == "frame" and given["OutputName"] == "{stem}_depth.png"


def test_a_clips_tasks_each_alone_in_any_order_one_twice_then_the_join_twice_make_local_onces_depth_clip(shot: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "A001_depth.mov"
    folder = bundle(tmp_path, str(shot / "A001.mov"), "-o", str(out), "-c", str(shot / "config.yaml"), "--chunk", "16")
    params = values(folder, DepthwatchCommand=DEPTHWATCH)
    # The chunks as OpenJD cuts the step, read from a run whose command only says its arguments.
    dry = run_step(folder, "Map", values(folder, DepthwatchCommand="echo"))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    chunks = re.findall(r"once \S+ --frames=(\S+)", dry.stdout)
    assert len(chunks) == 3 and chunks[0].startswith("0-") and chunks[-1].endswith("-39"), chunks
    # A join before its segments are made fails with one line, and a non-zero exit, for the farm to retry.
    early = run_step(folder, "Join", params)
    assert early.returncode != 0 and not out.exists()
    told = [line for line in early.stdout.splitlines() if "depthwatch:" in line]
    assert len(told) == 1 and "no segment of frames 0-39" in told[0], early.stdout

    for chunk in [*reversed(chunks), chunks[1]]:  # any order; the middle one run again, as after a lost worker
        done = run_step(folder, "Map", params, "--task-param", f"Range={chunk}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "openjd_progress: 100.0" in done.stdout and "openjd_status:" in done.stdout, done.stdout
    assert "already made" in done.stdout, done.stdout
    joined = run_step(folder, "Join", params)
    assert joined.returncode == 0 and f"{FRAMES} frames joined" in joined.stdout, joined.stdout + joined.stderr
    made = out.read_bytes()
    assert not (out.parent / ".A001_depth.mov.farm").exists()
    # A range task requeued after the join, then the join requeued: done already, the depth clip as it was,
    # and the segment that task made again goes.
    late = run_step(folder, "Map", params, "--task-param", f"Range={chunks[0]}")
    assert late.returncode == 0 and (out.parent / ".A001_depth.mov.farm").is_dir(), late.stdout + late.stderr
    again = run_step(folder, "Join", params)
    assert again.returncode == 0 and "already joined" in again.stdout, again.stdout + again.stderr
    assert out.read_bytes() == made
    assert not (out.parent / ".A001_depth.mov.farm").exists()

    local = once(tmp_path, str(shot / "A001.mov"), "-o", str(tmp_path / "local.mov"), "-c", str(shot / "config.yaml"))
    assert local.returncode == 0, local.stderr
    assert "openjd_" not in local.stdout + local.stderr  # once's own output, run by hand
    source, farm, here = ffprobe(shot / "A001.mov"), ffprobe(out), ffprobe(tmp_path / "local.mov")
    assert farm == here and farm["frames"] == source["frames"] == FRAMES and farm["rate"] == source["rate"]
    assert farm["timecode"] == "01:00:00:00" and farm["sar"] == "4:3"
    mine, theirs = frames_of(out), frames_of(tmp_path / "local.mov")
    assert [k for k, (a, b) in enumerate(zip(mine, theirs)) if not np.array_equal(a, b)] == []
    assert np.std(mine[0]) > 100  # a real map, not a flat one


def test_a_folders_step_run_by_openjd_makes_local_onces_maps(shot: Path, tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    folder = bundle(tmp_path, str(shot / "plates"), "-o", str(maps / "{stem}_depth.png"), "-c", str(shot / "config.yaml"), "--chunk", "13")
    done = run_step(folder, "Map", values(folder, DepthwatchCommand=DEPTHWATCH))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("openjd_progress: 100.0") == 2, done.stdout  # 26 frames in 2 tasks, each to its end
    local = once(tmp_path, str(shot / "plates"), "-o", str(tmp_path / "local" / "{stem}_depth.png"), "-c", str(shot / "config.yaml"))
    assert local.returncode == 0, local.stderr
    names = sorted(p.name for p in (tmp_path / "local").glob("*.png"))
    assert len(names) == 26 and sorted(p.name for p in maps.glob("*.png")) == names
    chunks = re.findall(r"Range\(CHUNK\[INT\]\) = (\S+)", done.stdout)
    assert chunks == ["1001-1013", "1014-1026"], done.stdout  # cut by OpenJD over the frame numbers
    again = run_step(folder, "Map", values(folder, DepthwatchCommand=DEPTHWATCH), "--task-param", f"Range={chunks[-1]}")
    assert again.returncode == 0, again.stdout + again.stderr  # a task run twice: its maps written again, the same
    for name in names:
        mine, theirs = (cv2.imread(str(f / name), cv2.IMREAD_UNCHANGED) for f in (maps, tmp_path / "local"))
        assert np.array_equal(mine, theirs), name


def test_a_bad_input_fails_before_any_bundle_is_written_as_once_fails(shot: Path, tmp_path: Path) -> None:
    (tmp_path / "mixed").mkdir()
    cv2.imwrite(str(tmp_path / "mixed" / "A001.1001.png"), np.zeros((48, 64, 3), np.uint8))
    cv2.imwrite(str(tmp_path / "mixed" / "still.png"), np.zeros((48, 64, 3), np.uint8))
    cases = [
        (("nothere.mov",), 66, "no such file or folder: nothere.mov"),
        ((str(shot / "A001.mov"), "-o", str(tmp_path / "seq" / "{frame:04d}.png")), 78, "for an image sequence run once CLIP"),
        ((str(shot / "A001.mov"), "--model", str(tmp_path / "missing.onnx")), 78, "missing.onnx"),
        ((str(tmp_path / "mixed"),), 78, "still.png has no frame number"),
        ((str(shot / "plates"), "--frames", "1001-1010"), 78, "--job-bundle writes the whole job's tasks"),
    ]
    for args, code, why in cases:
        folder = tmp_path / "bundle"
        done = once(tmp_path, *args, "-c", str(shot / "config.yaml"), "--job-bundle", str(folder))
        assert done.returncode == code, (args, done.returncode, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and why in done.stderr, (args, done.stderr)
        assert not folder.exists(), args
