"""The pure pixel functions: decode guards, normalisation, and the fast paths' equivalence."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from conftest import jpeg_bytes, quadrant_frame

from depthwatch.errors import FrameError
from depthwatch.imaging import codec, normalise, render
from depthwatch.imaging.levels import Levels
from depthwatch.imaging.render import RenderOptions
from depthwatch.model.profiles import DEPTH, INVERSE_DEPTH

LIMIT = 100_000_000


def test_normalise_uses_the_range_not_the_maximum():
    # The classic example's 255/max*(x-min) gives 255/1*(x+3) here: wrong and wrapping.
    prediction = np.array([[-3.0, -1.0], [0.0, 1.0]], np.float32)
    n = normalise.frame(prediction, INVERSE_DEPTH)
    np.testing.assert_allclose(n, [[0.0, 0.5], [0.75, 1.0]])


def test_flat_prediction_gives_black_not_nan():
    n = normalise.frame(np.full((4, 4), 7.0, np.float32), INVERSE_DEPTH)
    assert np.all(n == 0.0)


def test_depth_models_are_inverted_so_white_is_near_either_way():
    nearness = np.array([[0.0, 1.0]], np.float32)  # inverse depth: right is near
    metres = np.array([[5.0, 1.0]], np.float32)  # depth: right is near
    a = normalise.frame(nearness, INVERSE_DEPTH)
    b = normalise.frame(metres, DEPTH)
    np.testing.assert_allclose(a, [[0.0, 1.0]])
    np.testing.assert_allclose(b, [[0.0, 1.0]])
    # Inverting is a level, applied after normalising: white = far.
    inverted = render.render(a, (2, 1), RenderOptions(levels=Levels(invert=True)))
    np.testing.assert_array_equal(inverted, [[255, 0]])


def test_percentile_clip_saturates_outliers():
    prediction = np.linspace(0, 1, 101, dtype=np.float32).reshape(1, -1)
    prediction[0, -1] = 1000.0  # one hot pixel would squash everything else to black
    n = normalise.frame(prediction, INVERSE_DEPTH, (0, 98))
    assert n[0, 50] == pytest.approx(0.5, abs=0.02)
    assert n[0, -1] == 1.0


@pytest.mark.parametrize("bits", [8, 16])
def test_quantise_then_upscale_matches_upscale_then_quantise(bits):
    """The cheap path (integers upscaled) gives the obvious path's map within one level."""
    rng = np.random.default_rng(1)
    prediction = cv2.GaussianBlur(rng.random((256, 256)).astype(np.float32), (0, 0), 5)
    size = (1920, 1080)
    options = RenderOptions(bits=bits, refine="none")
    fast = render.render(normalise.frame(prediction, INVERSE_DEPTH, options.clip_percent), size, options)
    top = 255 if bits == 8 else 65535
    big = cv2.resize(prediction, size, interpolation=cv2.INTER_LINEAR)
    lo, hi = prediction.min(), prediction.max()
    reference = np.clip((big - lo) / (hi - lo), 0, 1) * top + 0.5
    assert fast.dtype == (np.uint8 if bits == 8 else np.uint16)
    assert fast.shape == (1080, 1920)
    assert np.abs(fast.astype(np.int64) - reference.astype(np.int64)).max() <= (1 if bits == 8 else top // 255)


def test_reduced_jpeg_decode_gives_the_same_model_input():
    """Decoding a 1080p JPEG at 1/4 scale feeds the model what a full decode would."""
    from skimage import data

    frame = cv2.resize(data.astronaut()[:, :, ::-1], (1920, 1080), interpolation=cv2.INTER_CUBIC)
    encoded = jpeg_bytes(frame)
    reduced = codec.decode(encoded, max_pixels=LIMIT, min_size=(256, 256))
    full = codec.decode(encoded, max_pixels=LIMIT)
    assert reduced.image.shape == (270, 480, 3)
    assert full.image.shape == (1080, 1920, 3)
    assert reduced.size == full.size == (1920, 1080)
    a = cv2.resize(reduced.image, (256, 256), interpolation=cv2.INTER_AREA).astype(np.float32)
    b = cv2.resize(full.image, (256, 256), interpolation=cv2.INTER_AREA).astype(np.float32)
    assert np.abs(a - b).mean() < 2.0  # out of 255: well inside JPEG noise
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.995


def test_a_frame_just_over_the_limit_is_told_from_it():
    """Not "1920x1080 is 2 megapixels, over the limit of 2" nor "0 megapixels, over the limit of 0"."""
    frame = jpeg_bytes(np.zeros((1080, 1920, 3), np.uint8))
    with pytest.raises(FrameError, match=r"1920x1080 is 2\.07 megapixels, over the limit of 2;"):
        codec.decode(frame, max_pixels=2_000_000)
    with pytest.raises(FrameError, match=r"640x360 is 0\.23 megapixels, over the limit of 0\.1;"):
        codec.decode(jpeg_bytes(np.zeros((360, 640, 3), np.uint8)), max_pixels=100_000)


def test_a_file_or_clip_just_over_its_limit_is_told_from_it(tmp_path):
    """Not "is 0 MB, over the limit of 0 MB" (max_file_mb: 0.3), nor a clip of 2.07 megapixels
    "over the limit of 2 megapixels", on every path."""
    from depthwatch.frames.reading import read_file

    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff" * 360_000)
    with pytest.raises(FrameError, match=r"is 0\.343 MB, over the limit of 0\.3 MB; raise daemon\.max_file_mb"):
        read_file(big, max_bytes=int(0.3 * 2**20))
    assert codec.over_pixels(1920, 1080, 2_000_000).startswith("1920x1080 is 2.07 megapixels, over the limit of 2;")


def test_decode_refuses_a_decompression_bomb_before_decoding():
    # A valid PNG header declaring 60000 x 60000 pixels: refused from the header alone.
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (60000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"
    with pytest.raises(FrameError, match="3600 megapixels, over the limit of 100"):
        codec.decode(header + b"\x00" * 64, max_pixels=LIMIT)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"hello, this is a text file\n", "not a JPEG, PNG, TIFF, WebP, EXR or DPX"),
        (jpeg_bytes(quadrant_frame())[:-200], "cut short"),
        (cv2.imencode(".png", quadrant_frame())[1].tobytes()[:-30], "cut short"),
    ],
)
def test_decode_says_why_a_file_is_unusable(data, reason):
    with pytest.raises(FrameError, match=reason):
        codec.decode(data, max_pixels=LIMIT)


def test_decode_handles_gray_sixteen_bit_and_alpha():
    gray16 = (np.linspace(0, 65535, 64 * 48).reshape(48, 64)).astype(np.uint16)
    rgba = np.dstack([quadrant_frame(64, 48), np.full((48, 64), 128, np.uint8)])
    for image, ext in ((gray16, ".png"), (gray16, ".tif"), (rgba, ".png"), (quadrant_frame(64, 48)[:, :, 0], ".jpg")):
        decoded = codec.decode(cv2.imencode(ext, image)[1].tobytes(), max_pixels=LIMIT)
        assert decoded.image.dtype == np.uint8
        assert decoded.image.shape == (48, 64, 3)
        assert decoded.size == (64, 48)


def _exif_jpeg(stored: np.ndarray, orientation: int) -> bytes:
    import io

    from PIL import Image

    image = Image.fromarray(stored[:, :, ::-1])
    exif = image.getexif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes(), quality=95)
    return out.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_decode_applies_every_exif_orientation_as_opencv_does(orientation):
    """simplejpeg decodes the stored pixels; the turn to what a viewer shows is ours, checked
    against OpenCV's own EXIF handling at full and at reduced scale."""
    stored = cv2.GaussianBlur((np.random.default_rng(1).random((120, 200, 3)) * 255).astype(np.uint8), (0, 0), 3)
    data = _exif_jpeg(stored, orientation)
    for min_size, flag in ((None, cv2.IMREAD_COLOR), ((30, 30), cv2.IMREAD_REDUCED_COLOR_4)):
        decoded = codec.decode(data, max_pixels=LIMIT, min_size=min_size)
        reference = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
        assert decoded.image.shape == reference.shape
        assert np.array_equal(decoded.image, reference)
        assert decoded.size == ((120, 200) if orientation >= 5 else (200, 120))


def test_a_damaged_jpeg_raises_and_descriptor_2_is_never_touched(capfd):
    """The decoder raises libjpeg's warning; nothing goes to fd 2 and fd 2 is never swapped for a
    pipe, so other threads' messages are never held back and decodes need no lock."""
    import os
    import threading

    good = jpeg_bytes(cv2.resize(quadrant_frame(), (640, 480)))
    damaged = good[: len(good) // 2] + b"\xff\xd9"
    real = os.fstat(2)
    seen: set[tuple[int, int]] = set()
    stop = threading.Event()

    def watch_fd2() -> None:
        while not stop.is_set():
            now = os.fstat(2)
            seen.add((now.st_dev, now.st_ino))

    watcher = threading.Thread(target=watch_fd2)
    watcher.start()
    try:
        for _ in range(100):
            with pytest.raises(FrameError, match=r"damaged \(Corrupt JPEG data: premature end of data segment\)"):
                codec.decode(damaged, max_pixels=LIMIT)
    finally:
        stop.set()
        watcher.join(10)
    assert seen == {(real.st_dev, real.st_ino)}
    assert capfd.readouterr().err == ""


def test_a_harmless_libjpeg_warning_still_decodes():
    """Extraneous bytes before the end marker: libjpeg warns, the picture is whole."""
    good = jpeg_bytes(quadrant_frame())
    padded = good[:-2] + b"\x00\x11\x22" + good[-2:]
    decoded = codec.decode(padded, max_pixels=LIMIT)
    reference = cv2.imdecode(np.frombuffer(good, np.uint8), cv2.IMREAD_COLOR)
    assert np.array_equal(decoded.image, reference)
