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
from typing import Any

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


# -- the scenarios ------------------------------------------------------------------------


def available() -> bool:
    """Whether PyAV (the video extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("av") is not None


def _decoded(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise RuntimeError("a benchmark frame did not decode")
    return image


def throughput(plan: Any) -> dict[str, Any]:
    """`once CLIP` against `once` over the same frames as JPEG stills: frames a second beyond the fixed cost.

    The clip is the benchmark's frames encoded as H.264 (B-frames) in .mp4; the
    stills are the same frames as numbered JPEGs, so both are one shot through
    the shot planner of output.normalise: stable. Each command is timed whole, and
    its fixed cost (start-up, model load, one frame) is taken out as in the farm
    rows: `once` on one still, `once` on a one-frame clip.
    """
    import shutil

    from benchmarks.farm import _rate, _timed
    from benchmarks.processes import python
    from benchmarks.scenarios import _folder, _write_frames, median

    knobs = plan.knobs
    stills = _write_frames(plan, "clip-stills", plan.count)
    one = _write_frames(plan, "clip-one", 1)[0]
    folder = _folder(plan, "clip-source")
    clip = folder / "shot.mp4"
    count = write_clip(clip, (_decoded(d) for d in plan.frames.data[: plan.count]), codec="h264", rate=Fraction(24))
    one_clip = folder / "one.mp4"
    write_clip(one_clip, [_decoded(plan.frames.data[0])], codec="h264", rate=Fraction(24))
    base = [python(), "-m", "depthwatch", "once", "--model", str(knobs.model), "--profile", knobs.profile]
    timeout = 120 + 5 * plan.count
    out = plan.work / "clip-maps"
    still_runs, still_fixed, clip_runs, clip_fixed = [], [], [], []
    for _ in range(plan.repeats):
        shutil.rmtree(out, ignore_errors=True)
        still_runs.append(_timed([*base, str(stills[0].parent), "-o", str(out)], knobs, timeout))
        still_fixed.append(_timed([*base, str(one), "-o", str(plan.work / "clip-one-map.jpg")], knobs, timeout))
        clip_runs.append(_timed([*base, str(clip), "-o", str(plan.work / "shot_depth.mov")], knobs, timeout))
        clip_fixed.append(_timed([*base, str(one_clip), "-o", str(plan.work / "one_depth.mov")], knobs, timeout))
    stills_fps = _rate(count, median(still_runs), median(still_fixed))
    clip_fps = _rate(count, median(clip_runs), median(clip_fixed))
    return {
        "frames": count,
        "size": list(plan.frames.size),
        "stills": {"fps": stills_fps, "wall_s": still_runs, "fixed_s": still_fixed},
        "clip": {"fps": clip_fps, "wall_s": clip_runs, "fixed_s": clip_fixed, "source": "H.264 .mp4", "output": "ProRes 422 HQ .mov"},
        "clip_vs_stills": clip_fps / stills_fps if stills_fps > 0 else None,
    }


def memory(plan: Any, frames: int, size: tuple[int, int]) -> dict[str, Any]:
    """RSS of the daemon while it maps one long generated clip, by pass and progress.

    The daemon's status file says how far the clip job is; its resident memory
    is sampled beside it. The job holds the shot planner's window of frames
    (`stabilise.held_at_most`) and a few being encoded, however long the clip,
    so memory must stay flat: the growth per frame is measured from a quarter
    of the way in (the job's buffers are allocated at its start).
    """
    import os
    import time

    import psutil

    from benchmarks.daemon import Daemon
    from benchmarks.processes import BenchError
    from depthwatch.imaging.stabilise import held_at_most

    folder = plan.work / "clip-long"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "long.mp4"
    count = write_clip(source, pan_clip_frames(size, frames, step=max(1, size[0] // 400), shot=max(1, frames // 3)), codec="h264")
    d = Daemon(plan.work, "clip-memory", plan.knobs, ["*.mp4"], "depth.jpg")
    samples: list[tuple[str, int, int]] = []
    try:
        d.start()
        process = psutil.Process(d.proc.pid)
        ready_rss = process.memory_info().rss
        os.rename(source, d.folder / "long.mp4")
        deadline = time.perf_counter() + 60 + frames
        while d.counts().get("clips", 0) < 1:
            clip = d.status().get("clip") or {}
            if clip.get("done"):
                samples.append((str(clip["phase"]), int(clip["done"]), int(process.memory_info().rss)))
            if time.perf_counter() > deadline:
                raise BenchError(f"the long clip was not mapped in time: {d.child.tail() if d.child else ''}")
            d.child.check_alive()  # type: ignore[union-attr]
            time.sleep(0.05)  # the sampling period
        # And once the job is done: a short clip may finish between two status writes.
        samples.append(("done", count, int(process.memory_info().rss)))
        peak = d.peak_rss()
    finally:
        d.stop()
    # From a quarter of the way in: the job's buffers (decoder, encoder threads, the write-behind
    # queue, the shot planner's window) are allocated once, at its start; growth after is what matters.
    mapping = [s for s in samples if s[0] == "mapping"]
    steady = mapping[len(mapping) // 4 :]

    def per_frame(rows: list[tuple[str, int, int]]) -> float | None:
        if len(rows) < 2 or rows[-1][1] == rows[0][1]:
            return None
        return (rows[-1][2] - rows[0][2]) / (rows[-1][1] - rows[0][1])

    return {
        "frames": count,
        "size": list(size),
        "ready_rss_bytes": ready_rss,
        "peak_rss_bytes": peak,
        "bytes_per_frame": per_frame(steady),
        "rss_bytes": [s[2] for s in mapping[:: max(1, len(mapping) // 8)]],
        "held_frames": held_at_most(),
        "samples": len(samples),
    }


def rows(results: dict[str, Any]) -> list[str]:
    """The report's lines for the clip rows."""
    s = results["scenarios"]
    lines = []
    t = s.get("clip_throughput")
    if t:
        w, h = t["size"]
        lines.append(
            f"  once CLIP ({t['frames']} frames {w}x{h}, H.264 -> ProRes): {t['clip']['fps']:.1f} frames/s; "
            f"once over the same frames as JPEG stills: {t['stills']['fps']:.1f} frames/s; ratio {t['clip_vs_stills']:.2f}"
        )
    m = s.get("clip_memory")
    if m:
        w, h = m["size"]
        g = m["bytes_per_frame"]
        lines.append(
            f"  daemon RSS over a {m['frames']}-frame {w}x{h} clip: ready {m['ready_rss_bytes'] / 2**20:.0f} MiB, "
            f"peak {m['peak_rss_bytes'] / 2**20:.0f} MiB; {'-' if g is None else f'{g / 1024:.1f}'} KiB/frame "
            f"from a quarter of the way in (the shot planner holds {m['held_frames']} frames)"
        )
    return lines
