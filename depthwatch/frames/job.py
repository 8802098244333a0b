"""One frame to turn into one depth map: the unit of work from the watcher to the writer.

A job carries what the watcher already learned about the file, so nothing
downstream finds it out again: the version it judged complete (size, mtime,
inode) and the format its magic bytes name, whose end marker the watcher has
already seen. The worker reads the file once and decodes it.

An image held in memory (the API's image bodies) is a job too: its source is
bytes, not a file, and it has no output, so its map comes back in the Result
instead of being written. It goes the same way through the pipeline.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np


#: A version of a frame: (size, mtime_ns, inode). A config file's version is a "stamp" instead.
Signature = tuple[int, int, int]


def signature_from(st: os.stat_result) -> Signature:
    """The signature of the file version `st` describes."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def signature_of(path: Path) -> Signature | None:
    """The signature of the frame at `path` now (following links), or None if it is not there."""
    try:
        return signature_from(os.stat(path))
    except OSError:
        return None


class _Versioned(Protocol):
    """A frame's job or a clip's: a source and the version of it found."""

    @property
    def source(self) -> Path: ...

    @property
    def signature(self) -> Signature | None: ...


def same_source_version(a: _Versioned | None, b: _Versioned) -> bool:
    """Whether two jobs (a frame's or a clip's) are of the same version of the same source: one found twice.

    Where latest wins per output, a newer version replaces an older one, and
    the same version found again (a rescan, the API and the watcher both)
    replaces nothing: this is how each place tells the two apart.
    """
    return a is not None and (a.source, a.signature) == (b.source, b.signature)


@dataclass(frozen=True)
class Job:
    """Jobs are keyed by `output`: a newer job for the same output replaces an older one."""

    #: The frame's file; for an image in memory, a name for it in log lines.
    source: Path
    #: Where the map goes; None: nowhere, the map comes back in the Result (see `held`).
    output: Path | None
    #: Where an error record goes if error sidecars are on (None: not written).
    error_record: Path | None = None
    #: (size, mtime_ns, inode) when the frame was found complete; a different file at
    #: read time means a newer version is on its way (None: take what is there).
    signature: Signature | None = None
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
    #: The frame's bytes, already in memory (an image body): nothing is read from disk.
    data: bytes | None = field(default=None, compare=False, repr=False)
    #: The map's format for a job with no output (".jpg", ".png").
    ext: str = ""

    @classmethod
    def held(cls, data: bytes, ext: str, name: str = "image body") -> Job:
        """A job for image bytes in memory whose map, encoded for `ext`, is written nowhere."""
        return cls(Path(name), None, data=data, ext=ext)

    @property
    def map_ext(self) -> str:
        """The extension the map is encoded for: the output's, or `ext` for a job with no output."""
        return self.output.suffix if self.output is not None else self.ext
