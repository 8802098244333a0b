"""Mutated images through the decode path: a clear FrameError, never anything else."""

from __future__ import annotations

import cv2
import numpy as np
from conftest import jpeg_bytes, quadrant_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthwatch.errors import FrameError
from depthwatch.imaging import codec, formats, normalise, render, tensor
from depthwatch.model.contract import Contract
from depthwatch.model.profiles import INVERSE_DEPTH, PROFILES

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
        decoded = codec.decode(data, max_pixels=4_000_000, min_size=(32, 32))
    except FrameError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    prepared = tensor.prepare(decoded, CONTRACT, PROFILES["midas-v21-small"])
    assert prepared.shape == (1, 3, 32, 32) and np.isfinite(prepared).all()
    options = render.RenderOptions()
    nearness = normalise.frame(prepared[0, 0], INVERSE_DEPTH, options.clip_percent)
    depth = render.render(nearness, decoded.size, options, guide=decoded.image)
    assert (depth.shape[1], depth.shape[0]) == decoded.size


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape_as_anything_but_frame_errors(data):
    try:
        codec.decode(data, max_pixels=4_000_000)
    except FrameError:
        pass


# -- file types, not only bytes: what can sit at a frame's path ------------------------------

KINDS = [
    "image", "empty", "fifo", "link to /dev/zero", "link to /dev/urandom", "link to /dev/null",
    "dangling link", "link loop", "sparse", "folder", "socket", "link to a fifo", "link to a folder",
    "link to an image",
]
LIMIT = 1 << 20


def _make(kind: str, path, data: bytes, size: int) -> None:
    import os
    import socket

    folder = path.parent
    if kind == "image":
        path.write_bytes(data)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind.startswith("link to /dev/"):
        os.symlink(kind.removeprefix("link to "), path)
    elif kind == "dangling link":
        os.symlink(folder / "missing.jpg", path)
    elif kind == "link loop":
        os.symlink(path.name, path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(size)
            f.seek(max(0, size - 2))
            f.write(b"\xff\xd9")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "link to a fifo":
        os.mkfifo(folder / "pipe")
        os.symlink("pipe", path)
    elif kind == "link to a folder":
        (folder / "sub").mkdir()
        os.symlink("sub", path)
    else:  # link to an image inside the folder
        (folder / "real.jpg").write_bytes(data)
        os.symlink("real.jpg", path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(KINDS),
    mutated(),
    st.integers(0, 4 * LIMIT),
    st.booleans(),
)
def test_whatever_sits_at_a_frames_path_is_read_or_refused_in_one_line_never_hangs(kind, data, size, contained):
    """A FIFO, a device behind a link, a sparse file over the limit: refused at once, never read past it."""
    import tempfile
    import threading
    from pathlib import Path

    from depthwatch.frames import provenance
    from depthwatch.frames.reading import read_source

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "frame.jpg"
        _make(kind, path, data, size)
        outcome: list[object] = []

        def read() -> None:
            try:
                got, st_ = read_source(path, max_bytes=LIMIT, link_root=folder if contained else None)
                provenance.read(path)
                outcome.append(got)
            except FrameError as exc:  # Superseded included
                outcome.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(20)
        assert not reader.is_alive(), f"reading {kind} hung"
        assert len(outcome) == 1, f"reading {kind} raised something other than a FrameError"
        result = outcome[0]
        if isinstance(result, bytes):
            assert kind in ("image", "empty", "link to an image") or (kind == "sparse" and size <= LIMIT)
            assert len(result) <= LIMIT
        else:
            assert str(result) and "\n" not in str(result)
            assert kind != "image"
