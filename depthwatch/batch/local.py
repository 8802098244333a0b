"""A `once` run's frames mapped here, then its clips: the model loaded once, one pipeline, each frame reported.

Stills, and everything in `frame` mode, get their own map each, exactly as
the daemon's per-frame path makes it; numbered frames under `stable` go
through `passes`. Frames rewritten between their two passes are mapped again
once every first pass is in, from the version there now.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from depthwatch.batch import cliploop
from depthwatch.batch.passes import again, sequence
from depthwatch.batch.plan import Plan
from depthwatch.batch.progress import summary
from depthwatch.imaging.normalise import FRAME, STABLE


def run(plan: Plan, config: Any, clip_jobs: list[Any], clip_refused: list[str]) -> int:
    """The plan's frames mapped, then the clips (`clip_refused`: a line for each clip refused); the exit code."""
    from depthwatch.frames import sequences
    from depthwatch.frames.pipeline import Pipeline
    from depthwatch.frames.result import Result
    from depthwatch.model import catalogue
    from depthwatch.model.engine import Engine

    clips = bool(clip_jobs or clip_refused)
    progress, failures, settings = plan.progress, plan.failures, plan.settings
    spec = catalogue.resolve(config.model, config.base)

    # Set at Ctrl-C or SIGTERM, before the engine stops: the frames that stop then fail with it, and
    # their lines would come after the one line `cli` says of the interrupt, as if a frame were at fault.
    interrupted = threading.Event()

    def report(done: Future[Result]) -> None:
        result = done.result()
        progress.update(1)
        if not result.ok and not interrupted.is_set():
            failures.append(result.describe())
            progress.write(f"depthwatch: {result.describe()}", file=sys.stderr)

    if not plan.jobs:  # every frame already failed: no model needed to say so
        progress.close()
        summary(len(plan.sources), len(failures), plan.began)
        if clips:
            cliploop.run(clip_jobs, clip_refused, config)
        return 1
    by_source = plan.by_source
    planned: list[tuple[list[Any], set[Path] | None]] = plan.planned
    if planned:
        in_sequences = {job.source for sequence_jobs, _ in planned for job in sequence_jobs}
        stills = [job.source for job in plan.jobs if job.source not in in_sequences]
    elif settings.normalise == STABLE:
        found, stills = sequences.sequences([job.source for job in plan.jobs])
        planned = [([by_source[p] for p in found_one.paths], None) for found_one in found]
    else:
        stills = [job.source for job in plan.jobs]
    with Engine(spec) as engine:
        engine.wait_ready()

        def started() -> Pipeline:
            return Pipeline(engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)

        try:
            pipeline = started()
            for source in stills:  # each its own map, exactly the per-frame one
                pipeline.submit(by_source[source], replace(settings, normalise=FRAME)).add_done_callback(report)
            passes = [sequence(pipeline, sequence_jobs, written, settings, report) for sequence_jobs, written in planned]
            pipeline.close()  # its threads joined, so every pass 2 has reported: the frames rewritten since pass 1 are known
            if any(changed for changed, _shots in passes):
                pipeline = started()
                for changed, shots in passes:
                    again(pipeline, changed, shots, settings, report)
                pipeline.close()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Terminated): `cli` says the one line
            interrupted.set()
            raise
        progress.close()
        clip_failures = cliploop.run(clip_jobs, clip_refused, config, engine) if clips else 0
    summary(len(plan.sources), len(failures), plan.began)
    return 1 if failures or clip_failures else 0
