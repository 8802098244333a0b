"""What the scheduler runs on a depthwatch worker: a few frames per task, as paths.

Pixels never cross the network: a task names frames and outputs on storage
every worker sees (already in the workers' view of it, see `pathmap`), and its
result is one small `FrameReport` per frame. The work itself is done by the
worker's `FrameRunner` (see `worker`), found through the worker's plugin, so a
task never loads a model or starts a thread of its own.

Shot-stable maps (`output.normalise: stable`, see `stabilise`) take two passes
over a numbered sequence, so a shot split over several workers still gets one
shot's grey levels: `collect_frames` runs the model and returns each frame's
small summary (a 160-pixel thumbnail, for the optical flow and the cuts) and its
prediction at model resolution (float16, about 100 KB: the model's output,
never the frame's pixels) without writing anything; the client takes them in
frame order through the shot planner (`stabilise.stabilised`) and makes each
frame's [0, 1] map (cheap, at model resolution); `render_frames` with those maps
in the tasks then only decodes the frames (the edge-aware upscale needs them),
renders and writes, and only the version of each frame its first pass saw (a
frame rewritten in between comes back `changed`, and the client maps it again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.frames.job import Job, Signature
from depthwatch.frames.settings import Settings
from depthwatch.pathmap import PathMap

#: The plugin's name on the worker, and the resource a depthwatch worker offers
#: (tasks ask for it, so a plain Dask worker on the same scheduler never gets one).
PLUGIN = "depthwatch"
RESOURCE = "depthwatch"


@dataclass(frozen=True)
class FrameTask:
    """One frame to map: its index in the client's list, and its job's paths in the workers' view.

    The job itself is made once, by the client's rules (`Rules.job_for`); a
    task carries it across, roots included, and `job()` makes it again on the worker.
    """

    index: int
    source: str
    output: str
    #: The second pass of a shot-stable sequence: the frame's [0, 1] nearness map, made
    #: by the client from the shot's plan (model resolution); None: the usual way.
    nearness: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: The job's `link_root` and `output_roots`, in the workers' view.
    link_root: str | None = None
    output_roots: tuple[str, ...] = ()
    #: With `nearness`: the version of the frame its first pass ran the model on (as the
    #: worker saw it); another version there now is not mapped with this nearness.
    signature: Signature | None = None
    #: The job's error record (`output.error_sidecar`), in the workers' view; None: none written.
    error_record: str | None = None

    @classmethod
    def of(
        cls, index: int, job: Job, path_map: PathMap, nearness: np.ndarray | None = None, signature: Signature | None = None
    ) -> FrameTask:
        """The task for the client's `job`, with every path in the workers' view."""
        return cls(
            index,
            path_map.to_worker(job.source),
            path_map.to_worker(job.output),
            nearness,
            None if job.link_root is None else path_map.to_worker(job.link_root),
            tuple(path_map.to_worker(root) for root in job.output_roots),
            signature,
            None if job.error_record is None else path_map.to_worker(job.error_record),
        )

    def job(self, collect: bool = False) -> Job:
        """The client's job again, on the worker (`collect`: a shot-stable sequence's first pass)."""
        return Job(
            Path(self.source),
            Path(self.output),
            None if self.error_record is None else Path(self.error_record),
            link_root=None if self.link_root is None else Path(self.link_root),
            output_roots=tuple(Path(root) for root in self.output_roots),
            signature=self.signature,
            collect=collect,
            nearness=self.nearness,
        )


@dataclass(frozen=True)
class FrameReport:
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
    #: `collect_frames` only: the frame's stabilise.Summary, its prediction (float16, model
    #: resolution) and what the prediction means (the profile's `predicts`).
    summary: Any = None
    prediction: np.ndarray | None = field(default=None, repr=False)
    kind: str = ""
    #: `collect_frames`: the version of the frame the model ran on. A second pass: the frame
    #: was no longer that version (rewritten since), so nothing was written for it.
    signature: Signature | None = None
    changed: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def render_frames(frames: list[FrameTask], settings: Settings, force: bool = False) -> list[FrameReport]:
    """The task: map `frames` on this worker with the client's output `settings`."""
    return runner().render(frames, settings, force)


def collect_frames(frames: list[FrameTask], settings: Settings) -> list[FrameReport]:
    """The task of a shot-stable sequence's first pass: the model's view of each frame, nothing written."""
    return runner().render(frames, settings, force=True, collect=True)


def runner() -> Any:
    """This worker's FrameRunner (its engine, loaded once; its pipeline; its counts), through the plugin."""
    from distributed import get_worker

    worker = get_worker()
    plugin = worker.plugins.get(PLUGIN)
    if plugin is None:  # only reachable if someone gives a plain worker the resource by hand
        raise RuntimeError(f"{worker.address} is not a depthwatch worker; start workers with `depthwatch worker`")
    return plugin.runner
