"""Moving shots made from real photographs, with the exact motion known.

A slow horizontal pan is a sequence of crops of one upscaled photograph, each
`step` pixels to the right of the one before, with the exposure wobbling and
JPEG noise, as a camera gives them. Real footage, with parallax and things
that move on their own, is benchmarks.footage's.
"""

from __future__ import annotations

import numpy as np

from benchmarks.frames import pan_frames

WIDTH, HEIGHT = 640, 360


def pan(photo: np.ndarray, frames: int, step: int, seed: int = 0, wobble: float = 0.04) -> list[bytes]:
    """JPEG frames (WIDTH x HEIGHT) panning right over an RGB photograph, `step` pixels a frame."""
    return pan_frames(photo, (WIDTH, HEIGHT), frames, step, seed=seed, wobble=wobble)

