"""The model's input tensor: the one-pass preparation is the obvious chain's tensor, in every layout and type."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from depthwatch.imaging import codec, tensor
from depthwatch.model.contract import NCHW, NHWC, Contract
from depthwatch.model.profiles import PROFILES


def _obvious(image: np.ndarray, size: tuple[int, int], contract: Contract, mean: tuple, std: tuple) -> np.ndarray:
    """What `prepare` stands for, written out step by step (the chain it replaced)."""
    shrinking = size[0] * size[1] < image.shape[0] * image.shape[1]
    small = cv2.resize(image, size, interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)
    rgb = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
    if contract.input_dtype == np.uint8:
        x = rgb
    else:
        x = (rgb.astype(np.float32) / 255 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        x = x.astype(contract.input_dtype)
    return (x.transpose(2, 0, 1) if contract.layout == NCHW else x)[None]


def _frame(w: int, h: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[:, : w // 3, 0] = 0  # a channel of its own in one third: a swapped channel shows
    image[:, -w // 3 :, 2] = 255
    return image


@pytest.mark.parametrize("layout", [NCHW, NHWC])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8])
@pytest.mark.parametrize("frame_size", [(480, 270), (120, 90)])  # shrunk to the model, and enlarged
@pytest.mark.parametrize("name", ["midas-v21-small", "depth-anything-v2-small"])  # plain /255, and mean and std per channel
def test_the_tensor_is_the_obvious_chains(layout: str, dtype: type, frame_size: tuple[int, int], name: str) -> None:
    profile = PROFILES[name]
    shape = (1, 3, 256, 192) if layout == NCHW else (1, 256, 192, 3)
    contract = Contract("image", dtype, layout, 256, 192, "depth", (1, 256, 192))
    image = _frame(*frame_size)
    got = tensor.prepare(codec.Decoded(image, frame_size, "jpeg"), contract, profile)
    want = _obvious(image, (192, 256), contract, profile.mean, profile.std)
    assert got.shape == shape and got.dtype == np.dtype(dtype) and got.flags.c_contiguous
    if dtype == np.uint8:
        assert np.array_equal(got, want)
    else:
        tolerance = 1e-5 if dtype == np.float32 else 4e-3
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=tolerance)
        if profile.std != (1.0, 1.0, 1.0):
            assert float(np.abs(got.astype(np.float32)).max()) > 1.5  # normalised, not only /255
