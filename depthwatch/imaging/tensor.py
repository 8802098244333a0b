"""A decoded frame as the model's input tensor: the one step between decode and inference."""

from __future__ import annotations

import cv2
import numpy as np

from depthwatch.imaging.codec import Decoded
from depthwatch.model.contract import NCHW, Contract, model_input_size
from depthwatch.model.profiles import Profile


def prepare(decoded: Decoded, contract: Contract, profile: Profile) -> np.ndarray:
    """The model's input tensor for a decoded frame: resized, RGB, normalised, batched."""
    w, h = model_input_size(contract, profile, decoded.size)
    image = decoded.image
    shrinking = w * h < image.shape[0] * image.shape[1]
    small = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)
    rgb = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
    if contract.input_dtype == np.uint8:
        x = rgb
    else:
        x = rgb.astype(np.float32) * np.float32(1 / 255)
        if profile.mean != (0.0, 0.0, 0.0) or profile.std != (1.0, 1.0, 1.0):
            x = (x - np.asarray(profile.mean, np.float32)) / np.asarray(profile.std, np.float32)
        x = x.astype(contract.input_dtype, copy=False)
    if contract.layout == NCHW:
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None])
