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

def _exr(tiled: bool) -> bytes:
    """A small RGB EXR (float scanline, or half tiled) written by the OpenEXR package."""
    import io

    import OpenEXR

    rgb = quadrant_frame(64, 48)[..., ::-1].astype(np.float32) / 255
    header: dict[str, object] = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    if tiled:
        tiles = OpenEXR.TileDescription()
        tiles.xSize, tiles.ySize, tiles.mode = 16, 16, OpenEXR.ONE_LEVEL
        header.update(type=OpenEXR.tiledimage, tiles=tiles, compression=OpenEXR.PIZ_COMPRESSION)
        rgb = rgb.astype(np.float16)
    out = io.BytesIO()
    with OpenEXR.File(header, {"RGB": rgb}) as image:
        image.write(out)
    return out.getvalue()


SEEDS = [
    _exr(tiled=False),
    _exr(tiled=True),
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
    fmt = formats.sniff(data)
    if fmt is not None:  # the watcher's completeness check never raises either
        assert formats.is_complete_at(fmt, lambda o, n: data[o : o + n], len(data)) in (True, False, None)
    _decode_once(data)


# -- past the sniff: mutations that keep a real header and end marker, so the decoders run --------

def _textured(width: int = 96, height: int = 64) -> np.ndarray:
    """Blurred noise: real entropy-coded data to damage, unlike a flat frame's few bytes."""
    noise = (np.random.default_rng(7).random((height, width, 3)) * 255).astype(np.uint8)
    return cv2.GaussianBlur(noise, (0, 0), 1.5)


_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
BODY_SEEDS = {
    "jpeg": [jpeg_bytes(_textured()), jpeg_bytes(_textured(80, 80)[:, :, 0])],
    "png": [cv2.imencode(".png", _textured())[1].tobytes(),
            cv2.imencode(".png", (_textured()[:, :, 0].astype(np.uint16) * 257))[1].tobytes()],
    "tiff": [cv2.imencode(".tif", _textured())[1].tobytes()],
    "webp": [cv2.imencode(".webp", _textured(), [cv2.IMWRITE_WEBP_QUALITY, 80])[1].tobytes()],
}


def _body(data: bytes, fmt: str) -> tuple[int, int]:
    """The span of coded pixel data: past the headers the size check reads, before the end marker."""
    if fmt == "jpeg":
        return data.index(b"\xff\xda") + 2, len(data) - 2
    if fmt == "png":
        return data.index(b"IDAT") + 4, len(data) - len(_PNG_IEND)
    if fmt == "tiff":
        return 8, int.from_bytes(data[4:8], "little")  # OpenCV writes the strips before the IFD
    return 30, len(data)  # WebP: past the VP8/VP8L header


def body_mutation(fmt: str, rnd) -> bytes:
    """A real image of `fmt` with its coded data flipped, cut, spliced or padded; header and end
    marker kept (a cut JPEG or PNG gets its end marker back, WebP its length), so it is sniffed,
    sized and seen complete, and only the decoder can tell."""
    data = bytearray(rnd.choice(BODY_SEEDS[fmt]))
    start, end = _body(bytes(data), fmt)
    tail = bytes(data[end:])
    body = data[start:end]
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.choice(["flip", "cut", "splice", "insert", "delete"])
        if not body:
            break
        at = rnd.randrange(len(body))
        if kind == "flip":
            body[at] ^= rnd.randint(1, 255)
        elif kind == "cut":
            del body[at:]
        elif kind == "splice":  # the rest from another image of the same format
            other = rnd.choice(BODY_SEEDS[fmt])
            o_start, o_end = _body(other, fmt)
            body[at:] = other[o_start + rnd.randrange(max(1, o_end - o_start)) : o_end]
        elif kind == "insert":
            body[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
        else:
            del body[at : at + rnd.randint(1, 64)]
    if fmt == "tiff":  # keep the strips' length, so the IFD stays where its offset says
        body = (bytes(body) + bytes(end - start))[: end - start]
    out = bytearray(data[:start]) + body + tail
    if fmt == "webp":
        out[4:8] = (len(out) - 8).to_bytes(4, "little")
    return bytes(out)


#: Messages from before the decoder (sniff, header, size and completeness checks).
_BEFORE_DECODER = ("the file is empty", "not a JPEG", "header is damaged", "header declares an empty",
                   "megapixels", "cut short (no end marker)", "floating-point samples")


def _decode_once(data: bytes) -> str:
    """'decoded', 'refused by the decoder' or 'refused before it'; anything else escapes."""
    try:
        decoded = codec.decode(data, max_pixels=4_000_000, min_size=(32, 32))
    except FrameError as exc:
        reason = str(exc)
        assert reason and "\n" not in reason
        return "before" if any(sign in reason for sign in _BEFORE_DECODER) else "decoder"
    prepared = tensor.prepare(decoded, CONTRACT, PROFILES["midas-v21-small"])
    assert prepared.shape == (1, 3, 32, 32) and np.isfinite(prepared).all()
    options = render.RenderOptions()
    depth = render.render(normalise.frame(prepared[0, 0], INVERSE_DEPTH), decoded.size, options, guide=decoded.image)
    assert (depth.shape[1], depth.shape[0]) == decoded.size
    return "decoded"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(BODY_SEEDS)), st.randoms(use_true_random=False))
def test_damaged_coded_data_reaches_the_decoder_and_fails_cleanly(fmt, rnd):
    _decode_once(body_mutation(fmt, rnd))


def test_the_body_mutations_really_reach_each_decoder():
    """The fuzzing above is only worth something if the decoders see its inputs: counted here,
    per format, over a fixed sequence of mutations."""
    import random

    rnd = random.Random(2112)
    for fmt in sorted(BODY_SEEDS):
        outcomes = [_decode_once(body_mutation(fmt, rnd)) for _ in range(60)]
        reached = outcomes.count("decoded") + outcomes.count("decoder")
        assert reached >= 50, (fmt, outcomes)
        if fmt != "tiff":  # LZW strips decode whatever their bytes; the others notice damage
            assert outcomes.count("decoder") >= 5, (fmt, outcomes)  # damage the decoder itself refused


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape_as_anything_but_frame_errors(data):
    """Random bytes stop at the sniff (the tests above are the ones that reach the decoders)."""
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
