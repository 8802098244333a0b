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

import cv2
import numpy as np

from benchmarks import scenarios
from benchmarks.daemon import Daemon
from benchmarks.frames import FrameSet


def pan(size: tuple[int, int], count: int, quality: int = 90, seed: int = 0) -> FrameSet:
    """A slow pan across one photograph (1% of the width a frame), exposure wobbling by 4%."""
    from skimage import data

    rng = np.random.default_rng(seed)
    w, h = size
    step = max(1, w // 100)
    photo = cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR)
    scale = max((w + step * count) / photo.shape[1], h / photo.shape[0])
    big = cv2.resize(photo, (int(np.ceil(photo.shape[1] * scale)), int(np.ceil(photo.shape[0] * scale))), interpolation=cv2.INTER_CUBIC)
    top = (big.shape[0] - h) // 2
    out = []
    for i in range(count):
        crop = big[top : top + h, i * step : i * step + w].astype(np.float32) * (1 + rng.uniform(-0.04, 0.04))
        ok, buf = cv2.imencode(".jpg", np.clip(crop, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise RuntimeError("could not encode a test frame")
        out.append(buf.tobytes())
    return FrameSet(tuple(out), size, "a pan across scikit-image's coffee")


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
