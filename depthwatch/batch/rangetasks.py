"""A farm manager's own tasks on one clip: `once CLIP --frames A-B` makes one range's segment here, `once CLIP --join` joins them.

Deadline, OpenCue and Tractor cut a job into frame ranges and run one command
per range on whatever node they choose, with no Dask in between. Each task
makes the segment of its range exactly as a Dask worker does (the same
decode by presentation time, checked; the same intra-only kind; the same
name, keyed by everything its pixels depend on) into the depth clip's hidden
segments folder (`.A001_depth.mov.farm/`), and the last task joins them with
the Dask client's own join (`segments.join`: the source's timing, timecode
and pixel aspect, renamed into place only whole).

Frame numbers are the ones the clip's image sequence gets: frame k of the clip
(presentation order, as `clipindex` lists it) is `output.first_frame + k`, so
`--frames 1001-1100` with `first_frame: 1001` is the clip's first 100 frames.

A range task has no client planning the whole clip, so it plans its shots
from what it sees: its range and MARGIN frames on each side (decoded and run
through the model, not written). A shot wholly inside that view gets the
maps local `once CLIP` makes; a shot longer than it, cut by the range's edge,
is planned from the part it sees, and its maps near the edge can differ
(docs/farm.md says by how much).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from depthwatch.batch.inputs import frame_range
from depthwatch.batch.taskprogress import TaskProgress
from depthwatch.clips import ClipIndex, ClipJob, ClipRange, rangepass, read_index, segments, timeline
from depthwatch.errors import ConfigError, FrameError, OutputError
from depthwatch.files import sha256_of, temp_name_for
from depthwatch.frames import ownership
from depthwatch.frames.job import signature_of
from depthwatch.frames.settings import Settings
from depthwatch.imaging import normalise, render, stabilise
from depthwatch.logtext import shown
from depthwatch.media import cliprecord, clipwrite, sourcemeta, video
from depthwatch.model.engine import Engine

#: Frames seen beyond each edge of a range (the planner's window and look-ahead): a shot
#: that fits in the range plus these is planned as on the whole clip.
MARGIN = stabilise.held_at_most()


def model_key(path: Path) -> str:
    """The model a range task's segment is keyed by: its file's name and digest (the join needs no engine)."""
    return f"range-task:{path.name}:{sha256_of(path)[:16]}"


def frames_of(spec: set[int], first_frame: int, count: int) -> tuple[int, int]:
    """[a, b): the clip's frames (from 0) a `--frames` range names; ConfigError unless one unbroken range inside the clip."""
    lo, hi = min(spec), max(spec)
    if hi - lo + 1 != len(spec):
        raise ConfigError("--frames on a clip takes one unbroken range (1001-1100), not a step or a list; cut the job into ranges")
    last = first_frame + count - 1
    if lo < first_frame or hi > last:
        raise ConfigError(
            f"--frames {lo}-{hi} is outside the clip's frames {first_frame}-{last} (numbered from output.first_frame); check the range"
        )
    return lo - first_frame, hi - first_frame + 1


def make_range(
    job: ClipJob, spec: set[int], engine: Engine, settings: Settings, index: ClipIndex, on_frame: Callable[[], None] | None = None
) -> str:
    """The segment of the frames `spec` names, into the depth clip's segments folder; a line saying what was done.

    `on_frame`: called as each frame of the range is written (a job bundle's task reports its progress).
    """
    kind = depth_clip_kind(job)
    a, b = frames_of(spec, settings.first_frame, len(index))
    with video.Clip(job.source) as clip:
        meta = clip.info
    if ownership.made_as_depth_clip(job.source, meta.comment):
        raise FrameError("is a depth clip depthwatch made; not taken as a clip")
    # Turned upright for the model by its display matrix; the segment stores its maps turned back.
    meta = replace(meta, display_matrix=sourcemeta.read(job.source, meta.rate).display_matrix)
    st = os.stat(job.source)
    version = (st.st_size, st.st_mtime_ns)
    info = engine.wait_ready()
    folder = segments.folder_for(job.final)
    key = segments.key(version, a, index.times[a:b], settings, job.output, model_key(info.spec.path))
    target = folder / segments.name(a, b - a, key, job.output)
    numbers = f"frames {settings.first_frame + a}-{settings.first_frame + b - 1}"
    if target.is_file():
        return f"{shown(job.source.name)}: {numbers}: already made (segment {target.name})"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make the segments' folder {shown(folder)}: {exc.strerror or exc}") from None
    stable = settings.normalise == normalise.STABLE
    margin = MARGIN if stable else 0
    lo, hi = max(0, a - margin), min(len(index), b + margin)
    seen = ClipRange(str(job.source), lo, index.times[lo:hi], index.seek_for(lo), version, meta.shown_size, meta.display_matrix)
    kind_out = info.profile.predicts
    clip_percent = settings.render.clip_percent
    frames = ((k, image, inference.prediction) for k, (image, inference) in enumerate(rangepass.inferred(seen, engine), lo))
    if stable:
        planned = (
            (k, image, nearness)
            for (k, image), nearness, _first in stabilise.stabilised(
                (((k, image), stabilise.summarise(p, kind_out, image, clip_percent), p) for k, image, p in frames), kind_out, clip_percent
            )
        )
    else:
        planned = ((k, image, normalise.frame(p, kind_out, clip_percent)) for k, image, p in frames)
    options = replace(settings.render, bits=16)
    temp = segments.part_for(target)
    writer: clipwrite.ClipWriter | None = None
    try:  # the writer made inside: a SIGTERM as it returns still finds its file removed
        writer = clipwrite.ClipWriter(temp, kind, replace(meta, timecode=None))
        for k, image, nearness in planned:
            if a <= k < b:
                writer.write(meta.stored(render.render(nearness, meta.shown_size, options, guide=image)))
                if on_frame is not None:
                    on_frame()
            if k == b - 1:
                break  # the margin after the range has done its part: no more decoding
        writer.close()
        writer = None
        os.replace(temp, target)
    except BaseException:
        if writer is not None:
            writer.abort()
        temp.unlink(missing_ok=True)
        raise
    return f"{shown(job.source.name)}: {numbers}: segment written ({b - a} frames, planned from frames {settings.first_frame + lo}-{settings.first_frame + hi - 1})"


def join(job: ClipJob, settings: Settings, model: Path, requeued: bool = False) -> int:
    """The range tasks' segments joined into the depth clip, in place only whole; its frames.

    Only segments of this version of the clip, these settings and this model
    count; they must cover every frame once, or nothing is written (one line
    saying which frames are missing). `requeued`: a job bundle's join, which
    runs only once all its range tasks are through, so segments missing while
    the depth clip in place was made from this version of the clip mean this
    join ran before (a farm running it again): it is done, and the segments a
    range task run again since then left are removed. Returns 0 then.
    """
    depth_clip_kind(job)
    if settings.timeline:
        timeline.check(job.sequence)  # before the work, as local once and the farm client do
    index = read_index(job.source)
    with video.Clip(job.source) as clip:
        meta = clip.info
    st = os.stat(job.source)
    version = (st.st_size, st.st_mtime_ns)
    folder = segments.folder_for(job.final)
    mine = model_key(model)
    found: dict[int, tuple[int, Path]] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for name in names:
        parsed = segments.parse(name)
        if parsed is None:
            continue
        first, count, digest = parsed
        if first + count <= len(index) and segments.key(version, first, index.times[first : first + count], settings, job.output, mine) == digest:
            found[first] = (count, folder / name)
    ordered: list[Path] = []
    ordered_first: list[tuple[int, int]] = []  # the frames [a, b) of each segment taken, in order
    k = 0
    while k < len(index):
        if k not in found:
            end = min((f for f in found if f > k), default=len(index))
            n0 = settings.first_frame
            over = next(((f, c) for f, (c, _) in sorted(found.items()) if f < k < f + c), None)
            if over is not None:  # a segment reaches into the one before's frames: the ranges overlap
                a, b = ordered_first[-1] if ordered_first else (0, 0)
                raise FrameError(
                    f"the segments of frames {n0 + a}-{n0 + b - 1} and {n0 + over[0]}-{n0 + over[0] + over[1] - 1} overlap "
                    f"(frames {n0 + over[0]}-{n0 + b - 1} are in both): the range tasks must cover every frame once; "
                    "run them again as ranges that do not overlap, then join"
                )
            if requeued and os.path.isfile(job.final) and cliprecord.made_from(job.final) == signature_of(job.source):
                segments.remove_folder(folder)
                return 0
            raise FrameError(
                f"no segment of frames {n0 + k}-{n0 + end - 1} for this version of the clip, these settings and this model "
                f"in {shown(folder)}; run their range task (once CLIP --frames {n0 + k}-{n0 + end - 1}) and join again"
            )
        count, path = found[k]
        ordered.append(path)
        ordered_first.append((k, k + count))
        k += count
    temp = temp_name_for(job.final)
    timing = sourcemeta.read(job.source, meta.rate)
    try:
        written = segments.join(ordered, job.final, temp, meta, timing, signature_of(job.source), job.source)
        if written != len(index):
            raise FrameError(f"the joined segments hold {written} frames where the clip has {len(index)}; run the range tasks again")
        segments.put_in_place(temp, job.final)
    finally:
        temp.unlink(missing_ok=True)
    segments.remove_folder(folder)
    if settings.timeline:  # --timeline, output.timeline: the join writes it too, as local once does
        shown_as = replace(meta, display_matrix=timing.display_matrix)  # a turned clip's timeline is upright
        timeline.write(job.source, job.final, shown_as, timing.length(written, meta.rate), job.output_roots, timing.lead(meta.rate))
    return written


def depth_clip_kind(job: ClipJob) -> clipwrite.Kind:
    kind = segments.segment_kind(job.output)
    if kind is None:
        raise ConfigError(
            "--frames and --join on a clip make and join segments of a depth clip (-o NAME.mov, .mkv or .mp4); "
            "for an image sequence run once CLIP -o '{frame:04d}.png' on one node, or once --farm"
        )
    return kind


def run(jobs: list[ClipJob], frames: str | None, do_join: bool, config: Any, task: bool = False) -> int:
    """`once CLIP --frames A-B` (make one range's segment) or `once CLIP --join`; the clips that failed.

    `task`: run as a job bundle's task (`--openjd`): OpenJD's progress and status lines as it
    goes, and a join run again once done says so and succeeds.
    """
    from depthwatch.errors import DepthwatchError
    from depthwatch.model import catalogue

    settings = Settings.from_config(config)
    spec = catalogue.resolve(config.model, config.base)
    failed = 0
    if do_join:
        for job in jobs:
            try:
                if task:
                    print(f"openjd_status: joining the segments of {shown(job.source.name)}", flush=True)
                written = join(job, settings, spec.path, requeued=task)
                beside = " (and its timelines, .otio and .fcpxml)" if settings.timeline else ""
                if written == 0:
                    print(f"depthwatch: {shown(job.source.name)} -> {shown(job.final.name)}: already joined", flush=True)
                else:
                    print(f"depthwatch: {shown(job.source.name)} -> {shown(job.final.name)}{beside}: {written} frames joined", flush=True)
                if task:
                    print("openjd_progress: 100.0", flush=True)
            except DepthwatchError as exc:
                print(f"depthwatch: {shown(job.source)}: {exc}", file=sys.stderr)
                failed += 1
        return failed
    assert frames is not None
    wanted = frame_range(frames)
    indexes = []
    for job in jobs:  # a range the clip does not have is a typing mistake: said before the model loads
        depth_clip_kind(job)
        indexes.append(read_index(job.source))
        frames_of(wanted, settings.first_frame, len(indexes[-1]))
    with Engine(spec) as engine:
        engine.wait_ready()
        for job, index in zip(jobs, indexes):
            a, b = frames_of(wanted, settings.first_frame, len(index))
            progress = TaskProgress(b - a, "frames of the range written") if task else None
            try:
                print(f"depthwatch: {make_range(job, wanted, engine, settings, index, progress.update if progress else None)}", flush=True)
                if progress is not None and progress.done < progress.total:  # its segment was already made
                    progress.update(progress.total - progress.done)
            except (DepthwatchError, OSError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                print(f"depthwatch: {shown(job.source)}: {why}", file=sys.stderr)
                failed += 1
    return failed

