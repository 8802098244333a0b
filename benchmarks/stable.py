"""What shot-stable normalisation costs: the burst and the latency with output.normalise frame.

The main burst and latency scenarios run with depthwatch's default (stable);
this runs the same burst with `frame`, and the latency both ways on a slow pan
(one shot, so every frame after the first takes the full stable path: align,
motion, filter), in the same run so the ratios hold on a busy machine too.
"""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any

from benchmarks import scenarios
from benchmarks.daemon import Daemon
from benchmarks.frames import FrameSet, pan_frames


def pan(size: tuple[int, int], count: int, quality: int = 90, seed: int = 0) -> FrameSet:
    """A slow pan across one photograph (1% of the width a frame), exposure wobbling by 4%."""
    from skimage import data

    frames = pan_frames(data.coffee(), size, count, max(1, size[0] // 100), seed=seed, quality=quality)
    return FrameSet(tuple(frames), size, "a pan across scikit-image's coffee")


def compare(plan: scenarios.Plan) -> dict[str, Any]:
    """The burst with `frame`, and the latency on a pan with `stable` and with `frame`."""
    out: dict[str, Any] = {"burst_frame": scenarios.burst(plan, dataclasses.replace(plan.knobs, normalise="frame"), name="burst_frame")}
    shot = dataclasses.replace(plan, frames=pan(plan.frames.size, scenarios.WARM_UP + plan.latency_count))
    for mode in ("stable", "frame"):
        daemon = Daemon(plan.work, f"latency_{mode}", dataclasses.replace(plan.knobs, normalise=mode), ["frame.jpg"], "depth.jpg")
        try:
            daemon.start()
            latency, status = scenarios.one_at_a_time(shot, daemon)
            latency["cuts"] = status.get("counts", {}).get("cuts")
            out[f"latency_{mode}"] = latency
        finally:
            daemon.stop()
            shutil.rmtree(daemon.folder, ignore_errors=True)
    return out
