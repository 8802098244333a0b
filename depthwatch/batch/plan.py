"""A `once` run's frames made ready, here or for the farm: the range taken, each frame's job, the sequences to plan.

Everything that can refuse the run (a range with no frames, two frames for
one map, a map that would replace a file depthwatch did not make) is said
here, before the model loads and before anything is written.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthwatch.batch.inputs import in_range, rules_for
from depthwatch.batch.passes import with_margin
from depthwatch.batch.progress import bar, say
from depthwatch.batch.vetting import refuse_replacing, sweep_left_behind
from depthwatch.errors import ConfigError
from depthwatch.frames.job import Job
from depthwatch.frames.rules import Rules
from depthwatch.frames.settings import Settings
from depthwatch.imaging.normalise import STABLE
from depthwatch.logtext import shown


@dataclass
class Plan:
    """The frames of one run, ready to map."""

    #: The frames this run maps (under --frames, those in the range).
    sources: list[Path]
    #: Each frame's job; a frame refused by the rules has none.
    jobs: list[Job]
    #: A line for each frame that failed: those refused first, then those the run fails (appended as it goes).
    failures: list[str]
    #: Each sequence to plan: its jobs, and the frames whose maps are written (None: all of them).
    planned: list[tuple[list[Job], set[Path] | None]]
    rules: Rules
    settings: Settings
    #: The frames' bar (or OpenJD's lines), the refused already counted.
    progress: Any
    #: When the mapping began (time.monotonic), for the summary line.
    began: float

    @property
    def by_source(self) -> dict[Path, Job]:
        return {job.source: job for job in self.jobs}


def prepare(
    sources: list[Path], inputs: list[str], frames: str | None, config: Any, left_out: list[str], *, farm: bool, openjd: bool
) -> Plan:
    """The plan for `sources` (the stills and numbered frames `inputs` named), in the range `frames` if given.

    `left_out`: the lines on files of input folders left out, said once the run
    is not refused. `farm`: the frames go to a farm, whose client sweeps what
    its workers left once its job is over; here, what a killed `once` left is
    swept first. `openjd`: OpenJD's lines instead of a bar.
    """
    from depthwatch.frames import sequences

    numbered = sources  # every frame named: a range task's shots are planned with the frames about it
    if frames:
        sources = in_range(sources, frames)
        if not sources:
            raise ConfigError(f"no frames numbered {frames} in " + ", ".join(inputs) + "; check the range and the names")
    rules = rules_for((s.parent for s in sources), config.output.template, config.output.clip_template, config.output.error_sidecar)
    settings = Settings.from_config(config)
    jobs, refused = rules.jobs_for(sources)  # ConfigError if two frames share an output
    failures = [f"{shown(source)}: {why}" for source, why in refused]
    refuse_replacing(jobs)
    say(left_out)
    if not farm:
        sweep_left_behind(job.output for job in jobs)
    began = time.monotonic()
    progress = bar(len(sources), openjd)
    for line in failures:
        progress.write(f"depthwatch: {line}", file=sys.stderr)
        progress.update(1)
    by_source = {job.source: job for job in jobs}
    planned: list[tuple[list[Job], set[Path] | None]] = []
    if settings.normalise == STABLE and frames:
        # A range task's frames belong to the sequences of all the frames named, even one alone in its
        # range (a chunk of one frame): planned with the frames about it, never as a still, here and on the farm.
        for whole in sequences.sequences(numbered)[0]:
            if any(path in by_source for path in whole.paths):
                planned.append(with_margin(whole, by_source, rules))
    return Plan(sources, jobs, failures, planned, rules, settings, progress, began)
