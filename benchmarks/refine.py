"""`output.refine: edges` against `none`: what edge-aware upsampling costs.

Two measurements. `compare` runs the daemon's burst and latency again with
`refine: none` (the main scenarios run depthwatch's default, `edges`), so the
report can set the two side by side from one run. `micro` times the render
step alone on one core (CPU time of the thread) (OpenCV limited to one thread): the guided filter and
the whole render (levels, quantise, upscale) with and without it, for a
1080p and a 4K frame decoded the way the daemon decodes it (JPEG at reduced
scale) and from a full-size decode (a PNG frame).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import cv2
import numpy as np

from benchmarks.scenarios import Plan, burst, latency_and_scrub, median

SIZES = {"1080p": (1920, 1080), "4K": (3840, 2160)}


def compare(plan: Plan) -> dict[str, Any]:
    """Burst and latency with refine: none, against the main scenarios' refine: edges."""
    knobs = dataclasses.replace(plan.knobs, refine="none")
    plain = dataclasses.replace(plan, knobs=knobs)
    latency, _, _ = latency_and_scrub(plain, name="single-none")
    return {"burst": burst(plain, knobs, name="burst-none"), "latency": latency}


def micro(prediction_side: int = 256, repeats: int = 30) -> dict[str, Any]:
    """Median ms on one core of refine.edges and of the render with/without it, per frame size."""
    from skimage import data

    from depthwatch.imaging import codec, refine, render
    from depthwatch.imaging.render import RenderOptions

    rng = np.random.default_rng(0)
    nearness = cv2.GaussianBlur(rng.random((prediction_side, prediction_side)).astype(np.float32), (0, 0), 6)
    nearness = (nearness - nearness.min()) / (nearness.max() - nearness.min())
    photo = data.astronaut()[:, :, ::-1]
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    out: dict[str, Any] = {"prediction": f"{prediction_side}x{prediction_side}", "repeats": repeats}
    try:
        for name, size in SIZES.items():
            frame = cv2.resize(photo, size, interpolation=cv2.INTER_CUBIC)
            jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
            reduced = codec.decode(jpeg, max_pixels=10**9, min_size=(prediction_side, prediction_side)).image
            for guide_name, guide in (("jpeg", reduced), ("full", frame)):
                row = {"guide": f"{guide.shape[1]}x{guide.shape[0]}"}
                row["refine_ms"] = _median_ms(lambda: refine.edges(nearness, guide), repeats)
                for mode in ("edges", "none"):
                    options = RenderOptions(bits=8, refine=mode)
                    row[f"render_{mode}_ms"] = _median_ms(
                        lambda: render.render(nearness, size, options, guide=guide), repeats
                    )
                out[f"{name}_{guide_name}"] = row
    finally:
        cv2.setNumThreads(threads)
    return out


def _median_ms(fn: Any, repeats: int) -> float:
    """Median CPU time of this thread (OpenCV on one thread): wall time on a busy machine lies."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        samples.append((time.thread_time() - start) * 1000)
    return median(samples)


if __name__ == "__main__":  # python -m benchmarks.refine: the micro-benchmark alone
    import json

    print(json.dumps(micro(), indent=2))
