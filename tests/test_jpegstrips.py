"""A grey map's JPEG in two strips, one on another thread: the same file as one encode, read by every decoder."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from depthwatch.frames import provenance
from depthwatch.imaging import codec, jpegstrips
from depthwatch.imaging.beside import Offered


def _map(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A depth-like map: smooth ramps, an edge and grain, so every block row has real data."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    m = 80 + 100 * (y / height) + 40 * np.sin(x / 37.0) + rng.normal(0, 6, (height, width))
    m[height // 3 : height // 2, width // 4 : width // 2] += 60
    return np.clip(m, 0, 255).astype(np.uint8)


def _whole(depth: np.ndarray, quality: int) -> bytes:
    return jpegstrips.encode(depth, quality, beside=None)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="beside") as workers:
        yield workers


@pytest.mark.parametrize("size", [(1080, 1920), (1081, 1927), (719, 1281), (256, 300), (2160, 3840)])
def test_two_strips_joined_are_the_whole_encode_byte_for_byte(size, pool):
    depth = _map(*size)
    whole = _whole(depth, 95)
    assert jpegstrips.split_row(size[0]) is not None
    split = jpegstrips.encode(depth, 95, beside=pool.submit)
    assert split == whole
    decoded = cv2.imdecode(np.frombuffer(split, np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded.shape == size
    # A faithful JPEG of the map (not just equal bytes): close to what was encoded.
    assert np.abs(decoded.astype(int) - depth).mean() < 3


def test_every_decoder_reads_the_joined_file_the_same(pool):
    depth = _map(1080, 1920, seed=3)
    data = jpegstrips.encode(depth, 90, beside=pool.submit)
    by_cv2 = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
    by_pil = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    by_turbo = simplejpeg.decode_jpeg(data, colorspace="GRAY")[..., 0]
    plain = cv2.imencode(".jpg", depth, [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
    unrestarted = cv2.imdecode(plain, cv2.IMREAD_GRAYSCALE)
    np.testing.assert_array_equal(by_cv2, by_pil)
    np.testing.assert_array_equal(by_cv2, by_turbo)
    # Restart markers change only the file, never the pixels.
    np.testing.assert_array_equal(by_cv2, unrestarted)


def test_the_lower_strip_runs_on_the_other_thread_when_it_is_free(pool):
    ran_on = []

    def beside(fn):
        def run():
            ran_on.append(threading.current_thread().name)
            fn()

        return pool.submit(run)

    depth = _map(1080, 1920)
    assert jpegstrips.encode(depth, 95, beside=beside) == _whole(depth, 95)
    assert ran_on and ran_on[0].startswith("beside")


def test_small_maps_are_encoded_whole():
    assert jpegstrips.split_row(255) is None
    offered = []
    depth = _map(200, 320)
    assert jpegstrips.encode(depth, 95, beside=offered.append) == _whole(depth, 95)
    assert offered == []


def test_work_the_other_thread_never_starts_is_done_by_the_caller():
    dropped = []  # a beside that accepts the work and never runs it (a busy or stopped pool)
    depth = _map(1080, 1920)
    assert jpegstrips.encode(depth, 95, beside=dropped.append) == _whole(depth, 95)
    assert len(dropped) == 1
    dropped[0]()  # run late: it sees the work taken, and does nothing


def test_a_pool_that_is_shut_down_takes_nothing_and_the_caller_does_it():
    workers = ThreadPoolExecutor(max_workers=1)
    workers.shutdown()
    depth = _map(720, 1280)
    assert jpegstrips.encode(depth, 95, beside=workers.submit) == _whole(depth, 95)


def test_an_error_on_the_other_thread_reaches_the_caller(pool):
    started = threading.Event()

    def fails():
        started.set()
        raise ValueError("could not encode")

    offered = Offered(fails, pool.submit)
    assert started.wait(30)
    with pytest.raises(ValueError, match="could not encode"):
        offered.take()


def test_work_runs_once_whoever_takes_it(pool):
    calls = []
    gate = threading.Event()

    def work():
        calls.append(threading.current_thread().name)
        gate.wait(30)
        return 7

    offered = Offered(work, pool.submit)
    while not calls:  # wait until the pool has started it, so `take` must wait for it
        threading.Event().wait(0.01)
    gate.set()
    assert offered.take() == 7
    assert len(calls) == 1


def test_joining_refuses_strips_split_off_the_restart_turn():
    depth = _map(512, 512)
    upper, lower = _whole(depth[:200], 95), _whole(depth[200:], 95)
    with pytest.raises(ValueError, match="multiple of 64"):
        jpegstrips.join(upper, lower, 200, 512)


def test_a_map_written_by_codec_keeps_its_provenance(pool):
    depth = _map(1080, 1920)
    data = codec.encode(depth, ".jpg", jpeg_quality=95, beside=pool.submit)
    assert data == codec.encode(depth, ".jpg", jpeg_quality=95)
    record = {"made_from": "frame.jpg", "model": "tiny.onnx"}
    embedded = provenance.embed(data, record)
    assert provenance.read(embedded) == record
    np.testing.assert_array_equal(
        cv2.imdecode(np.frombuffer(embedded, np.uint8), cv2.IMREAD_GRAYSCALE),
        cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE),
    )
