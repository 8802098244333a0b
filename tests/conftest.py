"""Shared fixtures: tiny generated models, real photographs, frames on disk."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

# The test helpers beside this file, and the repository root for `benchmarks` (whose
# daemon harness the tests share), however pytest was started.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from onnx_models import brightness_model  # noqa: E402

SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
FASTDEPTH = SHARED_MODELS / "fastdepth_224_nyu_int8.onnx"


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A 32x32 float NCHW model whose depth output is the frame's brightness."""
    return brightness_model(tmp_path / "tiny.onnx")


@pytest.fixture
def fastdepth() -> Path:
    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    return FASTDEPTH


def quadrant_frame(width: int = 160, height: int = 96, bright: str = "top-left") -> np.ndarray:
    """A BGR frame, dark except one bright quadrant, so flips and transposes show."""
    frame = np.full((height, width, 3), 20, np.uint8)
    h2, w2 = height // 2, width // 2
    rows = slice(0, h2) if "top" in bright else slice(h2, height)
    cols = slice(0, w2) if "left" in bright else slice(w2, width)
    frame[rows, cols] = 235
    return frame


def jpeg_bytes(frame: np.ndarray, quality: int = 95) -> bytes:
    ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def write_by_rename(path: Path, data: bytes) -> None:
    """Drop a file the way a careful plugin does: hidden temp name, then rename."""
    tmp = path.with_name(f".incoming-{threading.get_ident()}-{path.name}")
    tmp.write_bytes(data)
    tmp.replace(path)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory, monkeypatch):
    """depthwatch's cache (model digests, measured providers, compiled models) never lands in the real home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Every thread a test starts is joined by the time it ends (watchdog's rule too)."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(10)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"
