"""A clip's range in two passes, by presentation time: the model's view of each frame, then its segment.

A range names the clip on shared storage and the presentation times of its
frames (from `clipindex`), never pixels. Its frames are decoded from the
keyframe chosen for it, the frames before the range dropped, and the frames
the decoder hands out checked to be exactly the ones listed: a frame missing,
one too many, or one at another time fails the range with one line, never a
shifted clip.

Two passes, as for a numbered sequence, so a shot split over several ranges
still gets one shot's grey levels: `collect` runs the model and returns each
frame's thumbnail and prediction (float32 at model resolution: a clip's maps
must equal local `once CLIP`'s, which plans from the full-precision
prediction); whoever holds the whole clip plans the shots; `render` decodes
the range again (the edge-aware upscale follows the frame), renders each map
and writes the range as one intra-only segment, atomically, named for what it
is of (see `segments`).

The engine is the caller's: a Dask worker's (`farm.cliptasks`) or local
`once`'s for a farm manager's own range task (`batch.rangetasks`). Decoding
and the conversion to BGR at reduced scale are the ones whole clips use
(`video.Clip.frames`), so each frame reaches the model as the same pixels.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.clips import segments, sequence
from depthwatch.errors import DepthwatchError, FrameError
from depthwatch.files import sync_folder
from depthwatch.frames.settings import Settings
from depthwatch.imaging import codec, stabilise, tensor
from depthwatch.imaging.render import render as render_map
from depthwatch.media import clipwrite, orientation
from depthwatch.media.video import ClipInfo, picture_stream, require_av
from depthwatch.model.engine import BACKGROUND, Inference

log = logging.getLogger("depthwatch")

#: Frames handed to the engine ahead of the one being finished (as local clips do).
WINDOW = 2


@dataclass(frozen=True)
class ClipRange:
    """Frames [first, first + len(times)) of one clip, in the workers' view of the storage."""

    source: str
    #: Frame number of the range's first frame in the whole clip.
    first: int
    #: Each frame's presentation time, in the stream's time base, in order.
    times: tuple[int, ...]
    #: Where to seek before decoding (None: decode from the start).
    seek: int | None
    #: The source's (size, mtime_ns) as the client saw it: another version fails the task.
    version: tuple[int, int]
    #: The frame's (width, height) as shown (turned by the display matrix, as the maps are made).
    size: tuple[int, int]
    #: The clip's display matrix: its frames are turned upright by it (`orientation`).
    display_matrix: tuple[int, ...] | None = None

    def describe(self) -> str:
        return f"{Path(self.source).name} frames {self.first}-{self.first + len(self.times) - 1}"


@dataclass(frozen=True)
class RangeReport:
    """What became of one range: its first pass's results, or its segment, or why not (one line)."""

    first: int
    error: str | None = None
    #: `collect`: each frame's stabilise.Summary and prediction, in order.
    summaries: list[Any] = field(default_factory=list, repr=False)
    predictions: list[np.ndarray] = field(default_factory=list, repr=False)
    kind: str = ""
    #: What the worker's model is (name, digest, providers, precision): part of a segment's key.
    model: str = ""
    worker: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def collect(task: ClipRange, engine: Any, worker: str = "") -> RangeReport:
    """First pass: the model's view of each frame of the range, nothing written."""
    info = engine.wait_ready()
    kind = info.profile.predicts
    summaries, predictions = [], []
    try:
        for image, inference in inferred(task, engine):
            prediction = inference.prediction
            summaries.append(stabilise.summarise(prediction, kind, image))
            predictions.append(prediction)
    except FrameError as exc:
        log.error("%s: %s", task.describe(), exc)
        return RangeReport(task.first, str(exc), worker=worker)
    log.info("%s: first pass (model) done", task.describe())
    return RangeReport(task.first, None, summaries, predictions, kind, model_identity(info), worker)


def render(
    task: ClipRange,
    maps: list[np.ndarray],
    settings: Settings,
    kind: clipwrite.Kind | None,
    meta: ClipInfo,
    segment: str,
    engine: Any,
    frame_name: str | None = None,
    worker: str = "",
) -> RangeReport:
    """Second pass: each frame's map from its planned [0, 1] nearness, into one segment at `segment`.

    The segment is written under a temporary name (the writer's pid in it) and
    renamed into place only whole, so a segment under its name is always a
    whole one, whatever happened to its writer. `kind` None: an image
    sequence's range, a folder of its frames named `frame_name`
    (`{frame:04d}.png`), each written as local `once` writes it
    (`clips.sequence`).
    """
    if len(maps) != len(task.times):
        return RangeReport(task.first, f"the range has {len(task.times)} frames but {len(maps)} maps", worker=worker)
    target = Path(segment)
    temp = segments.part_for(target)
    size = meta.shown_size
    info = engine.wait_ready()
    writer: clipwrite.ClipWriter | None = None
    try:
        if kind is None:
            assert frame_name is not None
            output = Path(frame_name)
            options = replace(settings.render, bits=sequence.bits(output, settings))
            record = sequence.record(Path(task.source), settings, info.spec.path.name)
            os.mkdir(temp)
            for k, image in enumerate(_decoded(task, info.min_frame_size)):
                depth = render_map(maps[k], size, options, guide=image)
                sequence.write_frame(temp, output, task.first + k, depth, settings, record, meta)
            sync_folder(temp)
        else:
            options = replace(settings.render, bits=16)
            writer = clipwrite.ClipWriter(temp, kind, replace(meta, timecode=None))
            for k, image in enumerate(_decoded(task, info.min_frame_size)):
                writer.write(meta.stored(render_map(maps[k], size, options, guide=image)))
            writer.close()
            writer = None
        os.replace(temp, target)
    except DepthwatchError as exc:  # FrameError, OutputError: one line
        log.error("%s: %s", task.describe(), exc)
        return RangeReport(task.first, str(exc), worker=worker)
    except OSError as exc:
        if kind is None and target.is_dir():  # the same range, made meanwhile by a task given up for dead
            log.info("%s: segment %s already there", task.describe(), target.name)
            return RangeReport(task.first, worker=worker)
        log.error("%s: cannot write its segment: %s", task.describe(), exc)
        return RangeReport(task.first, f"cannot write its segment in {target.parent}: {exc.strerror or exc}", worker=worker)
    finally:
        if writer is not None:
            writer.abort()
        try:
            if temp.is_dir():
                shutil.rmtree(temp, ignore_errors=True)
            else:
                temp.unlink()
        except OSError:
            pass
    log.info("%s: segment %s written", task.describe(), target.name)
    return RangeReport(task.first, worker=worker)


def decode_range(task: ClipRange, scale: Callable[[int, int], int]) -> Iterator[np.ndarray]:
    """The range's frames as BGR uint8, at the reduced scale `scale(width, height)` gives, checked.

    FrameError (one line) if the clip is another version than the client's, or
    if the decoder does not give exactly the listed frames.
    """
    av = require_av()
    path = Path(task.source)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FrameError(f"cannot read the clip on this worker: {exc.strerror or exc}") from None
    if (st.st_size, st.st_mtime_ns) != task.version:
        raise FrameError("the clip changed since the job started (rewritten?); run the command again once it is settled")
    wanted = task.times
    last = wanted[-1]
    for seek in (task.seek, None):
        try:
            container = av.open(str(path), "r", metadata_errors="ignore")
        except (av.FFmpegError, OSError) as exc:
            raise FrameError(f"cannot open the clip on this worker: {exc}") from None
        try:
            stream = picture_stream(container)
            if stream is None:
                raise FrameError("the clip on this worker has no video stream")
            stream.thread_type = "AUTO"  # as local clips decode
            ctx = stream.codec_context
            turn = orientation.turn_for(task.display_matrix)
            factor = scale(*(turn.size(ctx.width, ctx.height) if turn is not None else (ctx.width, ctx.height)))
            resize = {}
            if factor > 1:
                resize = {"width": max(1, ctx.width // factor), "height": max(1, ctx.height // factor), "interpolation": "AREA"}
            if seek is not None:
                container.seek(seek, stream=stream, backward=True, any_frame=False)
            got = 0
            late = False
            for frame in container.decode(stream):
                pts = frame.pts
                if pts is None:
                    raise FrameError(f"frame {task.first + got} decoded without a presentation time; map the clip without --farm")
                if pts < wanted[0]:
                    continue  # decoded for its references only
                if got == 0 and pts != wanted[0] and seek is not None:
                    late = True  # the seek landed after the range's start: from the start instead
                    break
                if got == len(wanted) or pts != wanted[got]:
                    raise FrameError(_mismatch(task, got, pts))
                image = frame.to_ndarray(format="bgr24", **resize)
                yield turn.shown(image) if turn is not None else image
                got += 1
                if pts == last:
                    break
            if late:
                continue
            if got != len(wanted):
                raise FrameError(
                    f"frames {task.first}-{task.first + len(wanted) - 1}: the decoder gave {got} of the {len(wanted)} frames "
                    "the index lists (damaged or cut short?)"
                )
            return
        except av.FFmpegError as exc:
            raise FrameError(f"frames from {task.first}: the clip is damaged: {exc}") from None
        finally:
            container.close()


def _mismatch(task: ClipRange, got: int, pts: int) -> str:
    wanted = task.times
    expected = wanted[got] if got < len(wanted) else None
    return (
        f"frame {task.first + got}: the decoder gave the frame at time {pts} where the index lists "
        f"{'none' if expected is None else expected}; not splitting this clip frame-exact (map it without --farm)"
    )


def _decoded(task: ClipRange, min_size: tuple[int, int]) -> Iterator[np.ndarray]:
    return decode_range(task, lambda w, h: codec.reduction((w, h), min_size))


def inferred(task: ClipRange, engine: Any) -> Iterator[tuple[np.ndarray, Inference]]:
    """Each frame (reduced) with its inference, in order; WINDOW frames ahead at the model, as local clips.

    `engine`: a Dask worker's, or local `once`'s for a farm manager's own range task (`batch.rangetasks`).
    """
    info = engine.wait_ready()
    window: deque[tuple[np.ndarray, Future[Inference]]] = deque()
    for image in _decoded(task, info.min_frame_size):
        model_input = tensor.prepare(codec.Decoded(image, task.size, "clip"), info.contract, info.profile)
        window.append((image, engine.infer(model_input, info.generation, priority=BACKGROUND)))
        if len(window) > WINDOW:
            yield _finish(window.popleft(), info)
    while window:
        yield _finish(window.popleft(), info)


def _finish(item: tuple[np.ndarray, Future[Inference]], info: Any) -> tuple[np.ndarray, Inference]:
    image, future = item
    inference = future.result()
    if inference.model.generation != info.generation:
        raise FrameError("the worker's model changed mid-range; run the command again")
    return image, inference


def model_identity(info: Any) -> str:
    """What makes two workers' maps the same: the model file's digest, the providers, the precision."""
    from depthwatch.files import sha256_of

    path = info.spec.path
    key = (str(path), os.stat(path).st_mtime_ns)
    digest = _digests.get(key)
    if digest is None:
        digest = _digests[key] = sha256_of(path)[:16]
    return f"{path.name}:{digest}:{','.join(info.providers)}:{info.precision}"


_digests: dict[tuple[str, int], str] = {}

