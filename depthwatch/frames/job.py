"""One frame to turn into one depth map: the unit of work from the watcher to the writer.

A job carries what the watcher already learned about the file, so nothing
downstream finds it out again: the version it judged complete (size, mtime,
inode) and the format its magic bytes name, whose end marker the watcher has
already seen. The worker reads the file once and decodes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Job:
    """Jobs are keyed by `output`: a newer job for the same output replaces an older one."""

    source: Path
    output: Path
    #: Where an error record goes if error sidecars are on (None: not written).
    error_record: Path | None = None
    #: (size, mtime_ns, inode) when the frame was found complete; a different file at
    #: read time means a newer version is on its way (None: take what is there).
    signature: tuple[int, int, int] | None = None
    #: The format the watcher sniffed, its end marker (if the format has one) checked;
    #: None: not looked at yet (`once`, or a file the watcher could not place).
    format: str | None = None
    #: When the frame was found complete (monotonic clock), for latency figures.
    queued_at: float = field(default_factory=time.monotonic, compare=False)
    #: A symlinked frame is followed only to inside this folder (None: links are followed).
    link_root: Path | None = None
    #: The output's folder must really lie inside one of these when the map is written
    #: (empty: anywhere, for `once`). Checked at write time, not when the job is made.
    output_roots: tuple[Path, ...] = ()
    #: `depthwatch once` over a sequence, pass 1: stop after inference; the Result carries the
    #: frame's stabilise.Summary and its prediction (float16), and nothing is written.
    collect: bool = field(default=False, compare=False)
    #: Pass 2: the [0, 1] nearness map is already made (model resolution): no inference.
    nearness: np.ndarray | None = field(default=None, compare=False, repr=False)
