"""Moving shots made from real photographs, with the exact motion known.

A slow horizontal pan is a sequence of crops of one upscaled photograph, each
`step` pixels to the right of the one before, with the exposure wobbling and
JPEG noise, as a camera gives them. Because the motion is known, the same
scene point can be compared between consecutive depth maps.
"""

from __future__ import annotations

import numpy as np

from benchmarks.frames import pan_frames

WIDTH, HEIGHT = 640, 360


def pan(photo: np.ndarray, frames: int, step: int, seed: int = 0, wobble: float = 0.04) -> list[bytes]:
    """JPEG frames (WIDTH x HEIGHT) panning right over an RGB photograph, `step` pixels a frame."""
    return pan_frames(photo, (WIDTH, HEIGHT), frames, step, seed=seed, wobble=wobble)


def flicker(maps: list[np.ndarray], step: int) -> float:
    """Mean absolute change of the same scene point between consecutive maps, as a share of full range.

    Map i+1 shows at x - step what map i showed at x; only the overlap counts.
    """
    top = 255.0 if maps[0].dtype == np.uint8 else 65535.0
    changes = []
    for a, b in zip(maps, maps[1:]):
        a = a.astype(np.float32) / top
        b = b.astype(np.float32) / top
        changes.append(float(np.abs(a[:, step:] - b[:, : a.shape[1] - step]).mean()))
    return float(np.mean(changes))
