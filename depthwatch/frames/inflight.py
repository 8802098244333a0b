"""A frame in flight: what the pipeline holds for one job between its submission and its result.

Its job and settings, its future and result, the folder it was read from
(open until its map is written), its decoded pixels, its stage timings; and
the steps that need nothing but the frame itself: read, decode, collect (pass
1 of a sequence in `once`), the record inside its map and the sidecar beside
it. The pipeline (`pipeline`) decides when each step runs, and on which thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch import __version__
from depthwatch.errors import FrameError, OwnOutput, Superseded
from depthwatch.frames import provenance
from depthwatch.frames.folders import open_frame_folder
from depthwatch.frames.job import Job, Signature, signature_from
from depthwatch.frames.reading import read_source
from depthwatch.frames.replacing import JSON_MARK, json_refusal
from depthwatch.frames.result import Result
from depthwatch.frames.settings import Settings
from depthwatch.imaging import codec, formats, normalise, stabilise
from depthwatch.imaging.render import Ahead
from depthwatch.logtext import shown
from depthwatch.model.engine import Inference
from depthwatch.model.spec import ModelInfo

log = logging.getLogger("depthwatch.frames")

#: Only a sidecar depthwatch wrote is replaced (its mark, or the keys sidecars had before the mark).
OWN_SIDECAR = json_refusal(frozenset({"source", "width", "height", "source_bytes", "source_mtime", "model", "providers", "ms"}))


#: What to do about a map its format cannot hold: a frame on disk, and an image sent to the API.
_INSTEAD = "choose a PNG or TIFF output.template (or once -o)"
_INSTEAD_HELD = "ask for format=png"


def _map_size(decoded: codec.Decoded) -> tuple[int, int]:
    """The (width, height) of a decoded frame's map: the frame's, or an EXR's display window (`codec.on_display_window`)."""
    windows = decoded.windows
    if windows is None or windows.plain:
        return decoded.size
    x0, y0, x1, y1 = windows.display
    return x1 - x0 + 1, y1 - y0 + 1


@dataclass(frozen=True)
class MadeFrom:
    """One frame version's bytes, the settings and the model a map was made with."""

    source: Path
    signature: Signature
    crc: int
    settings: Settings
    generation: int


@dataclass
class FrameInFlight:
    job: Job
    settings: Settings
    future: Future[Result]
    result: Result
    decoded: codec.Decoded | None = None
    source_stat: os.stat_result | None = None
    clock: float = field(default_factory=time.perf_counter)
    #: Submission order; a map never replaces one written by a later job for its output.
    seq: int = 0
    #: A newer job for the same output was submitted, or nobody waits for this one
    #: any more (`cancel`): do not start inference.
    abandoned: bool = False
    inference: Future[Inference] | None = None
    #: output.normalise: stable: the shot state this frame's map leaves once written.
    shot: stabilise.ShotMap | None = None
    #: The folder the frame was read from, open from read to result (see `folders`).
    folder: int | None = None
    #: What its map is made from (a frame from disk), to know the same work asked again.
    made_from: MadeFrom | None = None
    #: An older job for the same output still in flight when this one started (read as this one reaches the model).
    follows: Future[Result] | None = None
    #: What the map needs of the frame alone, made while the model runs (`render.ahead`).
    ahead: Ahead | None = None

    def close_folder(self) -> None:
        if self.folder is not None:
            os.close(self.folder)
            self.folder = None

    def beside(self, path: Path) -> int | None:
        """The frame's own folder, open, if `path` lies directly in it (else None: by path)."""
        return self.folder if path.parent == self.job.source.parent else None

    def check(self) -> None:
        if self.abandoned:
            raise Superseded("a newer version arrived")

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.result.ms[stage] = self.result.ms.get(stage, 0.0) + (now - self.clock) * 1000
        self.clock = now

    def read(self) -> bytes:
        """The frame's bytes from disk, checked to be a frame and not one of depthwatch's own maps.

        Read through its folder, opened now and held until the map is written (see `folders`).
        """
        job = self.job
        self.folder = open_frame_folder(job.source, job.output_roots)
        data, self.source_stat = read_source(
            job.source,
            job.signature,
            max_bytes=self.settings.max_file_bytes,
            link_root=job.link_root,
            folder_fd=self.folder,
        )
        made = provenance.read(data)
        if made is not None:
            raise OwnOutput(f"is a depth map depthwatch made from {shown(str(made.get('source')))}; not taken as input")
        # The watcher sniffed the format and saw its end marker; the bytes are that version.
        found = job.format or formats.sniff(data)
        expected = formats.EXTENSIONS.get(job.source.suffix.lower())
        if expected and found and found != expected:
            raise FrameError(f"is a {found.upper()} image but its name says {job.source.suffix}; rename it")
        return data

    def decode(self, data: bytes, info: ModelInfo) -> None:
        """The frame's pixels, at the reduced scale the model allows (`codec.decode`)."""
        self.decoded = codec.decode(
            data,
            max_pixels=self.settings.max_pixels,
            min_size=info.min_frame_size,
            checked_format=self.job.format,
            exr_colour=self.settings.exr.colour,
        )
        codec.check_map_size(_map_size(self.decoded), self.job.map_ext, _INSTEAD_HELD if self.job.output is None else _INSTEAD)
        if self.decoded.not_finite:
            log.warning(
                "%s: %d NaN or infinite values in the EXR were made finite before the model "
                "(NaN and -Inf as black, +Inf as white)",
                shown(self.job.source),
                self.decoded.not_finite,
            )
        self.lap("decode")

    def collect(self, inference: Inference, info: ModelInfo) -> None:
        """Pass 1 of a sequence in `once`: keep what planning needs, write nothing."""
        assert self.decoded is not None
        result = self.result
        result.summary = stabilise.summarise(
            inference.prediction, info.profile.predicts, self.decoded.image, self.settings.render.clip_percent
        )
        result.prediction = inference.prediction.astype(np.float16)
        if self.source_stat is not None:
            result.signature = signature_from(self.source_stat)
        self.decoded = None
        self.lap("normalise")
        self.future.set_result(result)

    def record(self, info: ModelInfo) -> dict[str, Any]:
        """The provenance record this frame version's map carries (see `provenance`)."""
        assert self.source_stat is not None
        return provenance.record_for(
            self.job.source.name,
            self.source_stat,
            model=info.spec.path.name,
            normalise=self.settings.normalise,
            invert=self.settings.render.levels.invert,
            # A shot-stable map with no planned map in its job was made live (`made_live`).
            made_with=self.settings.made_live if self.settings.normalise == normalise.STABLE and self.job.nearness is None
            else self.settings.made_with,
        )

    def sidecar(self) -> bytes:
        """The JSON sidecar beside the map (`output.sidecar`): what was made, from what, how fast."""
        st = self.source_stat
        result = self.result
        record: dict[str, Any] = {
            JSON_MARK: __version__,
            "source": self.job.source.name,
            "width": result.size[0] if result.size else None,
            "height": result.size[1] if result.size else None,
            "source_bytes": st.st_size if st else None,
            "source_mtime": st.st_mtime if st else None,
            "model": result.model,
            "providers": list(result.providers),
            "ms": {k: round(v, 2) for k, v in result.ms.items()},
        }
        return json.dumps(record, indent=2).encode() + b"\n"
