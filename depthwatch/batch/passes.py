"""A sequence's two passes with `output.normalise: stable`: the model and a summary of each frame, then its map.

Pass 1 runs the model and keeps its small stabilise.Summary and its
prediction (float16 at model resolution); the shot planner
(`stabilise.stabilised`, which the farm shares) takes them in frame order,
finds the cuts with a few frames of look-ahead, and gives each frame's map
back once the frames it depends on are in; pass 2 renders and writes it. Both
passes run together, a bounded number of frames apart, so a sequence of any
length holds a few dozen predictions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from depthwatch.errors import DepthwatchError
from depthwatch.frames.rules import Rules


def with_margin(whole: Any, by_source: dict[Path, Any], rules: Rules) -> tuple[list[Any], set[Path]]:
    """A range task's frames of the sequence `whole`, for the shot planner, and those whose maps are written.

    A range task (`--frames 1001-1050`, a farm manager's cut): the planner
    also sees the sequence's frames up to `stabilise.held_at_most()` on each
    side (run through the model, not written), as a clip's range task does,
    so a shot split between two tasks gets the grey levels it gets in one
    run; a task that planned its own frames alone would make the levels jump
    at every task's edge (a step between neighbouring maps three to five
    times the usual).
    """
    from depthwatch.imaging import stabilise

    paths = whole.paths
    mine = [i for i, p in enumerate(paths) if p in by_source]
    written = {paths[i] for i in mine}
    around = stabilise.held_at_most()
    seen = paths[max(0, mine[0] - around) : mine[-1] + around + 1]
    try:
        context, _refused = rules.jobs_for([p for p in seen if p not in written])
    except DepthwatchError:  # frames beyond the range that cannot be read as planned: the range alone
        return [by_source[p] for p in paths if p in written], written
    made = {job.source: job for job in context}
    return [by_source[p] if p in written else made[p] for p in seen if p in written or p in made], written


def sequence(
    pipeline: Any, jobs: list[Any], written_only: set[Path] | None, settings: Any, report: Any, only: set[Path] | None = None
) -> tuple[set[Path], list[list[Any]]]:
    """Model and summary for each frame, then its map and write, in frame order, with bounded memory.

    `stabilise.stabilised` (the shot planner the farm shares) takes the
    frames in order and gives each map back as soon as the frames it depends
    on are in; pass 1 runs at most `pipeline.in_flight` frames ahead of it.
    So the predictions held at once are bounded (`stabilise.held_at_most()`
    plus those in flight), whatever the sequence's length, and none is computed twice.

    Pass 2 reads each frame again and takes only the version pass 1 ran the
    model on (its signature): a frame rewritten in between would otherwise get
    the old version's depth, the new one's edges, and a record naming the new
    one, which no resume would redo. Such frames are added to the first set
    returned as their pass 2 reports (the shots as planned come second, for
    `again` to map them from the version there now). `only`: that second
    time, over one shot; only these frames are mapped (the rest of the shot
    keeps its maps), and one rewritten yet again fails.
    """
    from depthwatch.imaging import stabilise

    changed: set[Path] = set()
    shots: list[list[Any]] = []

    def written(done: Future[Any]) -> None:
        result = done.result()
        if result.superseded and only is None:  # rewritten since pass 1: its shot is planned again
            changed.add(result.job.source)
            return
        if result.superseded:
            result.error = "changed again while its shot was being mapped again; no map written (map it once it is settled)"
        report(done)

    keep = only if only is not None else written_only  # frames whose maps are written (None: every one)
    collected_one = report if keep is None else (lambda done: report(done) if done.result().job.source in keep else None)
    kind = pipeline.engine.wait_ready().profile.predicts
    maps = stabilise.stabilised(collected(pipeline, jobs, settings, collected_one), kind, settings.render.clip_percent)
    for job, nearness, first in maps:
        if first or not shots:
            shots.append([])
        shots[-1].append(replace(job, signature=None))
        if keep is None or job.source in keep:
            pipeline.submit(replace(job, nearness=nearness), settings).add_done_callback(written)
    return changed, shots


def again(pipeline: Any, changed: set[Path], shots: list[list[Any]], settings: Any, report: Any) -> None:
    """The frames rewritten between their two passes, mapped from the version there now.

    Their shot goes through both passes again (its plan, its grey levels,
    come from every frame of it), and only they are written.
    """
    for shot in shots:
        if changed.intersection(job.source for job in shot):
            sequence(pipeline, shot, None, settings, report, only=changed)


def collected(pipeline: Any, jobs: Any, settings: Any, report: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(job, summary, prediction) of each frame that the model ran on, in frame order; a failed one is reported.

    Each job comes back with the signature of the version the model ran on, for pass 2 to read that one.
    """
    ahead: deque[tuple[Any, Future[Any]]] = deque()
    for job in jobs:
        ahead.append((job, pipeline.submit(replace(job, collect=True), settings)))  # blocks while full
        while len(ahead) > pipeline.in_flight:
            yield from _one(*ahead.popleft(), report)
    while ahead:
        yield from _one(*ahead.popleft(), report)


def _one(job: Any, future: Future[Any], report: Any) -> Iterator[tuple[Any, Any, Any]]:
    result = future.result()
    if not result.ok:
        report(future)
        return
    summary, prediction = result.summary, result.prediction
    result.summary = result.prediction = None  # held by the planner from here, and only as long as it needs
    yield replace(job, signature=result.signature), summary, prediction
