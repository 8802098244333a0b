"""The render chain: a model's prediction -> the bytes of its depth map file.

normalise (or stabilise: `output.normalise: stable`) -> refine -> levels ->
quantise and upscale -> encode, on a worker thread, never the inference
thread. `depth_map` is the one way through: the pipeline (so the daemon, the
API, `once` and the farm), `check` and the benchmarks all call it, so a map
made anywhere is the map the daemon makes.

One choice here is made for speed and tested to give the same result as the
obvious path: the map is levelled and quantised at its working resolution (the
model's, or the refine guide's) before the one upscale to the frame's size, so
that upscale works on 8- or 16-bit integers instead of floats and is the only
pass over a frame-sized image.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from depthwatch.imaging import codec, normalise, refine, stabilise
from depthwatch.imaging.beside import Beside
from depthwatch.imaging.levels import Levels
from depthwatch.imaging.levels import apply as apply_levels

#: `output.refine` values: a plain bilinear upscale, or edges from the frame.
REFINE_NONE, REFINE_EDGES = "none", "edges"


@dataclass(frozen=True)
class RenderOptions:
    """How the depth map looks: optional percentile clip, refinement, levels, bit depth.

    `bits` is 8 or 16 (integers) or 32 (float32, not quantised).
    """

    clip_percent: tuple[float, float] | None = None
    bits: int = 8
    refine: str = REFINE_EDGES
    levels: Levels = Levels()


@dataclass(frozen=True)
class Encoding:
    """How the map is written: `output.jpeg_quality`, `png_bits`, `png_compression` and the EXR settings."""

    jpeg_quality: int = 95
    png_bits: int = 16
    png_compression: int = 1
    exr: codec.ExrOptions = codec.ExrOptions()


@dataclass(frozen=True)
class Stable:
    """Where a frame's map joins its output's shot (`output.normalise: stable` in the daemon).

    `key` must match for the shot to carry over (model generation, settings);
    `seq` orders frames of one output, so an older one never replaces a newer one's state.
    """

    stabiliser: stabilise.Stabiliser
    output: Path
    key: Hashable
    seq: int


@dataclass(frozen=True)
class Ahead:
    """What a frame's map needs of the frame alone, made on a worker while the model runs (`ahead`)."""

    guide: refine.Guide | None = None
    shot: stabilise.Lookahead | None = None


def ahead(
    frame: codec.Decoded,
    grid: tuple[int, int] | None,
    options: RenderOptions,
    stable: Stable | None = None,
    *,
    motion: bool = True,
) -> Ahead:
    """The work of `depth_map` that does not need the prediction: the refine guide, the shot's flow.

    Why: a frame on its own (an editor's drop, an API request) waits for every
    stage in turn, and while an accelerator runs the model the CPU has nothing
    to do. The pipeline calls this then, so after inference only the
    prediction's own work is left. `grid`: the prediction's rows and columns,
    if known (the guide is made for it); `motion=False`: leave the flow to
    `depth_map` (the output's shot state will likely move on first). Whatever
    turns out not to hold when the prediction comes (another grid, a newer
    shot state) is made again there, so the map is the same either way.
    """
    guide = None
    if grid is not None and options.refine == REFINE_EDGES:
        guide = refine.guide(frame.image, grid)
    shot = None
    if stable is not None:
        shot = stable.stabiliser.lookahead(stable.output, frame.image, stable.key, motion=motion)
    return Ahead(guide, shot)


@dataclass(frozen=True)
class DepthMap:
    """A map, encoded; with `stable`, the shot state it leaves (`Stabiliser.landed` once written)."""

    data: bytes
    shot: stabilise.ShotMap | None = None


def depth_map(
    prediction: np.ndarray,
    predicts: str,
    frame: codec.Decoded,
    *,
    ext: str,
    options: RenderOptions,
    encoding: Encoding = Encoding(),
    nearness: np.ndarray | None = None,
    stable: Stable | None = None,
    lap: Callable[[str], None] | None = None,
    ahead: Ahead | None = None,
    beside: Beside | None = None,
) -> DepthMap:
    """The whole chain for one frame: `prediction` (model resolution) -> the bytes of a map named `*ext`.

    `predicts`: what the prediction means (the profile's: inverse depth or depth).
    `frame`: the decoded frame: its size is the map's, its pixels (maybe at
    reduced scale) guide `refine: edges`, an EXR's windows go on an EXR map.
    `nearness`: the [0, 1] map already made (a planned shot, offline), so
    normalising is skipped. `stable`: normalise against the output's shot so
    far instead of this frame alone. `lap(stage)` is called as each of
    normalise, render and encode ends (stage timings). `ahead`: this frame's
    `ahead`, made while the model ran. `beside`: an idle thread that may encode
    half the map (`codec.encode`); the bytes are the same without it. (The
    refine guide is not made there while this one normalises: the shot's flow
    already keeps both cores busy, so it would gain nothing.)
    """
    guide = frame.image
    shot = None
    if nearness is None:
        if stable is None:
            nearness = normalise.frame(prediction, predicts, options.clip_percent)
        else:
            shot = stable.stabiliser.map(
                stable.output,
                prediction,
                predicts,
                guide,
                key=stable.key,
                seq=stable.seq,
                clip_percent=options.clip_percent,
                ahead=None if ahead is None else ahead.shot,
            )
            nearness = shot.map
    if lap is not None:
        lap("normalise")
    prepared = None if ahead is None else ahead.guide
    depth = render(nearness, frame.size, _with_bits(options, ext, encoding), guide=guide, prepared=prepared)
    if lap is not None:
        lap("render")
    data = codec.encode(
        depth,
        ext,
        jpeg_quality=encoding.jpeg_quality,
        png_compression=encoding.png_compression,
        exr_options=encoding.exr,
        exr_windows=frame.windows,
        exr_frame=frame.exr_frame,
        beside=beside,
    )
    if lap is not None:
        lap("encode")
    return DepthMap(data, shot)


def _with_bits(options: RenderOptions, ext: str, encoding: Encoding) -> RenderOptions:
    bits = codec.bits_for(ext, encoding.png_bits)
    return options if options.bits == bits else RenderOptions(options.clip_percent, bits, options.refine, options.levels)


def render(
    nearness: np.ndarray,
    size: tuple[int, int],
    options: RenderOptions,
    guide: np.ndarray | None = None,
    prepared: refine.Guide | None = None,
) -> np.ndarray:
    """The depth map at the frame's (width, height): uint8/uint16, or float32 for bits 32.

    `nearness` is the normalised map ([0, 1], 1 = nearest) at the model's
    resolution; `guide` the decoded frame (maybe at reduced scale) that
    `refine: edges` follows. Levels and quantisation happen at the working
    resolution, before the one upscale to `size`: quantising first and
    upscaling integers gives the same map as upscaling floats first (within
    one level) at a fraction of the cost. `prepared`: `refine.guide` of `guide`, made beforehand.
    """
    m = nearness.astype(np.float32, copy=False)
    if options.refine == REFINE_EDGES and guide is not None:
        m = refine.edges(m, guide, prepared=prepared)
    m = apply_levels(m, options.levels, reference=nearness)
    if options.bits == 32:
        q = np.ascontiguousarray(m, dtype=np.float32)
    else:
        top, dtype = (255, np.uint8) if options.bits == 8 else (65535, np.uint16)
        q = (m * np.float32(top) + np.float32(0.5)).astype(dtype)
    if (q.shape[1], q.shape[0]) == size:
        return q
    return cv2.resize(q, size, interpolation=cv2.INTER_LINEAR)
