"""Test frames: 1920x1080 JPEGs made from the photographs scikit-image ships, or a folder's.

Photographs are cropped to 16:9 (a different window, zoom and mirror for each
variant, so every frame is distinct) and scaled up to the frame size. Scaled-up
photographs are far smoother than camera footage, and JPEG decoding costs
grow with the detail left in the file, so a light seeded grain (sigma 2 levels)
is added: it brings the files to the size of real 1080p footage at the same
quality instead of flattering the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

#: skimage.data photographs that ship with the package (no download needed).
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")

FULL_HD = (1920, 1080)


@dataclass(frozen=True)
class FrameSet:
    """Frames as JPEG bytes (held in memory, written by the scenarios), and where they came from."""

    data: tuple[bytes, ...]
    size: tuple[int, int]
    source: str

    @property
    def mean_bytes(self) -> int:
        return int(sum(len(d) for d in self.data) / len(self.data))

    def __len__(self) -> int:
        return len(self.data)

    def describe(self) -> str:
        w, h = self.size
        return f"{len(self)} x {w}x{h} JPEG ({self.mean_bytes / 1024:.0f} KiB mean) from {self.source}"


def _photographs() -> list[np.ndarray]:
    from skimage import data

    photos = []
    for name in PHOTOS:
        rgb = getattr(data, name)()
        photos.append(cv2.cvtColor(rgb[..., :3], cv2.COLOR_RGB2BGR))
    return photos


def _variant(photo: np.ndarray, k: int, size: tuple[int, int], grain: np.ndarray) -> np.ndarray:
    """Variant `k` of a photograph at `size`: its own 16:9 window, zoom and mirror."""
    w, h = size
    ph, pw = photo.shape[:2]
    aspect = w / h
    crop_w, crop_h = (pw, pw / aspect) if pw / ph < aspect else (ph * aspect, ph)
    zoom = 1.0 + 0.07 * (k % 5)
    crop_w, crop_h = crop_w / zoom, crop_h / zoom
    fx, fy = ((k * 0.37) % 1.0), ((k * 0.61) % 1.0)
    x0, y0 = int((pw - crop_w) * fx), int((ph - crop_h) * fy)
    crop = photo[y0 : y0 + int(crop_h), x0 : x0 + int(crop_w)]
    if k % 2:
        crop = crop[:, ::-1]
    frame = cv2.resize(crop, size, interpolation=cv2.INTER_CUBIC).astype(np.int16)
    shift = (k * 7) % (grain.shape[1] - w + 1)
    frame += grain[:, shift : shift + w]
    return np.clip(frame, 0, 255).astype(np.uint8)


def generate(count: int, size: tuple[int, int] = FULL_HD, quality: int = 90, seed: int = 0) -> FrameSet:
    """`count` distinct frames at `size` from the scikit-image photographs."""
    rng = np.random.default_rng(seed)
    w, h = size
    grain = np.rint(rng.normal(0.0, 2.0, (h, w + 64, 3))).astype(np.int16)
    photos = _photographs()
    data = []
    for i in range(count):
        frame = _variant(photos[i % len(photos)], i // len(photos), size, grain)
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise RuntimeError("could not encode a test frame")
        data.append(buf.tobytes())
    return FrameSet(tuple(data), size, "scikit-image photographs")


def load(folder: Path, count: int) -> FrameSet:
    """`count` frames from the JPEGs in `folder` (repeated in name order if there are fewer)."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg") and not p.name.startswith("."))
    if not files:
        raise SystemExit(f"benchmarks: no .jpg files in {folder}")
    blobs = [p.read_bytes() for p in files[:count]]
    first = cv2.imdecode(np.frombuffer(blobs[0], np.uint8), cv2.IMREAD_COLOR)
    if first is None:
        raise SystemExit(f"benchmarks: cannot decode {files[0]}")
    data = [blobs[i % len(blobs)] for i in range(count)]
    return FrameSet(tuple(data), (first.shape[1], first.shape[0]), str(folder))


def pan_frames(
    photo_rgb: np.ndarray,
    size: tuple[int, int],
    count: int,
    step: int,
    *,
    seed: int = 0,
    wobble: float = 0.04,
    quality: int = 85,
) -> list[bytes]:
    """A slow horizontal pan as a camera gives it: JPEG crops of one upscaled photograph.

    Each frame is `step` pixels right of the one before (the motion is known
    exactly, so the same scene point can be compared between consecutive depth
    maps), its exposure wobbling by up to `wobble`, with JPEG noise. The one
    pan generator of the tests and the benchmarks.
    """
    w, h = size
    rng = np.random.default_rng(seed)
    bgr = np.ascontiguousarray(photo_rgb[:, :, ::-1])
    scale = max((w + step * (count - 1)) / bgr.shape[1], h / bgr.shape[0])
    big = cv2.resize(bgr, (int(np.ceil(bgr.shape[1] * scale)), int(np.ceil(bgr.shape[0] * scale))), interpolation=cv2.INTER_CUBIC)
    top = (big.shape[0] - h) // 2
    out = []
    for i in range(count):
        crop = big[top : top + h, i * step : i * step + w].astype(np.float32)
        crop *= 1 + rng.uniform(-wobble, wobble)
        ok, buf = cv2.imencode(".jpg", np.clip(crop, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise RuntimeError("could not encode a pan frame")
        out.append(buf.tobytes())
    return out
