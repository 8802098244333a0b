"""The clip job: a clip in, its depth clip out, in one pass (`make_clip`); what happened comes back, never raised.

`make_clip` is what the daemon's clip thread, `once` and the farm call. It
checks the clip and its output before any work, streams the frames through
the model and the shot planner (`stream`), writes them under a temporary
name and renames the whole into place (`placing`). A model swapped mid-clip
starts it over (the shots must be planned with one model); a stop request, a
newer version of the clip, or any error removes the temporary file and
leaves the last good output as it was.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace

from depthwatch.clips import sequence, timeline
from depthwatch.clips.job import ClipJob, ClipResult, Progress
from depthwatch.clips.placing import refuse_outside, refuse_replacing, remove, rename_into_place
from depthwatch.clips.stream import Pass, Restart, WriteBehind
from depthwatch.errors import DepthwatchError, FrameError, OwnOutput, Superseded
from depthwatch.files import temp_name_for
from depthwatch.frames import ownership
from depthwatch.frames.job import signature_of
from depthwatch.frames.settings import Settings
from depthwatch.frames.writer import ensure_folder, open_folder
from depthwatch.imaging import codec, normalise, render
from depthwatch.logtext import shown
from depthwatch.media import clipwrite, sourcemeta, video
from depthwatch.model.engine import Engine
from depthwatch.model.spec import ModelInfo

log = logging.getLogger("depthwatch.clips")

#: The source is checked for a rewrite every this many frames (and at the end).
CHECK_EVERY = 24
#: Times a clip is started over when the model is swapped mid-job.
RESTARTS = 2
#: Why a clip that changed while it was mapped (and so looked damaged) is no failure.
CHANGED = "the clip changed while it was being mapped (still being copied?); it starts over with the new version"


def make_clip(
    job: ClipJob,
    engine: Engine,
    settings: Settings,
    *,
    cancelled: Callable[[], str | None] = lambda: None,
    gate: Callable[[], None] = lambda: None,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> ClipResult:
    """Make `job`'s depth clip; the result says what happened (errors included, never raised).

    `cancelled()` is asked between frames: a reason (a newer version, a stop)
    ends the job with nothing written. `gate()` is called before each frame's
    work and may block: the daemon holds clip frames there while live frames
    are waiting. `on_progress` gets the same Progress object after each step.
    """
    began = time.monotonic()
    result = ClipResult(job)
    progress = Progress(job)
    version = job.signature or signature_of(job.source)
    for attempt in range(RESTARTS + 1):
        try:
            result.frames, result.info = _make(job, engine, settings, cancelled, gate, on_progress, progress)
            break
        except Restart:
            if attempt == RESTARTS:
                result.error = "the model changed while the clip was being mapped, again and again; drop the clip again"
                break
            progress = Progress(job)
        except Superseded as exc:
            result.failed_with(exc)
            break
        except FrameError as exc:
            if signature_of(job.source) != version:
                # Damaged, or short, because it is still being written (a copy that preallocates,
                # one that paused): not a bad clip; the version it becomes has an event of its own.
                result.error, result.superseded = CHANGED, True
            else:
                result.error = str(exc)
            break
        except DepthwatchError as exc:
            result.failed_with(exc)
            break
    result.seconds = time.monotonic() - began
    return result


def _make(
    job: ClipJob,
    engine: Engine,
    settings: Settings,
    cancelled: Callable[[], str | None],
    gate: Callable[[], None],
    on_progress: Callable[[Progress], None],
    progress: Progress,
) -> tuple[int, video.ClipInfo]:
    signature = job.signature or signature_of(job.source)

    def check(k: int) -> None:
        reason = cancelled()
        if reason:
            raise Superseded(reason)
        if k % CHECK_EVERY == 0 and signature_of(job.source) != signature:
            raise Superseded("the clip was rewritten while it was being mapped; it starts over with the new version")

    info = engine.info or engine.wait_ready()
    kind = None if job.sequence else clipwrite.kind_for(job.output.suffix)
    if kind is None and not job.sequence:
        raise FrameError(f"cannot write a depth clip as {job.output.suffix!r}; use .mov, .mkv, .mp4 or an image sequence")
    if settings.timeline:
        timeline.check(job.sequence)
    with video.Clip(job.source) as clip:
        meta = clip.info
    if ownership.made_as_depth_clip(job.source, meta.comment):  # a depth clip, or a copy of one, whatever its name
        raise OwnOutput("is a depth clip depthwatch made; not taken as a clip")
    refuse_replacing(job.final, settings.timeline, job.source)  # before the work, not after it
    if meta.width * meta.height > settings.max_pixels:
        raise FrameError(codec.over_pixels(meta.width, meta.height, settings.max_pixels))
    if meta.field_order:
        log.info(
            "clip %s is interlaced (%s): each map is made from the whole frame, both fields at once; %s",
            shown(job.source.name), video.describe_fields(meta.field_order),
            "an image sequence has no field order" if job.sequence
            else "the depth clip is marked with the same field order" if kind is not None and kind.codec != "libx264"
            else "an .mp4 preview is progressive (write .mov or .mkv to keep the field order)",
        )
    progress.frames = progress.total = meta.frames
    progress.phase = "mapping"
    on_progress(progress)
    folder = job.final.parent
    refuse_outside(folder, job.output_roots)
    ensure_folder(folder, job.output_roots)  # never on the system disk in place of a drive that is gone
    # Held to the end: the temporary file is made in, and removed from, this very folder, wherever it goes.
    held = open_folder(folder, job.output_roots)
    try:
        return _write(job, engine, settings, check, gate, on_progress, progress, meta, info, kind, held, signature)
    finally:
        os.close(held)


def _write(
    job: ClipJob,
    engine: Engine,
    settings: Settings,
    check: Callable[[int], None],
    gate: Callable[[], None],
    on_progress: Callable[[Progress], None],
    progress: Progress,
    meta: video.ClipInfo,
    info: ModelInfo,
    kind: clipwrite.Kind | None,
    held: int,
    signature: tuple[int, int, int],
) -> tuple[int, video.ClipInfo]:
    """The frames mapped and written under a temporary name in the output folder held as `held`, renamed into place."""
    stable = settings.normalise == normalise.STABLE
    temp = temp_name_for(job.final)
    # Frame times and display matrix: the maps are made upright; a depth clip stores them turned back,
    # as its source's pixels are, under the same matrix; an image sequence keeps them upright.
    timing = sourcemeta.read(job.source, meta.rate, keeps_times=not job.sequence)
    meta = replace(meta, display_matrix=timing.display_matrix)
    writer: clipwrite.ClipWriter | None = None
    written = 0
    try:
        if job.sequence:
            sequence.begin(temp, job.output.name)
            # Each frame carries a map's record: never taken for a frame, and known as ours when replaced.
            record = sequence.record(job.source, settings, info.spec.path.name)
            sink = WriteBehind(lambda k, depth: sequence.write_frame(temp, job.output, k, depth, settings, record, meta), gate)
        else:
            assert kind is not None
            writer = clipwrite.ClipWriter(temp, kind, meta, timing, made_from=signature, folder=held, clip=job.source)
            sink = WriteBehind(lambda k, depth: writer.write(meta.stored(depth)), gate)  # type: ignore[union-attr]
        bits = 16 if kind is not None else sequence.bits(job.output, settings)
        options = replace(settings.render, bits=bits)
        clip_percent = settings.render.clip_percent
        size = meta.shown_size
        try:
            for k, image, nearness in Pass(job.source, meta, engine, info, check, gate).maps(stable, clip_percent):
                sink.put(k, render.render(nearness, size, options, guide=image))
                written += 1
                progress.done = written
                progress.frames = max(progress.frames, written)
                on_progress(progress)
            sink.finish()
            if written < meta.expected:  # AVI, MXF: settling said it was whole; its header says otherwise
                raise FrameError(
                    f"the clip is cut short: it holds {written} of the {meta.expected} frames its header declares (an unfinished copy?)"
                )
        finally:
            sink.close()
        if writer is not None:
            writer.close()
            writer = None
        check(0)  # a last look for a rewrite before the rename
        rename_into_place(temp, job.final, job.output_roots, job.output.name if job.sequence else None, settings.swap_folders)
        if settings.timeline:
            timeline.write(job.source, job.final, meta, timing.length(written, meta.rate), job.output_roots, timing.lead(meta.rate))
    except BaseException:
        if writer is not None:
            writer.abort()
        remove(temp, held)
        raise
    return written, meta
