"""What the scheduler runs on a depthwatch worker: a few frames per task, as paths.

Pixels never cross the network: a task names frames and outputs on storage
every worker sees (already in the workers' view of it, see `pathmap`), and its
result is one small `Outcome` per frame. The work itself is done by the
worker's `FrameRunner` (see `worker`), found through the worker's plugin, so a
task never loads a model or starts a thread of its own.

Where shot-stable normalisation (issue 14's offline planner) fits: a first
pass of these tasks returns each frame's small summary in `Outcome.summary`
(about 10 KB, at model resolution); the client groups the outcomes by shot and
plans each shot's parameters from the summaries alone; a second, light pass
sends one task per shot, which applies the parameters frame by frame, in
order, on one worker. Frames of one shot on different workers in the first
pass then still get one shot's grey levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from depthwatch.pipeline import Settings

#: The plugin's name on the worker, and the resource a depthwatch worker offers
#: (tasks ask for it, so a plain Dask worker on the same scheduler never gets one).
PLUGIN = "depthwatch"
RESOURCE = "depthwatch"


@dataclass(frozen=True)
class FrameTask:
    """One frame to map: its index in the client's list, and both paths in the workers' view."""

    index: int
    source: str
    output: str


@dataclass(frozen=True)
class Outcome:
    """What became of one frame, as the client needs it for its line and its tally."""

    index: int
    #: None when the map was written (or already up to date).
    error: str | None = None
    #: The map was already up to date when the worker got to it (a task run again
    #: after its first worker died, or frames another run finished meanwhile).
    up_to_date: bool = False
    #: The worker's own log line for the frame (timings), or its error line.
    line: str = ""
    worker: str = ""
    #: Room for a second, light pass over a shot (shot-stable normalisation): a
    #: small per-frame summary of the prediction at model resolution. None today.
    summary: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None


def render_frames(frames: list[FrameTask], settings: Settings, force: bool = False) -> list[Outcome]:
    """The task: map `frames` on this worker with the client's output `settings`."""
    from distributed import get_worker

    worker = get_worker()
    plugin = worker.plugins.get(PLUGIN)
    if plugin is None:  # only reachable if someone gives a plain worker the resource by hand
        raise RuntimeError(f"{worker.address} is not a depthwatch worker; start workers with `depthwatch worker`")
    return plugin.runner.render(frames, settings, force)
