"""Moving shots made from real photographs, with the exact motion known.

A slow horizontal pan is a sequence of crops of one upscaled photograph, each
`step` pixels to the right of the one before, with the exposure wobbling and
JPEG noise, as a camera gives them. Because the motion is known, the same
scene point can be compared between consecutive depth maps.
"""

from __future__ import annotations

import cv2
import numpy as np

WIDTH, HEIGHT = 640, 360


def pan(photo: np.ndarray, frames: int, step: int, seed: int = 0, wobble: float = 0.04) -> list[bytes]:
    """JPEG frames (WIDTH x HEIGHT) panning right over an RGB photograph, `step` pixels a frame."""
    rng = np.random.default_rng(seed)
    bgr = np.ascontiguousarray(photo[:, :, ::-1])
    scale = max((WIDTH + step * (frames - 1)) / bgr.shape[1], HEIGHT / bgr.shape[0])
    big = cv2.resize(bgr, (int(np.ceil(bgr.shape[1] * scale)), int(np.ceil(bgr.shape[0] * scale))), interpolation=cv2.INTER_CUBIC)
    top = (big.shape[0] - HEIGHT) // 2
    out = []
    for i in range(frames):
        crop = big[top : top + HEIGHT, i * step : i * step + WIDTH].astype(np.float32)
        crop *= 1 + rng.uniform(-wobble, wobble)
        ok, buf = cv2.imencode(".jpg", np.clip(crop, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 85])
        assert ok
        out.append(buf.tobytes())
    return out


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
