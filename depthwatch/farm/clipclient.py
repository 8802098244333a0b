"""`depthwatch once --farm ADDR CLIP`: one clip split into ranges across the workers, joined frame-exact.

For each clip, in the client's view of the storage:

1. **Frame k everywhere.** `clipindex` lists the shown frames from the packet
   index (no decoding) and cuts ranges of `farm.frames_per_task` x
   RANGE_FACTOR frames; each task carries its frames' presentation times and
   the keyframe to start at, and the worker checks it decoded exactly those.
2. **Shot-stable, however it is split: two passes**, as for numbered
   sequences. The first pass (`collect_clip_range`) runs the model on each
   range and sends back thumbnails and predictions; the client takes them in
   frame order, a range at a time and a bounded number of ranges ahead,
   through the shot planner local `once` uses (`stabilise.stabilised`), and
   sends each range's maps out as soon as they are made: the second pass
   (`render_clip_range`) decodes the range again, renders and writes it as
   one intra-only segment (see `segments`).
3. **Joined** by copying packets (or, for H.264, one encode here) into a
   temporary file beside the depth clip, renamed into place only whole; an
   image sequence's ranges (folders of frames) linked into one new sequence
   folder, swapped in as local `once` swaps its own.

A range whose segment is already there under its key (an interrupted run)
is not rendered again; its first pass still runs, since the plan of its shot
needs every frame of it. A range that fails fails the clip with one line
each (the first pass goes on over the later ranges, so each failed range
has its line); the segments made are kept for the next run, and the clip's temporary
files go, whatever happened. Workers that die: Dask gives their tasks to
another, and a segment they finished is a whole file under its name.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.clips import ClipIndex, ClipRange, RangeReport, ranges, read_index, refuse_replacing, remove, rename_into_place, segments, timeline
from depthwatch.config import Config
from depthwatch.errors import DepthwatchError, FarmError
from depthwatch.farm.client import connect, say_if_no_workers
from depthwatch.farm.cliptasks import collect_clip_range, render_clip_range
from depthwatch.farm.tasks import RESOURCE
from depthwatch.files import temp_name_for
from depthwatch.frames import ownership
from depthwatch.frames.job import signature_of
from depthwatch.frames.settings import Settings
from depthwatch.frames.writer import sweep_temp_files_for
from depthwatch.imaging import codec, normalise, stabilise
from depthwatch.logtext import shown
from depthwatch.media import sourcemeta, video

#: A clip's range is this many times `farm.frames_per_task` frames (a frame of a clip costs a
#: decode from its keyframe on top of the model: ranges are longer than a sequence's tasks).
RANGE_FACTOR = 8
#: First-pass ranges queued ahead of the one the planner is taking, per worker (bounds the
#: predictions held on the workers and here, whatever the clip's length).
AHEAD_PER_WORKER = 2


@dataclass
class _Clip:
    """One clip's job on the farm, as the client tracks it."""

    job: Any
    meta: video.ClipInfo
    index: ClipIndex
    version: tuple[int, int]
    cuts: list[tuple[int, int]]
    folder: Path
    failed: list[str] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # first frame -> segment name


def run(
    scheduler: str,
    jobs: list[Any],
    config: Config,
    *,
    force: bool = False,
    report: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> int:
    """Make each clip job's depth clip on the farm; the number of clips that failed."""
    client = connect(scheduler)
    failures = 0
    settings = Settings.from_config(config)
    try:
        say_if_no_workers(client, scheduler, report)
        for job in jobs:
            began = time.monotonic()
            try:
                frames = _one_clip(client, job, config, settings, force, report)
            except DepthwatchError as exc:
                report(f"depthwatch: {shown(job.source)}: {exc}")
                failures += 1
                continue
            if frames is None:
                failures += 1
            else:
                seconds = time.monotonic() - began
                report(f"depthwatch: {shown(job.source.name)} -> {shown(job.final.name)}: {frames} frames in {seconds:.1f} s on the farm")
    finally:
        client.close()
    return failures


def _one_clip(client: Any, job: Any, config: Config, settings: Settings, force: bool, report: Callable[[str], None]) -> int | None:
    """One clip through both passes and the join; its frame count, or None when a range failed."""
    with video.Clip(job.source) as clip:
        meta = clip.info
    if ownership.made_as_depth_clip(job.source, meta.comment):
        raise DepthwatchError("is a depth clip depthwatch made; not taken as a clip")
    if meta.width * meta.height > settings.max_pixels:
        raise DepthwatchError(codec.over_pixels(meta.width, meta.height, settings.max_pixels))
    out_kind = segments.segment_kind(job.output)  # a kind the farm joins, before any work
    refuse_replacing(job.final, settings.timeline, job.source)  # before the work, not after it
    if settings.timeline:
        timeline.check(job.sequence)
    index = read_index(job.source)
    st = os.stat(job.source)
    version = (st.st_size, st.st_mtime_ns)
    source_meta = sourcemeta.read(job.source, meta.rate, keeps_times=not job.sequence)
    meta = replace(meta, display_matrix=source_meta.display_matrix)  # the workers turn an image sequence by it
    size = config.farm.frames_per_task * RANGE_FACTOR
    state = _Clip(job, meta, index, version, ranges(len(index), size), segments.folder_for(job.final))
    try:
        state.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DepthwatchError(f"cannot make the segments' folder {shown(state.folder)}: {exc.strerror or exc}") from None
    if force:
        segments.remove_folder(state.folder)
        state.folder.mkdir(parents=True, exist_ok=True)
    path_map = config.farm.path_map
    worker_source = path_map.to_worker(job.source)
    tasks = [
        ClipRange(str(worker_source), a, index.times[a:b], index.seek_for(a), version, meta.shown_size, meta.display_matrix)
        for a, b in state.cuts
    ]
    run_id = uuid.uuid4().hex[:8]
    serial = iter(range(1 << 62))
    workers = max(1, _worker_count(client))
    ahead = AHEAD_PER_WORKER * workers
    kept, rendered = 0, 0
    renders: deque[tuple[ClipRange, Any]] = deque()
    bar = _bar(len(index), job.source.name)

    def submit(function: Any, *args: Any) -> Any:
        if client.status in _GONE:  # a future of a closed client never finishes: the run would hang for good
            raise FarmError(scheduler_gone(client))
        return client.submit(
            function, *args, key=f"depthwatch-{function.__name__}-{run_id}-{next(serial)}", pure=False, resources={RESOURCE: 1}
        )

    def fail(task: ClipRange, why: str) -> None:
        line = f"depthwatch: {shown(job.source)}: frames {task.first}-{task.first + len(task.times) - 1}: {why}"
        state.failed.append(line)
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            report(line)

    def settle(task: ClipRange, future: Any) -> None:
        nonlocal rendered
        outcome = _result(future, client)
        future.release()
        if not outcome.ok:
            fail(task, outcome.error or "failed")
            return
        rendered += 1  # counted once made, not once sent
        if bar is not None:
            bar.update(len(task.times))

    def first_pass() -> Iterator[tuple[tuple[int, str, str], Any, np.ndarray]]:
        """((frame k, its range's model, what it predicts), summary, prediction) in frame order; none after a failed range."""
        queued: deque[tuple[ClipRange, Any]] = deque()
        pending = iter(tasks)
        for task in pending:
            queued.append((task, submit(collect_clip_range, task)))
            if len(queued) >= ahead:
                break
        while queued:
            task, future = queued.popleft()
            outcome = _result(future, client)
            future.release()
            nxt = next(pending, None)
            if nxt is not None:
                queued.append((nxt, submit(collect_clip_range, nxt)))
            if not outcome.ok:
                fail(task, outcome.error or "failed")
            if state.failed:
                continue  # the later ranges still run, for a line each that fails; no plan is made past a failure
            for k, (summary, prediction) in enumerate(zip(outcome.summaries, outcome.predictions)):
                yield (task.first + k, outcome.model, outcome.kind), summary, prediction

    maps: list[np.ndarray] = []
    current = 0  # the range whose maps are being gathered
    try:
        collected = first_pass()
        head = next(collected, None)  # what the model's output means comes with the first range's results
        kind = head[0][2] if head is not None else ""
        results = itertools.chain([head] if head is not None else [], collected)
        clip_percent = settings.render.clip_percent
        if settings.normalise == normalise.STABLE:
            planned = stabilise.stabilised(results, kind, clip_percent)
        else:  # each map on its own, as local clips make them in frame mode
            planned = ((key, normalise.frame(prediction, kind, clip_percent), False) for key, _summary, prediction in results)
        for (k, model, _kind), nearness, _start in planned:
            if state.failed:
                continue  # the plan past a failed range is not the whole clip's; the first pass goes on, to report
            maps.append(nearness)
            task = tasks[current]
            if len(maps) < len(task.times):
                continue
            name = segments.name(task.first, len(task.times), segments.key(version, task.first, task.times, settings, job.output, model), job.output)
            state.names[task.first] = name
            if (state.folder / name).exists():  # made by an earlier run (or a task of it that finished since)
                kept += 1
                if bar is not None:
                    bar.update(len(task.times))
            else:
                segment = str(path_map.to_worker(state.folder / name))
                frame_name = job.output.name if job.sequence else None
                renders.append((task, submit(render_clip_range, task, maps, settings, out_kind, meta, segment, frame_name)))
                while len(renders) > ahead:
                    settle(*renders.popleft())
            maps = []
            current += 1
        while renders:
            settle(*renders.popleft())
    finally:
        for task, future in renders:
            future.cancel()
        if bar is not None:
            bar.close()
        segments.remove_parts(state.folder)  # every task has its answer: a .part is a killed worker's
    if kept:
        report(f"depthwatch: {shown(job.source.name)}: {kept} of {len(tasks)} range(s) already made by an earlier run; {rendered} rendered")
    if state.failed or len(state.names) != len(tasks):
        if not state.failed:
            report(f"depthwatch: {shown(job.source)}: the farm returned fewer frames than the clip has; run the command again")
        report(f"depthwatch: {shown(job.source)}: {len(state.failed) or 1} range(s) failed; the ranges made are kept for the next run")
        try:
            state.folder.rmdir()  # only when no range was made
        except OSError:
            pass
        return None
    ordered = [state.folder / state.names[task.first] for task in tasks]
    temp = temp_name_for(job.final)
    try:
        if job.sequence:
            written = segments.join_sequence(ordered, temp, job.output.name)
        else:
            written = segments.join(ordered, job.final, temp, meta, source_meta, signature_of(job.source), job.source)
        if written != len(index):
            raise DepthwatchError(f"the joined segments hold {written} frames where the clip has {len(index)}; run the command again with --force")
        if job.sequence:  # marked whole and swapped in, keeping the user's files, as local once's sequence
            rename_into_place(temp, job.final, job.output_roots, job.output.name, settings.swap_folders)
        else:
            segments.put_in_place(temp, job.final)
    finally:
        remove(temp)
        sweep_temp_files_for([job.final])  # a killed earlier run's join
    segments.remove_folder(state.folder)
    if settings.timeline:
        timeline.write(job.source, job.final, meta, source_meta.length(written, meta.rate), job.output_roots, source_meta.lead(meta.rate))
    return written


#: A Dask client's states once its scheduler is gone (it closes itself after failing to reconnect).
_GONE = ("closing", "closed")
#: How often a wait for a range looks whether the scheduler is still there (seconds).
_LOOK_S = 2.0


def scheduler_gone(client: Any) -> str:
    return f"the Dask scheduler at {getattr(client, 'scheduler', None) and client.scheduler.address or '?'} is gone; the ranges made are kept: run the command again once it is back"


def _result(future: Any, client: Any = None) -> RangeReport:
    """A range's report; a failed one's line. Never waits for good on a scheduler that is gone: FarmError,
    once for the run (not a line for each range in flight, as the futures of a closed client fail one by one)."""
    try:
        while True:
            try:
                return future.result(timeout=_LOOK_S)
            except (TimeoutError, asyncio.TimeoutError):
                if client is not None and client.status in _GONE:
                    raise FarmError(scheduler_gone(client)) from None
    except FarmError:
        raise
    except Exception as exc:
        if client is not None and client.status in _GONE:
            raise FarmError(scheduler_gone(client)) from None
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return RangeReport(-1, f"the farm could not map it ({type(exc).__name__}{': ' + first if first else ''}); run the command again to retry")


def _worker_count(client: Any) -> int:
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return sum(1 for w in workers.values() if RESOURCE in (w.get("resources") or {}))


def _bar(total: int, name: str) -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", desc=name, file=sys.stderr)
