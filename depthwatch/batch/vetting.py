"""What `once` refuses before any work (outputs that clash, clips it cannot take), and what a killed `once` left.

A clash stops the whole run with one ConfigError and nothing written: a clip
refused only after it was mapped would have cost its whole length, and a map
refused only at its write would leave the run half done under a template
that clashes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from depthwatch.batch.inputs import is_depth_clip, rules_for
from depthwatch.errors import ConfigError, FrameError
from depthwatch.frames import ownership
from depthwatch.frames.replacing import map_refusal_at
from depthwatch.frames.rules import Claims
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch.once")


def clip_jobs(clips: list[Path], config: Any) -> tuple[list[Any], list[str]]:
    """Each clip's job, and a line for each clip refused; ConfigError, before any work, for a clash.

    Two clips for one depth clip (`A.mp4` and `A.mov` under `{stem}_depth.mov`), or
    an output that is a file depthwatch did not make, stop the run as a clash of
    frames does (nothing is written).
    """
    from depthwatch.clips import ClipJob, timeline

    rules = rules_for((c.parent for c in clips), config.output.template, config.output.clip_template)
    inputs = {os.path.realpath(c) for c in clips}
    jobs: list[Any] = []
    refused: list[str] = []
    claims = Claims()
    for clip in clips:
        try:
            output = rules.output_for(clip)
        except FrameError as exc:
            refused.append(f"{shown(clip)}: {exc}")
            continue
        if os.path.realpath(output) in inputs:
            refused.append(f"{shown(clip)}: its output {shown(output)} is an input clip; give another -o")
            continue
        if is_depth_clip(clip):
            refused.append(f"{shown(clip)}: is a depth clip depthwatch made; not taken as a clip")
            continue
        job = ClipJob(clip, output)
        if not claims.claim(job.final, clip, "depth clip", ".mov", " (nothing was written)"):
            continue
        if os.path.lexists(job.final) and not ownership.is_depth_clip(job.final):
            raise ConfigError(
                f"{shown(clip)}: its output {shown(job.final)} is not a depth clip depthwatch made; "
                "not replacing it: give another -o (nothing was written)"
            )
        why = timeline.refusal(job.final) if config.output.timeline else None
        if why:
            raise ConfigError(f"{shown(clip)}: {why}; give another -o or leave out --timeline (nothing was written)")
        jobs.append(job)
    return jobs, refused


def refuse_replacing(jobs: list[Any]) -> None:
    """ConfigError, before anything is written, if a map would replace a file depthwatch did not make.

    A folder's files named like outputs are left out of the inputs, so under
    `-o '{stem}.png'` the master shot.png beside shot.jpg is no frame, and
    would be shot.jpg's map; a photo x_depth.jpg beside x.jpg likewise. The
    writer refuses such a file anyway; saying so first means nothing at all
    is written under a template that clashes.
    """
    clashes = [(job, reason) for job in jobs if (reason := map_refusal_at(job.output))]
    if not clashes:
        return
    job, reason = clashes[0]
    more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
    raise ConfigError(
        f"{shown(job.source)}: its output {shown(job.output)} {reason}{more}; give another -o (nothing was written)"
    )


def sweep_left_behind(outputs: Iterable[Path]) -> None:
    """Remove what a killed depthwatch left beside these outputs: its temporary files and sequence folders.

    The daemon sweeps its folders at every start; a `once` killed mid-run has
    no next start of its own, so the next `once` writing beside it sweeps
    instead (only dead writers' files, and a whole sequence a kill left aside
    mid-swap goes back to its name first: `writer.sweep_temp_files`).
    """
    from depthwatch.frames.writer import sweep_temp_files

    for folder in dict.fromkeys(output.parent for output in outputs):
        swept, left = sweep_temp_files(folder)
        if swept:
            log.info("removed %d temporary file(s) a stopped depthwatch left in %s", swept, shown(folder))
        if left:
            log.warning("cannot remove %d temporary file(s) left in %s (is the folder writable?)", left, shown(folder))
