"""Clips: a clip's way to its depth clip, and the one interface the daemon, `once` and the farm call.

A whole clip in one streamed pass: `make_clip(ClipJob(...), engine, settings)`
gives a `ClipResult`, never raises, and reports its `Progress` as it goes
(the daemon's clip thread, `once CLIP`). A clip in ranges (the farm's client
and workers, a farm manager's own range tasks): `clipindex` (the frames in
presentation order, cut into ranges: `read_index`, `ranges`), `rangepass` (a
range's two passes on the caller's engine: `ClipRange`, `RangeReport`),
`segments` (the ranges' segments named for what they hold, and their join),
and the depth clip put in place only whole (`rename_into_place`, after
`refuse_replacing`; `remove` for what a run leaves). `timeline`: the timeline
beside a depth clip. The rest (`stream`, `placing`, `sequence`) is the way's
own; tests/test_layers.py keeps callers to this interface.

What a clip file holds, and a depth clip written, are `media`'s, below
`frames` and `config`, which ask of a clip too.
"""

from depthwatch.clips import clipindex, rangepass, segments, timeline
from depthwatch.clips.clipindex import ClipIndex, ranges
from depthwatch.clips.clipindex import read as read_index
from depthwatch.clips.job import ClipJob, ClipResult, Progress
from depthwatch.clips.make import make_clip
from depthwatch.clips.placing import refuse_replacing, remove, rename_into_place
from depthwatch.clips.rangepass import ClipRange, RangeReport

__all__ = [
    "ClipIndex", "ClipJob", "ClipRange", "ClipResult", "Progress", "RangeReport", "clipindex", "make_clip", "rangepass",
    "ranges", "read_index", "refuse_replacing", "remove", "rename_into_place", "segments", "timeline",
]
