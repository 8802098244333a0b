"""The clips `once` maps here: each clip to its depth clip, one after the other, with a bar each.

The engine is the frames' own when the run had frames (the model loads once),
else one started for the clips alone.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from depthwatch.batch.progress import ClipBar, clips_summary
from depthwatch.batch.vetting import sweep_left_behind


def run(jobs: list[Any], refused: list[str], config: Any, engine: Any = None) -> int:
    """Each clip to its depth clip (`refused`: a line for each clip refused, said first); returns the failures."""
    from depthwatch.clips import make_clip
    from depthwatch.frames.settings import Settings
    from depthwatch.model import catalogue
    from depthwatch.model.engine import Engine

    began = time.monotonic()
    for line in refused:
        print(f"depthwatch: {line}", file=sys.stderr)
    failed, frames = len(refused), 0
    settings = Settings.from_config(config)
    sweep_left_behind(job.final for job in jobs)
    own = engine is None and bool(jobs)
    if own:
        engine = Engine(catalogue.resolve(config.model, config.base)).start()
    try:
        if jobs:
            engine.wait_ready()
        for job in jobs:
            with ClipBar(job) as bar:
                result = make_clip(job, engine, settings, on_progress=bar.update)
            if result.ok:
                frames += result.frames
            else:
                failed += 1
                print(f"depthwatch: {result.describe()}", file=sys.stderr)
    finally:
        if own:
            engine.stop()
    clips_summary(len(jobs) + len(refused) - failed, frames, failed, began)
    return failed
