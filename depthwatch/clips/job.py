"""What a clip job is (`ClipJob`), where it stands (`Progress`), and how it ended (`ClipResult`).

A clip job is keyed by its output like a frame's; its result shares a frame
result's common part (`frames.result.Outcome`): the error line, whether
another try may help, whether it was only superseded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from depthwatch.frames.job import Signature
from depthwatch.frames.result import Outcome
from depthwatch.logtext import shown
from depthwatch.media import video


@dataclass(frozen=True)
class ClipJob:
    """One clip to turn into one depth clip; keyed by `output` like a frame's job."""

    source: Path
    #: The depth clip, or for an image sequence a path whose name holds the `{frame}` field.
    output: Path
    #: (size, mtime_ns, inode) when the watcher found it complete (None: take what is there).
    signature: Signature | None = None
    #: The output's folder must really lie inside one of these when written (empty: anywhere).
    output_roots: tuple[Path, ...] = ()
    queued_at: float = field(default_factory=time.monotonic, compare=False)

    @property
    def sequence(self) -> bool:
        return "{frame" in self.output.name

    @property
    def final(self) -> Path:
        """What is renamed into place: the clip file, or the sequence's folder."""
        return self.output.parent if self.sequence else self.output


@dataclass
class Progress:
    """Where a clip job stands: frames mapped (`done`) of `total` (0: the container does not say)."""

    job: ClipJob
    phase: str = "opening"
    done: int = 0
    total: int = 0
    frames: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        """Steps (frames of either pass) a second so far."""
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 and self.done else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if not rate or not self.total:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def as_dict(self) -> dict[str, object]:
        eta = self.eta_s
        return {
            "source": str(self.job.source),
            "output": str(self.job.final),
            "phase": self.phase,
            "frames": self.frames,
            "done": self.done,
            "total": self.total,
            "rate": round(self.rate, 2),
            "eta_s": None if eta is None else round(eta, 1),
        }


@dataclass
class ClipResult(Outcome[ClipJob]):
    """A clip's outcome: its frames and time, or why not (`retryable`: a cause that may clear, a full disk)."""

    frames: int = 0
    seconds: float = 0.0
    info: video.ClipInfo | None = None

    def describe(self) -> str:
        if self.error:
            return self.error_line()
        fps = self.frames / self.seconds if self.seconds > 0 else 0.0
        what = self.info.describe() if self.info else f"{self.frames} frames"
        return f"{shown(self.job.source.name)} -> {shown(self.job.final.name)} {what}: {self.frames} frames in {self.seconds:.1f} s ({fps:.1f} fps)"
