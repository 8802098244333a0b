"""Mutated images through the decode path: a clear FrameError, never anything else."""

from __future__ import annotations

import cv2
import numpy as np
from conftest import jpeg_bytes, quadrant_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthwatch import formats, imaging
from depthwatch.contract import Contract
from depthwatch.errors import FrameError
from depthwatch.profiles import INVERSE_DEPTH, PROFILES

SEEDS = [
    jpeg_bytes(quadrant_frame(64, 48)),
    cv2.imencode(".png", quadrant_frame(64, 48))[1].tobytes(),
    cv2.imencode(".png", (np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16))[1].tobytes(),
    cv2.imencode(".tif", quadrant_frame(64, 48))[1].tobytes(),
    cv2.imencode(".webp", quadrant_frame(64, 48))[1].tobytes(),
]
CONTRACT = Contract("image", np.float32, "NCHW", 32, 32, "depth", (1, 32, 32))


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "delete", "header"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:  # the first bytes hold sizes and markers: hit them harder
            data[draw(st.integers(0, min(40, len(data) - 1)))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_images_decode_or_fail_cleanly(data):
    formats.read_header(data)  # never raises
    try:
        decoded = imaging.decode(data, max_pixels=4_000_000, min_size=(32, 32))
    except FrameError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    tensor = imaging.prepare(decoded, CONTRACT, PROFILES["midas-v21-small"])
    assert tensor.shape == (1, 3, 32, 32) and np.isfinite(tensor).all()
    options = imaging.RenderOptions()
    nearness = imaging.normalise(tensor[0, 0], INVERSE_DEPTH, options)
    depth = imaging.render(nearness, decoded.size, options, guide=decoded.image)
    assert (depth.shape[1], depth.shape[0]) == decoded.size


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape_as_anything_but_frame_errors(data):
    try:
        imaging.decode(data, max_pixels=4_000_000)
    except FrameError:
        pass
