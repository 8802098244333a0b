"""What happened to one job: its map (or why not), its timings, and its one log line.

`Outcome` is what a frame's `Result` and a clip's `ClipResult` (`clips.job`)
share: the job, why it failed, whether another try may help, whether it was
only superseded; and how an error becomes all three (`failed_with`).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import numpy as np

from depthwatch.errors import BadPrediction, DepthwatchError, FrameError, InferenceFailed, OutputError, Stopped, Superseded, Vanished
from depthwatch.frames.frameline import frame_line
from depthwatch.frames.job import Job, Signature
from depthwatch.imaging import stabilise
from depthwatch.logtext import shown


class _HasSource(Protocol):
    @property
    def source(self) -> Path: ...


J = TypeVar("J", bound=_HasSource)


@dataclass
class Outcome(Generic[J]):
    """How a job (a frame's, a clip's) ended: ok, or an `error` in one line.

    `retryable` marks output errors worth another try (a full disk);
    `superseded` a job stopped for a newer version or a stop request: not a failure.
    """

    job: J
    _: KW_ONLY
    error: str | None = None
    retryable: bool = False
    superseded: bool = False
    #: Of a superseded job, why there was nothing to do when no newer version came: "vanished" (the
    #: file deleted or moved away), "stopped" (dropped by the daemon's stop); "" for a newer version.
    gone: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def failed_with(self, exc: DepthwatchError) -> None:
        """Record `exc` as the reason this job made nothing."""
        self.error = str(exc)
        self.retryable = isinstance(exc, OutputError) and exc.retryable
        self.superseded = isinstance(exc, Superseded)
        self.gone = "vanished" if isinstance(exc, Vanished) else "stopped" if isinstance(exc, Stopped) else ""

    def error_line(self) -> str:
        """The one log line of a job that failed: its source, then why."""
        return f"{shown(self.job.source)}: {self.error}"


@dataclass
class Result(Outcome[Job]):
    """A frame's outcome; `frame_at_fault` marks an input that can never make a map.

    `failed_with` also says whether the frame was at fault (`frame_at_fault`) or the model (`bad_prediction`).
    """

    #: The frame itself cannot be used (a FrameError: damaged, too large, not an image),
    #: as opposed to a failure of depthwatch's own (the API answers 422 against 500) or
    #: of the model's (`bad_prediction`: never held against the frame).
    frame_at_fault: bool = False
    #: The map on disk was already made from these very bytes (a version handed over twice):
    #: nothing was run or written; ok, but not counted as a frame done.
    unchanged: bool = False
    #: The model ran (or was running) for this job; false for one dropped before inference.
    inferred: bool = False
    #: The model's prediction was no depth map (NaN, a constant), or its run raised: a model
    #: problem when it happens frame after frame (the daemon's health counts them).
    bad_prediction: bool = False
    size: tuple[int, int] | None = None
    model: str | None = None
    providers: tuple[str, ...] = ()
    #: Milliseconds per stage (see `frameline.STAGES`).
    ms: dict[str, float] = field(default_factory=dict)
    #: The shot this map belongs to (stable normalisation), and why it started with this
    #: frame: "new" (the output's first), "cut", "model" (a model swap), or "" (it did not).
    shot: int | None = None
    started: str = ""
    #: Job.collect: what planning a sequence needs of this frame.
    summary: stabilise.Summary | None = None
    prediction: np.ndarray | None = None
    #: Job.collect: the version of the frame the model ran on; pass 2 reads that one or none.
    signature: Signature | None = None
    #: A job with no output (image bytes held in memory): its encoded map.
    data: bytes | None = field(default=None, repr=False)

    def failed_with(self, exc: DepthwatchError) -> None:
        super().failed_with(exc)
        self.bad_prediction = isinstance(exc, (BadPrediction, InferenceFailed))
        # A model that fails (NaN, a provider's error, a run given up) is no fault of this version of the frame.
        self.frame_at_fault = isinstance(exc, FrameError) and not self.bad_prediction

    def describe(self) -> str:
        """The one log line for this frame (read back by `frameline.parse_frame_line`)."""
        if self.error:
            return self.error_line()
        output = self.job.output.name if self.job.output is not None else self.job.map_ext.lstrip(".")
        return frame_line(self.job.source.name, output, self.size or (0, 0), self.ms)

    def shot_note(self) -> str:
        """' shot 3 (cut)' when a cut or a model swap started a shot with this map, else ''.

        An output's first map starts its first shot too, but saying so on every
        frame of a burst of stills would drown the cuts.
        """
        if self.started in ("cut", "model"):
            return f" shot {self.shot} ({self.started})"
        return ""
