"""`once --farm`: a run's frames (`client`) and clips (`clipclient`) mapped on the farm, and what `once` says of them.

Only the frames and clips not up to date are sent unless `force`; so running
the same command again resumes an interrupted job.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from depthwatch.batch.plan import Plan
from depthwatch.batch.progress import clips_summary, summary


def run(scheduler: str, plan: Plan, clip_jobs: list[Any], clip_refused: list[str], config: Any, force: bool) -> int:
    """The plan's frames, then the clips, on the farm at `scheduler`; the exit code."""
    from depthwatch.farm import client

    counts = {"up_to_date": 0}
    # The frames about a range, planned with it and not written (`passes.with_margin`).
    context = [job for sequence_jobs, written in plan.planned for job in sequence_jobs if written and job.source not in written]
    try:
        farm_failures = (
            client.run(scheduler, plan.jobs, config, force=force, progress=plan.progress, counts=counts, context=context)
            if plan.jobs else 0
        )
    finally:
        plan.progress.close()
    summary(len(plan.sources), len(plan.failures) + farm_failures, plan.began, counts["up_to_date"])
    clip_failures = run_clips(scheduler, clip_jobs, clip_refused, config, force) if clip_jobs or clip_refused else 0
    return 1 if plan.failures or farm_failures or clip_failures else 0


def run_clips(scheduler: str, jobs: list[Any], refused: list[str], config: Any, force: bool) -> int:
    """Each clip to its depth clip on the farm (`refused`: a line for each clip refused, said first); the failures."""
    from depthwatch.farm import clipclient

    began = time.monotonic()
    for line in refused:
        print(f"depthwatch: {line}", file=sys.stderr)
    failed = len(refused) + (clipclient.run(scheduler, jobs, config, force=force) if jobs else 0)
    clips_summary(len(jobs) + len(refused) - failed, None, failed, began)
    return failed
