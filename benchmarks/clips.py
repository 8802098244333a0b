"""Clips made for tests and benchmarks with PyAV: real photographs panned, with cuts, in real codecs.

The content changes every frame (a pan of `step` pixels), so a depth clip whose
frames were shifted by one against its source's would show it; a cut every
`shot` frames switches to another photograph. `write_clip` encodes them as an
editor's camera or NLE would: ProRes 422 HQ in .mov with a start timecode, or
H.264 with B-frames in .mp4 (whose reordering and edit list a reader must undo).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

NTSC_FILM = Fraction(24000, 1001)


def photos() -> list[np.ndarray]:
    """Three real photographs (RGB) from scikit-image."""
    from skimage import data

    return [data.astronaut(), data.coffee(), data.chelsea()]


def pan_clip_frames(
    size: tuple[int, int], count: int, step: int = 6, shot: int = 0, pictures: list[np.ndarray] | None = None
) -> Iterator[np.ndarray]:
    """BGR frames of `size` panning right `step` pixels a frame; a cut to the next photograph every `shot` frames."""
    w, h = size
    pictures = pictures if pictures is not None else photos()
    per_shot = shot or count
    bigs = []
    for rgb in pictures:
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        scale = max((w + step * per_shot) / bgr.shape[1], h / bgr.shape[0])
        bigs.append(cv2.resize(bgr, (int(np.ceil(bgr.shape[1] * scale)), int(np.ceil(bgr.shape[0] * scale))), interpolation=cv2.INTER_AREA))
    for i in range(count):
        big = bigs[(i // per_shot) % len(bigs)]
        x = (i % per_shot) * step
        top = (big.shape[0] - h) // 2
        yield np.ascontiguousarray(big[top : top + h, x : x + w])


def write_clip(
    path: Path,
    frames: Iterable[np.ndarray],
    *,
    codec: str = "prores",
    rate: Fraction = NTSC_FILM,
    timecode: str | None = None,
    sar: Fraction | None = None,
) -> int:
    """Encode BGR frames into `path`: codec "prores" (422 HQ, 10-bit) or "h264" (B-frames); returns the count."""
    import av

    options = {"profile": "3"} if codec == "prores" else {"bf": "3", "g": "12", "preset": "veryfast", "crf": "18"}
    name, pix = ("prores_ks", "yuv422p10le") if codec == "prores" else ("libx264", "yuv420p")
    count = 0
    with av.open(str(path), "w") as container:
        stream = None
        for image in frames:
            if stream is None:
                stream = container.add_stream(name, rate=rate, options=options)
                stream.height, stream.width = image.shape[:2]
                stream.pix_fmt = pix
                if sar is not None:
                    stream.codec_context.sample_aspect_ratio = sar
                if timecode:
                    stream.metadata["timecode"] = timecode
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            container.mux(stream.encode(frame))
            count += 1
        if stream is not None:
            container.mux(stream.encode(None))
    return count
