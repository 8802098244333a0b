"""What a depthwatch worker runs for a clip: one range's pass (`clips.rangepass`) on this worker's engine.

The two passes are the clip family's (`clips.rangepass`); a task adds only
the worker: its engine, loaded once in the worker's plugin, and its address,
which the client names when a range fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from depthwatch.clips import ClipRange, RangeReport, rangepass
from depthwatch.farm.tasks import runner
from depthwatch.frames.settings import Settings
from depthwatch.media import clipwrite
from depthwatch.media.video import ClipInfo


def collect_clip_range(task: ClipRange) -> RangeReport:
    """First pass on this worker: the model's view of each frame of the range, nothing written."""
    here = runner()
    return rangepass.collect(task, here.engine, _address(here))


def render_clip_range(
    task: ClipRange,
    maps: list[np.ndarray],
    settings: Settings,
    kind: clipwrite.Kind | None,
    meta: ClipInfo,
    segment: str,
    frame_name: str | None = None,
) -> RangeReport:
    """Second pass on this worker: the range's maps into one segment at `segment` (see `rangepass.render`)."""
    here = runner()
    return rangepass.render(task, maps, settings, kind, meta, segment, here.engine, frame_name, _address(here))


def _address(runner: Any) -> str:
    return runner.status.address or ""
