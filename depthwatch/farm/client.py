"""`depthwatch once --farm`: the frames as tasks on a Dask scheduler, results as they come.

The client decides what to do, in its own view of the storage: which frames
need a map (a map no older than its frame is up to date, the daemon's start-up
rule, so an interrupted job run again resumes where it stopped), and where each
map goes (local `once`'s output rules). It sends only paths, rewritten to the
workers' view by `farm.path_map`, a few frames per task; the workers write the
maps atomically, straight onto the shared storage.

A task whose worker dies is rescheduled by Dask; the frames it had already
written are found up to date and not done twice.
"""

from __future__ import annotations

import itertools
import logging
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from depthwatch.config import Config
from depthwatch.errors import FarmError
from depthwatch.farm import require_distributed
from depthwatch.farm.tasks import (
    RESOURCE,
    FrameTask,
    FrameReport,
    collect_frames,
    render_frames,
)
from depthwatch.frames import sequences
from depthwatch.frames.job import Job
from depthwatch.frames.settings import Settings
from depthwatch.frames.rules import map_is_current
from depthwatch.frames.writer import sweep_temp_files_for
from depthwatch.imaging import normalise

log = logging.getLogger("depthwatch")

#: How long to wait for the scheduler to answer before saying it is not there.
CONNECT_TIMEOUT = "10s"

#: A frame rewritten between its passes, and again while its shot was planned again.
CHANGED_AGAIN = "changed again while its shot was being mapped again; no map written (map it once it is settled)"


def plan(jobs: Sequence[Job], force: bool, made_with: Sequence[str] | None = None, model: str | None = None) -> list[int]:
    """Indexes of the jobs whose map is missing, older than its frame or made under other settings (all, with `force`).

    `made_with`: per job, the settings digest its map is made with (`made_with_each`);
    `model`: the model file the workers run (`workers_model`), when they agree on one.
    """
    return [
        i for i, job in enumerate(jobs)
        if force or not map_is_current(job.source, job.output, made_with[i] if made_with is not None else None, model)
    ]


def workers_model(client: Any) -> str | None:
    """The name of the model file the farm's depthwatch workers run, as they report it; None if none
    has reported yet or they run different ones (each worker then judges its frames' maps itself)."""
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except Exception:  # noqa: BLE001 - no model known: the settings alone decide
        return None
    models = {
        Path(str(mine["model"])).name
        for mine in ((w.get("metrics") or {}).get("depthwatch") or {} for w in workers.values())
        if mine.get("model")
    }
    return models.pop() if len(models) == 1 else None


def made_with_each(jobs: Sequence[Job], settings: Settings) -> list[str]:
    """Each job's settings digest as its map is made: a still (in no numbered sequence) each on its own
    (`normalise: frame`, as local `once` maps it), a sequence's frames with the settings as they are."""
    if settings.normalise == normalise.FRAME:
        return [settings.made_with] * len(jobs)
    _, stills = sequences.sequences(job.source for job in jobs)
    alone, plain = set(stills), replace(settings, normalise=normalise.FRAME).made_with
    return [plain if job.source in alone else settings.made_with for job in jobs]


def tasks_for(jobs: Sequence[Job], todo: Sequence[int], config: Config) -> list[list[FrameTask]]:
    """`frames_per_task` frames per task, in order, with paths in the workers' view."""
    path_map = config.farm.path_map
    frames = [FrameTask.of(i, jobs[i], path_map) for i in todo]
    size = config.farm.frames_per_task
    return [frames[n : n + size] for n in range(0, len(frames), size)]


def connect(scheduler: str) -> Any:
    """A Dask client of the scheduler at `scheduler` (frames and clips alike), or one line saying what to do."""
    require_distributed()
    import distributed

    logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        return distributed.Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise FarmError(
            f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one with `dask scheduler` and check the address"
        ) from None


def run(
    scheduler: str,
    jobs: Sequence[Job],
    config: Config,
    *,
    force: bool = False,
    progress: Any = None,
    report: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
    counts: dict[str, int] | None = None,
    context: Sequence[Job] = (),
) -> int:
    """Map `jobs` on the farm; the number of frames that failed.

    `counts` gets `up_to_date`: the frames whose maps were already made (not written now), so a
    summary can tell them from the maps written. `context`: frames of the same sequences that the
    shot planner sees but whose maps are not written (a range task's frames about its range, as
    local `once --frames` plans them), so a shot cut between tasks keeps its grey levels.
    """
    require_distributed()
    import distributed

    settings = Settings.from_config(config)
    asked = len(jobs)
    jobs = [*jobs, *context]  # the context is planned with, never written: `todo` is of the jobs asked for
    made_with = made_with_each(jobs, settings)
    client = connect(scheduler)
    try:
        model = workers_model(client)
        todo = plan(jobs[:asked], force, made_with[:asked], model)
    except BaseException:
        client.close()
        raise
    if counts is not None:
        counts["up_to_date"] = asked - len(todo)
    report(f"depthwatch: {asked} frame(s): {asked - len(todo)} up to date, {len(todo)} to map on {scheduler}")
    if progress is not None:
        progress.update(asked - len(todo))
    if not todo:
        client.close()
        return 0
    plain, shots = _split(jobs, todo, settings)
    run_id = uuid.uuid4().hex[:8]
    serial = iter(range(1 << 62))
    todo_set = set(todo)
    failures = 0
    done_by: dict[str, int] = {}

    def submit(function: Any, batch: list[FrameTask], *args: Any) -> Any:
        return client.submit(
            function, batch, *args,
            key=f"depthwatch-{function.__name__}-{run_id}-{next(serial)}", pure=False, resources={RESOURCE: 1},
        )

    def tally(outcome: FrameReport) -> None:
        nonlocal failures
        job = jobs[outcome.index]
        if outcome.ok:
            done_by[outcome.worker] = done_by.get(outcome.worker, 0) + 1
        else:
            failures += 1
            line = f"depthwatch: {job.source}: {outcome.error}"
            if progress is not None:
                progress.write(line, file=sys.stderr)
            else:
                report(line)
        if progress is not None:
            progress.update(1)

    try:
        say_if_no_workers(client, scheduler, report)
        plain_settings = replace(settings, normalise=normalise.FRAME)  # stills: each its own map
        batch_of: dict[str, list[FrameTask]] = {}
        futures = []
        for batch in tasks_for(jobs, plain, config):
            future = submit(render_frames, batch, plain_settings, force)
            batch_of[future.key] = batch
            futures.append(future)
        completed = distributed.as_completed(futures, loop=client.loop)

        def both_passes(sequences: list[list[int]], mapped: set[int], completed: Any, planned: list[list[int]] | None = None) -> set[int]:
            """Each sequence's first pass (all queued at once), then its maps; the frames rewritten in between."""
            firsts = [
                [(batch, submit(collect_frames, batch, settings)) for batch in tasks_for(jobs, sequence, config)]
                for sequence in sequences
            ]
            for shot_tasks in firsts:  # second pass: each sequence's maps, a task at a time as the planner gives them
                for batch in _second_pass(jobs, shot_tasks, mapped, config, tally, planned):
                    second = submit(render_frames, batch, settings, force)
                    batch_of[second.key] = batch
                    completed.add(second)
            changed: set[int] = set()
            for future in completed:
                outcomes = _outcomes(future, batch_of.pop(future.key), jobs, made_with)
                future.release()
                for outcome in outcomes:
                    if outcome.changed and planned is not None:  # not the version its first pass saw
                        changed.add(outcome.index)
                    else:
                        tally(replace(outcome, error=CHANGED_AGAIN) if outcome.changed else outcome)
            return changed

        planned: list[list[int]] = []  # the shots, as the planner found them
        changed = both_passes(shots, todo_set, completed, planned)
        if changed:  # mapped from the version there now: their shots planned again, only they written
            report(f"depthwatch: {len(changed)} frame(s) rewritten or gone between the two passes; planning their shots again")
            again = [shot for shot in planned if changed.intersection(shot)]
            both_passes(again, changed, distributed.as_completed([], loop=client.loop))
        _report_workers(client, done_by, report)
    finally:
        client.close()
    # Every task has its answer: a temporary file of one of these maps is a killed worker's.
    sweep_temp_files_for(jobs[i].output for i in todo)
    return failures


def _split(jobs: Sequence[Job], todo: Sequence[int], settings: Settings) -> tuple[list[int], list[list[int]]]:
    """The frames mapped each on its own, and the shot-stable sequences (job indexes, in frame order).

    A sequence with any frame to map is planned from all its frames, the ones
    whose maps are up to date included, so the maps written now share the
    grey levels of the ones written by the earlier, interrupted run (the plan
    is a pure function of the model's output).
    """
    if settings.normalise == normalise.FRAME:
        return list(todo), []
    index_of = {job.source: i for i, job in enumerate(jobs)}
    found, _ = sequences.sequences(job.source for job in jobs)
    wanted = set(todo)
    shots = [[index_of[p] for p in seq.paths] for seq in found]
    shots = [shot for shot in shots if wanted.intersection(shot)]
    in_shots = {i for shot in shots for i in shot}
    return [i for i in todo if i not in in_shots], shots


def _second_pass(
    jobs: Sequence[Job],
    first_pass: list[tuple[list[FrameTask], Any]],
    todo: set[int],
    config: Config,
    tally: Callable[[FrameReport], None],
    planned: list[list[int]] | None = None,
) -> Iterator[list[FrameTask]]:
    """A sequence's render tasks, each as soon as the shot planner has made its frames' maps.

    The first-pass results are taken in frame order, one task's at a time, and
    go through `stabilise.stabilised` (the planner local `once` uses), so the
    client holds a bounded number of predictions whatever the sequence's length.
    Each task carries the version of the frame its first pass saw, so a frame
    rewritten since is not mapped from it (local once does the same). The
    shots, as the planner finds them, go into `planned`.
    """
    from depthwatch.imaging import stabilise

    size = config.farm.frames_per_task
    path_map = config.farm.path_map

    seen: dict[int, Any] = {}  # the version each frame's first pass saw, until its task is made

    def collected() -> Iterator[tuple[int, Any, Any, str]]:
        for batch, future in first_pass:
            outcomes = {o.index: o for o in _outcomes(future, batch)}
            future.release()
            for frame in batch:
                outcome = outcomes.get(frame.index)
                if outcome is None or not outcome.ok or outcome.summary is None:
                    if frame.index in todo:  # it fails alone, with its line; the shot is planned without it
                        tally(outcome or FrameReport(frame.index, "the farm returned nothing for it; run the command again to retry"))
                    continue
                seen[frame.index] = outcome.signature
                yield frame.index, outcome.summary, outcome.prediction, outcome.kind

    frames: list[FrameTask] = []
    source = collected()
    first = next(source, None)  # what the model's output means comes with the first frame's result
    if first is None:
        return
    kind = first[3]
    results = ((i, summary, prediction) for i, summary, prediction, _kind in itertools.chain([first], source))
    for i, nearness, start in stabilise.stabilised(results, kind, config.output.range_percentile):
        if planned is not None:
            if start:
                planned.append([])
            planned[-1].append(i)
        signature = seen.pop(i, None)
        if i in todo:
            frames.append(FrameTask.of(i, jobs[i], path_map, nearness, signature))
        if len(frames) == size:
            yield frames
            frames = []
    if frames:
        yield frames


def _outcomes(
    future: Any, batch: list[FrameTask], jobs: Sequence[Job] = (), made_with: Sequence[str] = ()
) -> list[FrameReport]:
    """The task's outcomes; a task that failed as a whole fails each of its frames with the reason.

    `jobs` (a pass that writes maps): a frame whose map is on disk, made from its version now and
    with these settings (`made_with`), was written by a worker whose answer was lost (the scheduler
    gone, its connection cut): it is counted written, not failed (else "0 written, 60 failed" with 56 on disk).
    `made_with`: per job (`made_with_each`).
    """
    try:
        return future.result()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        # KilledWorker: every worker that took the task died (distributed.scheduler.allowed-failures).
        reason = f"the farm could not map it ({type(exc).__name__}{': ' + first if first else ''}); run the command again to retry"
        return [
            FrameReport(frame.index, line="its map is on disk; the farm's answer was lost")
            if jobs and map_is_current(jobs[frame.index].source, jobs[frame.index].output, made_with[frame.index])
            else FrameReport(frame.index, reason)
            for frame in batch
        ]


def say_if_no_workers(client: Any, scheduler: str, report: Callable[[str], None]) -> None:
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    if not any(RESOURCE in (w.get("resources") or {}) for w in workers.values()):
        report(f"depthwatch: no depthwatch worker on {scheduler} yet; waiting (start one with `depthwatch worker {scheduler}`)")


def _report_workers(client: Any, done_by: dict[str, int], report: Callable[[str], None]) -> None:
    """One line per worker that mapped frames: what it reports to the scheduler, and its share."""
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except Exception:  # the summary is a courtesy; the maps are written
        workers = {}
    for address, count in sorted(done_by.items()):
        if not address:
            continue
        mine = (workers.get(address, {}).get("metrics") or {}).get("depthwatch") or {}
        if not mine:  # the scheduler is gone, or the worker with it: its share is known, its model not
            report(f"depthwatch: worker {address}: {count} frame(s)")
            continue
        model = mine.get("model") or "?"
        providers = ", ".join(mine.get("providers") or []) or "?"
        report(f"depthwatch: worker {address}: {count} frame(s), model {model.rsplit('/', 1)[-1]} on {providers}, {mine.get('model_loads', '?')} load(s)")
