"""Shot-stable normalisation with the real FastDepth model on real photographs panned.

The flicker measure: the same scene point's grey in consecutive maps (the pan's
shift undone), as a share of the full range; `frame` normalisation of the same
frames through the same path is the yardstick.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import write_by_rename
from daemon_process import DaemonProcess, wait_for
from pans import flicker, pan
from skimage import data

from depthwatch.frames.job import Job
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.imaging import normalise, stabilise
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import DEPTH, INVERSE_DEPTH, PROFILES
from depthwatch.model.spec import ModelSpec

STEP = 8  # pixels per frame at 640x360: a slow pan (about 5 s across the frame at 24 fps)
PAN = 20  # frames of the first shot; then a cut to CUT frames of another photograph
CUT = 3


@pytest.fixture(scope="module")
def frames() -> list[bytes]:
    return pan(data.coffee(), PAN, STEP) + pan(data.astronaut(), CUT, STEP, seed=1)


def read(path: Path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64).ravel(), b.astype(np.float64).ravel())[0, 1])


def feed(d: DaemonProcess, frames: list[bytes], done_before: int) -> list[np.ndarray]:
    """Drop each frame as frame.jpg and wait for its map before the next (no timing luck)."""
    maps = []
    for i, frame in enumerate(frames, 1):
        write_by_rename(d.watch / "frame.jpg", frame)
        wait_for(lambda: d.counts().get("done") == done_before + i, what=f"map {i}")
        maps.append(read(d.watch / "depth.jpg"))
    return maps


def test_daemon_pan_is_stable_and_a_cut_starts_afresh(tmp_path, fastdepth, frames):
    d = DaemonProcess(tmp_path, fastdepth)
    config = yaml.safe_load(d.config_path.read_text())
    config["model"].update(profile="fastdepth-nyu", providers=["cpu"])
    d.config_path.write_text(yaml.safe_dump(config))
    d.start()
    try:
        stable = feed(d, frames, 0)
        status = d.status()["counts"]
        lines = d.frame_lines()
        config["output"]["normalise"] = "frame"  # live reload: the next frame is per-frame
        write_by_rename(d.config_path, yaml.safe_dump(config).encode())
        wait_for(lambda: d.status().get("config_loads") == 2, what="the reload")
        per_frame = feed(d, frames, len(frames))
        after_reload = d.frame_lines()[len(lines) :]
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0

    ours, theirs = flicker(stable[:PAN], STEP), flicker(per_frame[:PAN], STEP)
    print(f"daemon: flicker stable {ours:.4f}, frame {theirs:.4f} ({ours / theirs:.2f}x)")
    assert theirs > 0.02  # the yardstick does flicker
    assert ours <= 0.4 * theirs

    # The cut: that frame's own map, full range; the shot before it had no cut.
    first = stable[PAN]
    assert correlation(first, per_frame[PAN]) >= 0.95
    assert first.min() <= 3 and first.max() >= 250  # full range, but for refine: edges smoothing the extremes
    assert np.abs(first.astype(int) - per_frame[PAN].astype(int)).max() <= 2  # JPEG coding, int8 threads
    assert [i for i, line in enumerate(lines) if "shot" in line.split(" ms: ")[1]] == [PAN]
    assert lines[PAN].endswith("shot 2 (cut)")
    assert (status["shots"], status["cuts"]) == (2, 1)
    assert "frame.jpg -> " in status["last_cut"] and status["last_cut"].endswith("shot 2 (cut)")
    assert not any("shot" in line.split(" ms: ")[1] for line in after_reload)
    # The first map of all was the per-frame one too.
    assert np.abs(stable[0].astype(int) - per_frame[0].astype(int)).max() <= 2


def run_once(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "depthwatch", "once", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_once_normalises_each_shot_of_a_sequence_as_a_whole(tmp_path, fastdepth, frames):
    folder = tmp_path / "shot"
    folder.mkdir()
    # Out of order on purpose (names sort 1001 < 999 as text): frame order is by number.
    numbers = list(range(990, 990 + len(frames)))
    for n, frame in zip(numbers, frames):
        (folder / f"A001_C002.{n:04d}.jpg").write_bytes(frame)
    model = ["--model", str(fastdepth), "--profile", "fastdepth-nyu"]
    run_once(str(folder), "-o", str(tmp_path / "stable"), *model)
    run_once(str(folder), "-o", str(tmp_path / "frame"), "--normalise", "frame", *model)
    stable = [read(tmp_path / "stable" / f"A001_C002.{n:04d}_depth.jpg") for n in numbers]
    per_frame = [read(tmp_path / "frame" / f"A001_C002.{n:04d}_depth.jpg") for n in numbers]

    ours, theirs = flicker(stable[:PAN], STEP), flicker(per_frame[:PAN], STEP)
    print(f"once: flicker stable {ours:.4f}, frame {theirs:.4f} ({ours / theirs:.2f}x)")
    assert theirs > 0.02
    assert ours <= 0.2 * theirs

    # Each shot spans the full range as a whole; the cut's first map is that frame's own
    # map up to the shot's range (correlated), not a continuation of the first shot.
    for shot in (stable[:PAN], stable[PAN:]):
        assert min(m.min() for m in shot) <= 3 and max(m.max() for m in shot) >= 250  # refine: edges smooths extremes
    assert correlation(stable[PAN], per_frame[PAN]) >= 0.95
    assert np.percentile(stable[PAN], 99) - np.percentile(stable[PAN], 1) >= 0.6 * 255


def test_unrelated_stills_each_get_their_own_map(tmp_path, fastdepth):
    """Numbered camera stills and a single still: exactly `frame` mode's map each."""
    folder = tmp_path / "stills"
    folder.mkdir()
    photos = {"IMG_1234.jpg": data.astronaut(), "IMG_1240.jpg": data.chelsea(), "IMG_1241.jpg": data.coffee(), "cover.jpg": data.rocket()}
    for name, photo in photos.items():
        cv2.imwrite(str(folder / name), cv2.resize(photo[:, :, ::-1], (640, 360)), [cv2.IMWRITE_JPEG_QUALITY, 90])
    model = ["--model", str(fastdepth), "--profile", "fastdepth-nyu"]
    model += ["--refine", "none"]  # the normalised map as it is: no guided filter on its extremes
    run_once(str(folder), "-o", "{stem}_depth_stable.png", *model)
    run_once(str(folder), "-o", "{stem}_depth_frame.png", "--normalise", "frame", *model)
    for name in photos:
        stem = Path(name).stem
        ours = read(folder / f"{stem}_depth_stable.png").astype(int)
        theirs = read(folder / f"{stem}_depth_frame.png").astype(int)
        assert ours.min() == 0 and ours.max() == 65535, name  # its own full range
        assert np.abs(ours - theirs).max() <= 257, name  # one 8-bit step: the int8 kernels' thread scheduling


def test_scrubbing_back_and_forth_within_a_shot_is_not_a_cut(tmp_path, fastdepth):
    shot = pan(data.chelsea(), 16, STEP)
    spec = ModelSpec(path=fastdepth, profile=PROFILES["fastdepth-nyu"], providers=("cpu",))
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 4, 2, 6, 10, 15, 12, 9, 11, 3]
    results = []
    with Engine(spec) as engine:
        pipeline = Pipeline(engine)
        for i in order:
            (tmp_path / "frame.jpg").write_bytes(shot[i])
            results.append(pipeline.process(Job(tmp_path / "frame.jpg", tmp_path / "depth.png"), Settings()))
        pipeline.close()
    assert all(r.ok for r in results)
    assert [r.started for r in results] == ["new"] + [""] * (len(order) - 1)
    assert {r.shot for r in results} == {1}


# -- the stabiliser's rules, on small synthetic maps -------------------------------------------


def scene(shift: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(depth in metres at 64x64, the BGR image it belongs to): a smooth room, moved by `shift` px."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    depth = 2.0 + 2.0 * (1 - yy / 64) + 0.5 * np.sin((xx + shift) / 9.0)
    image = np.clip(rng.normal(128, 40, (64, 64, 3)), 0, 255).astype(np.uint8)
    image = cv2.GaussianBlur(image, (0, 0), 2)
    return depth, image


def another_place(image: np.ndarray) -> np.ndarray:
    """A frame with nothing in common in colour: dark and red."""
    return cv2.add(image // 4, np.full_like(image, (0, 0, 180)))


def test_first_map_is_exactly_the_frame_map_and_only_landed_maps_move_the_state():
    s = stabilise.Stabiliser()
    depth, image = scene()
    out = Path("depth.jpg")
    first = s.map(out, depth, DEPTH, image, key=1, seq=1)
    assert first.started == "new" and np.array_equal(first.map, normalise.frame(depth, DEPTH))
    clip = (2.0, 90.0)
    clipped = stabilise.Stabiliser().map(out, depth, DEPTH, image, key=1, seq=1, clip_percent=clip)
    assert np.array_equal(clipped.map, normalise.frame(depth, DEPTH, clip))

    assert s.state(out) is None  # nothing until the map is written
    assert s.landed(out, first)
    brighter = depth * 1.5  # the model's scale drifted: the map must not change
    aligned = s.map(out, brighter, DEPTH, image, key=1, seq=2)
    assert aligned.started == "" and aligned.shot == 1
    assert np.abs(aligned.map - first.map).max() < 0.02
    assert s.state(out).seq == 1  # a map not (yet) written leaves no trace

    newer = s.map(out, depth, DEPTH, image, key=1, seq=3)
    assert s.landed(out, newer)
    assert not s.landed(out, aligned)  # landing after a newer one: ignored
    assert s.state(out).seq == 3


def test_model_swap_and_colour_jump_start_new_shots_and_state_is_bounded():
    s = stabilise.Stabiliser(max_outputs=3, idle_s=3600)
    depth, image = scene()
    out = Path("a/depth.jpg")
    s.landed(out, s.map(out, depth, DEPTH, image, key=1, seq=1))
    swapped = s.map(out, depth, DEPTH, image, key=2, seq=2)
    assert (swapped.started, swapped.shot) == ("model", 2)
    s.landed(out, swapped)
    cut = s.map(out, depth, DEPTH, another_place(image), key=2, seq=3)
    assert (cut.started, cut.shot) == ("cut", 3)
    assert np.array_equal(cut.map, normalise.frame(depth, DEPTH))
    s.landed(out, cut)
    for i in range(5):
        other = Path(f"b{i}/depth.jpg")
        s.landed(other, s.map(other, depth, DEPTH, image, key=2, seq=10 + i))
    assert len(s) == 3 and s.state(out) is None

    idle = stabilise.Stabiliser(idle_s=0.0)
    idle.landed(out, idle.map(out, depth, DEPTH, image, key=1, seq=1))
    again = idle.map(out, depth, DEPTH, image, key=1, seq=2)
    assert (again.started, again.shot) == ("new", 1)  # forgotten: a fresh start


def test_plan_finds_the_cut_and_gives_a_one_frame_shot_its_own_map():
    frames = [scene(shift=i) for i in range(4)] + [scene(seed=5)]
    summaries = [stabilise.summarise(d, DEPTH, another_place(im) if i == 4 else im) for i, (d, im) in enumerate(frames)]
    params = stabilise.plan(summaries)
    assert [p.shot for p in params] == [1, 1, 1, 1, 2]
    assert [p.first for p in params] == [True, False, False, False, True]
    assert params[4].exact and not params[0].exact
    depth = frames[4][0]
    assert np.array_equal(stabilise.apply(depth, DEPTH, params[4])[0], normalise.frame(depth, DEPTH))


def test_unrelated_frames_of_the_same_colours_are_cuts():
    """Random grey blocks: the same histogram every frame, nothing else in common."""
    s = stabilise.Stabiliser()
    out = Path("depth.jpg")
    started = []
    for seed in range(12):
        blocks = np.random.default_rng(seed).integers(0, 256, (4, 6), dtype=np.uint8)
        grey = cv2.resize(blocks, (96, 64), interpolation=cv2.INTER_NEAREST)
        image = cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR)
        depth = cv2.resize(grey, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32)  # nearness = brightness
        outcome = s.map(out, depth, INVERSE_DEPTH, image, key=1, seq=seed + 1)
        assert s.landed(out, outcome)
        started.append(outcome.started)
    assert started == ["new"] + ["cut"] * 11
