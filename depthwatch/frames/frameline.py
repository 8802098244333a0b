"""The one log line per frame: written by `Result.describe`, read back by `parse_frame_line`.

    a.jpg -> a_depth.jpg 1920x1080 ms: read 0.4 decode 3.1 prepare 0.6 infer 21.0 normalise 0.3 render 2.2 encode 4.0 write 0.9

One stage per module a frame goes through (`reading`, `imaging.codec`,
`imaging.tensor`, the engine, `imaging.normalise`/`stabilise`,
`imaging.render`, `imaging.codec` with `provenance`, `writer`); the daemon
adds "total MS queue N". The benchmarks and tests read stage timings only
through `parse_frame_line`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from depthwatch.logtext import shown

STAGES = ("read", "decode", "prepare", "infer", "normalise", "render", "encode", "write")

_FRAME_LINE = re.compile(
    r"(?P<source>.+?) -> (?P<output>.+?) (?P<width>\d+)x(?P<height>\d+) ms: "
    + " ".join(rf"{stage} (?P<{stage}>[\d.]+)" for stage in STAGES)
    + r"(?: total (?P<total>[\d.]+) queue (?P<queue>\d+))?"
)


def timings(ms: Mapping[str, float]) -> str:
    """'read 0.4 decode 3.1 ...': every stage, in order (0.0 for one a frame skipped)."""
    return " ".join(f"{stage} {ms.get(stage, 0.0):.1f}" for stage in STAGES)


def frame_line(source: str, output: str, size: tuple[int, int], ms: Mapping[str, float]) -> str:
    """The line for a frame mapped from `source` (a name) to `output`."""
    w, h = size
    return f"{shown(source)} -> {shown(output)} {w}x{h} ms: {timings(ms)}"


def parse_frame_line(line: str) -> dict[str, Any] | None:
    """The fields of a per-frame log line (names, size, stage times in ms), or None if it is not one."""
    match = _FRAME_LINE.search(line)
    if match is None:
        return None
    fields: dict[str, Any] = {"source": match["source"].rsplit(" ", 1)[-1], "output": match["output"]}
    fields["size"] = (int(match["width"]), int(match["height"]))
    for stage in STAGES:
        fields[stage] = float(match[stage])
    if match["total"] is not None:
        fields["total"] = float(match["total"])
        fields["queue"] = int(match["queue"])
    return fields
