"""One frame's way through: read -> decode -> infer -> render -> encode -> atomic write.

Reading, decoding, encoding and writing run on a small worker pool; only
`session.run` runs on the inference thread, which hands its result back by
queueing the second half of the job on the pool (never doing it itself), so
the inference thread never waits on disk or image coding. `depthwatch once`
and the daemon both send frames through here, and both get the same bound on
frames in flight (each holds a decoded frame in memory): `once` by `submit`
blocking, the daemon by `feed`, which pulls from its latest-wins queue
whenever a slot frees.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.config import Config
from depthwatch.errors import (
    DepthwatchError,
    FrameError,
    ModelChanged,
    OutputError,
    OwnOutput,
    Superseded,
)
from depthwatch.frames import provenance, reading
from depthwatch.frames.job import Job
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.writer import atomic_write, really_inside
from depthwatch.imaging import formats, normalise, pixels, stabilise
from depthwatch.imaging.levels import Levels, parse_level
from depthwatch.logtext import shown
from depthwatch.model.engine import Engine, Inference
from depthwatch.model.spec import ModelInfo

log = logging.getLogger("depthwatch.frames")

STAGES = ("read", "decode", "infer", "encode", "write")

#: The per-frame log line, as `Result.describe()` writes it and the daemon's log carries it
#: (followed by "total MS queue N"); `parse_frame_line` is the one reader of it.
_FRAME_LINE = re.compile(
    r"(?P<source>.+?) -> (?P<output>.+?) (?P<width>\d+)x(?P<height>\d+) ms: "
    + " ".join(rf"{stage} (?P<{stage}>[\d.]+)" for stage in STAGES)
    + r"(?: total (?P<total>[\d.]+) queue (?P<queue>\d+))?"
)


@dataclass(frozen=True)
class Settings:
    """The parts of the config a frame needs, frozen per job so a reload is clean."""

    render: pixels.RenderOptions = pixels.RenderOptions()
    jpeg_quality: int = 95
    png_bits: int = 16
    png_compression: int = 1
    max_pixels: int = 100_000_000
    sidecar: bool = False
    #: Files larger than this are refused before a byte is read (`daemon.max_file_mb`).
    max_file_bytes: int = reading.DEFAULT_MAX_BYTES
    #: output.normalise: stable (per-output shot state) or frame (each map on its own).
    normalise: str = normalise.STABLE
    #: input.exr_colour and output.exr_half / exr_compression.
    exr: pixels.ExrOptions = pixels.ExrOptions()

    @classmethod
    def from_config(cls, config: Config) -> Settings:
        out = config.output
        return cls(
            render=pixels.RenderOptions(
                clip_percent=out.clip_percent,
                refine=out.refine,
                levels=Levels(parse_level(out.near), parse_level(out.far), out.gamma, out.invert),
            ),
            jpeg_quality=out.jpeg_quality,
            png_bits=out.png_bits,
            png_compression=out.png_compression,
            max_pixels=int(config.daemon.max_megapixels * 1_000_000),
            sidecar=out.sidecar,
            max_file_bytes=int(config.daemon.max_file_mb * 2**20),
            normalise=out.normalise,
            exr=pixels.ExrOptions(config.input.exr_colour, out.exr_half, out.exr_compression),
        )


@dataclass
class Result:
    """What happened to one job; `retryable` marks output errors worth another try."""

    job: Job
    error: str | None = None
    retryable: bool = False
    #: A newer version of the frame turned up meanwhile; not a failure.
    superseded: bool = False
    #: The model ran (or was running) for this job; false for one dropped before inference.
    inferred: bool = False
    size: tuple[int, int] | None = None
    model: str | None = None
    providers: tuple[str, ...] = ()
    ms: dict[str, float] = field(default_factory=dict)
    #: The shot this map belongs to (stable normalisation), and why it started with this
    #: frame: "new" (the output's first), "cut", "model" (a model swap), or "" (it did not).
    shot: int | None = None
    started: str = ""
    #: Job.collect: what planning a sequence needs of this frame.
    summary: stabilise.Summary | None = None
    prediction: np.ndarray | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        """The one log line for this frame (read back by `parse_frame_line`)."""
        if self.error:
            return f"{shown(self.job.source)}: {self.error}"
        timings = " ".join(f"{stage} {self.ms.get(stage, 0.0):.1f}" for stage in STAGES)
        w, h = self.size or (0, 0)
        return f"{shown(self.job.source.name)} -> {shown(self.job.output.name)} {w}x{h} ms: {timings}"

    def shot_note(self) -> str:
        """' shot 3 (cut)' when a cut or a model swap started a shot with this map, else ''.

        An output's first map starts its first shot too, but saying so on every
        frame of a burst of stills would drown the cuts.
        """
        if self.started in ("cut", "model"):
            return f" shot {self.shot} ({self.started})"
        return ""


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


@dataclass
class _Frame:
    job: Job
    settings: Settings
    future: Future[Result]
    result: Result
    decoded: pixels.Decoded | None = None
    source_stat: os.stat_result | None = None
    clock: float = field(default_factory=time.perf_counter)
    #: Submission order; a map never replaces one written by a later job for its output.
    seq: int = 0
    #: A newer job for the same output was submitted: do not start inference.
    abandoned: bool = False
    inference: Future[Inference] | None = None
    #: output.normalise: stable: the map and the shot state it leaves once written.
    outcome: stabilise.Outcome | None = None

    def check(self) -> None:
        if self.abandoned:
            raise Superseded("a newer version arrived")

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.result.ms[stage] = self.result.ms.get(stage, 0.0) + (now - self.clock) * 1000
        self.clock = now


@dataclass(frozen=True)
class Rendered:
    """An in-memory job's depth map, encoded, with the image's size and the stage times."""

    data: bytes
    size: tuple[int, int]
    ms: dict[str, float]


@dataclass
class _Image:
    data: bytes
    ext: str
    settings: Settings
    future: Future[Rendered]
    decoded: pixels.Decoded | None = None
    ms: dict[str, float] = field(default_factory=dict)
    clock: float = field(default_factory=time.perf_counter)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + (now - self.clock) * 1000
        self.clock = now


def _yield_to_inference(niceness: int) -> None:
    """Make this worker thread `niceness` steps nicer than the inference thread.

    On a CPU-only machine the image work and the model's operator threads share
    the cores; when both want one the model should win, and decoding and
    encoding should fill the gaps its parallel sections leave (measured: burst
    throughput 21 -> 25 frames/s on two cores at niceness 10; see docs/benchmarks.md).
    Linux applies nice to single threads; elsewhere this does nothing.
    """
    if not sys.platform.startswith("linux") or niceness <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except OSError:
        pass


def _ensure_folder(folder: Path, roots: tuple[Path, ...] = ()) -> None:
    """Outputs may go to a folder of their own (output.template 'depth/{stem}.png').

    Not created through a link that now leads outside `roots` (a folder outside is a write too).
    """
    if folder.is_dir():
        return
    if roots and not really_inside(folder, roots):
        raise OutputError(
            f"the output folder {shown(folder)} now leads outside the configured folders (replaced by a link?); not writing",
            retryable=False,
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output folder {folder}: {exc.strerror or exc}") from None


def read_source(
    path: Path,
    signature: tuple[int, int, int] | None = None,
    *,
    max_bytes: int = reading.DEFAULT_MAX_BYTES,
    link_root: Path | None = None,
) -> tuple[bytes, os.stat_result]:
    """The file's bytes, read once; FrameError if it vanished or is unreadable.

    Whatever now sits at `path` is checked on its open descriptor before a byte
    is read: a regular file (not a FIFO, a device, a socket) of at most
    `max_bytes` (see `reading`). With `link_root`, a symlink is followed only
    to a file inside that folder, checked now, not when the frame was found.
    Superseded if it is no longer the version that was found complete, or
    changed while being read: an editor rewriting a frame in place will have
    the newer version picked up by its own event.
    """
    follow = True
    if link_root is not None and os.path.islink(path):
        problem = reading.link_problem(path)
        if problem:
            raise FrameError(problem)
        real = os.path.realpath(path)
        top = os.path.realpath(link_root)
        if not real.startswith(top.rstrip(os.sep) + os.sep):
            raise FrameError("a symlink to outside the watch folder; not followed (set watch.follow_symlinks to allow it)")
        path, follow = Path(real), False  # the target itself, without following another link
    before = os.stat(path) if os.path.exists(path) else None
    data, after = reading.read_file(path, follow_links=follow, max_bytes=max_bytes)
    if before is None or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(data) != after.st_size:
        raise Superseded("the file changed while it was being read")
    if signature is not None and signature != (after.st_size, after.st_mtime_ns, after.st_ino):
        raise Superseded("the file changed after it was found complete")
    return data, after


#: While an output's maps keep coming at least this often, a newer version of its
#: frame stops the inference in progress. Slower than that (a long scrub, playback),
#: the inference in progress finishes and lands, so the editor still sees a live map.
PREVIEW_INTERVAL_S = 0.25
_WRITTEN_MEMORY = 1024


class Pipeline:
    """Runs jobs through the engine with `workers` threads for everything but inference.

    Jobs for the same output: the newest wins. Submitting one abandons any older
    job for that output still in flight: one not yet at the model stops there
    (its queued inference is cancelled); one in the model is stopped mid-run if
    this output got a map within PREVIEW_INTERVAL_S, else it finishes. A map is
    never written over one from a newer job. So an editor scrubbing through a
    shot sees the latest frame's map about one inference after the last write,
    and a live map at least every PREVIEW_INTERVAL_S plus one inference meanwhile.

    `niceness` lowers the workers' scheduling priority below the inference thread's.
    """

    def __init__(self, engine: Engine, workers: int = 2, niceness: int = 0, in_flight: int | None = None) -> None:
        self.engine = engine
        #: Frames between submission and result at most: each may hold a decoded frame, so
        #: this bounds memory; two more than the workers keeps the model fed meanwhile.
        self.in_flight = in_flight or workers + 2
        self._slots = threading.Semaphore(self.in_flight)
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="depthwatch-worker",
            initializer=_yield_to_inference,
            initargs=(niceness,),
        )
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._newest: dict[Path, _Frame] = {}
        self._seq = itertools.count(1)
        # (seq, time) of the last map written per output; a short memory is enough, since
        # only jobs in flight (a handful) ever compare against it.
        self._written: OrderedDict[Path, tuple[int, float]] = OrderedDict()
        # Shot state per output for output.normalise: stable (bounded; see stabilise).
        self.stabiliser = stabilise.Stabiliser()
        # Writes to one output are serialised (by stripe, to keep this bounded) so the
        # check "nothing newer was written" and the write happen as one.
        self._write_locks = [threading.Lock() for _ in range(64)]
        self._source: tuple[LatestWinsQueue, Callable[[], Settings], Callable[[Job, Result], None]] | None = None

    def submit(self, job: Job, settings: Settings, timeout: float | None = None) -> Future[Result]:
        """Start a job once fewer than `in_flight` are in progress (blocks until then).

        The future always completes with a Result (errors included). TimeoutError
        if no slot freed within `timeout`.
        """
        if not self._slots.acquire(timeout=timeout):  # None: wait (a Semaphore takes -1 as "not at all")
            raise TimeoutError(f"{self.in_flight} frames still in flight")
        return self._start(job, settings)

    def process(self, job: Job, settings: Settings) -> Result:
        return self.submit(job, settings).result()

    def feed(
        self,
        queue: LatestWinsQueue,
        settings: Callable[[], Settings],
        on_result: Callable[[Job, Result], None],
    ) -> None:
        """Take jobs from `queue` whenever a slot is free, without a thread of its own.

        `pull()` after each `queue.put`; the pipeline pulls again itself as each
        frame finishes. `settings()` is read as each job starts (a reload applies
        to the next frame); `on_result` runs on a worker thread, before the job's
        slot frees and `queue.done(job)` is called.
        """
        self._source = (queue, settings, on_result)

    def pull(self) -> None:
        """Start waiting jobs while slots are free; returns at once."""
        if self._source is None:
            return
        queue, settings, on_result = self._source
        while self._slots.acquire(blocking=False):
            job = queue.get(timeout=0)
            if job is None:
                self._slots.release()
                # A job put after the get above, whose own pull found no slot free
                # before the release, would wait for the next frame to finish: look again.
                if len(queue) and not queue.closed:
                    continue
                return

            def report(done: Future[Result], job: Job = job) -> None:
                try:
                    on_result(job, done.result())
                finally:
                    queue.done(job)

            self._start(job, settings(), then=report)

    def _start(self, job: Job, settings: Settings, then: Callable[[Future[Result]], None] | None = None) -> Future[Result]:
        """Begin a job whose slot is already taken; `then` runs before the slot frees."""
        future: Future[Result] = Future()
        if then is not None:
            future.add_done_callback(then)
        frame = _Frame(job, settings, future, Result(job), seq=next(self._seq))
        with self._lock:
            self._pending += 1
            older = self._newest.get(job.output)
            self._newest[job.output] = frame
            _, last_map = self._written.get(job.output, (0, float("-inf")))
        if older is not None:
            older.abandoned = True
            if older.inference is not None:
                fresh = time.monotonic() - last_map < PREVIEW_INTERVAL_S
                self.engine.abort(older.inference, running_too=fresh)
        future.add_done_callback(lambda _: self._finished(frame))
        try:
            self._pool.submit(self._front, frame)
        except RuntimeError:  # the pool was shut down after a shutdown timeout
            self._fail(frame, FrameError("stopped before the frame was read"))
        return future

    def submit_image(self, data: bytes, ext: str, settings: Settings) -> Future[Rendered]:
        """A depth map for image bytes held in memory, written nowhere (the HTTP API's image bodies).

        The same stages as a frame from disk: decode on a worker, inference on
        the engine's thread, render and encode on a worker. It has no output, so
        it takes no part in latest-wins; `wait_idle` waits for it like any job.
        The future fails with the reason (FrameError for an unusable image).
        """
        image = _Image(data, ext, settings, Future())
        with self._lock:
            self._pending += 1
        image.future.add_done_callback(lambda _: self._image_finished())
        try:
            self._pool.submit(self._front_image, image)
        except RuntimeError:  # the pool was shut down
            image.future.set_exception(FrameError("stopped before the depth map was made"))
        return image.future

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (frames from disk and in-memory images)."""
        return self._pending

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted job has its result; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` for the jobs in flight, then stop the workers; False if some are stuck.

        Never waits longer than `timeout` (None: as long as it takes): a worker
        stuck in a hung write is left behind (it is a daemon-less pool thread
        the caller must not join), not waited on.
        """
        idle = self.wait_idle(timeout)
        self._source = None
        self._pool.shutdown(wait=idle, cancel_futures=True)
        return idle

    def _finished(self, frame: _Frame) -> None:
        with self._idle:
            if self._newest.get(frame.job.output) is frame:
                del self._newest[frame.job.output]
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()
        self._slots.release()
        self.pull()

    def _image_finished(self) -> None:
        """An in-memory job is done (it held no slot: the request holding its bytes bounds it)."""
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    # -- worker side ----------------------------------------------------------------

    def _front(self, frame: _Frame) -> None:
        """read, decode, prepare, hand to the engine (worker thread)."""
        try:
            frame.check()
            job = frame.job
            data, frame.source_stat = read_source(
                job.source, job.signature, max_bytes=frame.settings.max_file_bytes, link_root=job.link_root
            )
            frame.lap("read")
            made = provenance.read(data)
            if made is not None:
                raise OwnOutput(f"is a depth map depthwatch made from {shown(str(made.get('source')))}; not taken as input")
            # The watcher sniffed the format and saw its end marker; the bytes are that version.
            found = job.format or formats.sniff(data)
            expected = formats.EXTENSIONS.get(job.source.suffix.lower())
            if expected and found and found != expected:
                raise FrameError(f"is a {found.upper()} image but its name says {job.source.suffix}; rename it")
            info = self._model_info()
            frame.decoded = pixels.decode(
                data,
                max_pixels=frame.settings.max_pixels,
                min_size=info.min_frame_size,
                checked_format=job.format,
                exr_colour=frame.settings.exr.colour,
            )
            del data
            if frame.decoded.not_finite:
                log.warning(
                    "%s: %d NaN or infinite values in the EXR were made finite before the model "
                    "(NaN and -Inf as black, +Inf as white)",
                    shown(job.source),
                    frame.decoded.not_finite,
                )
            if job.nearness is not None:  # once, pass 2: the map is made, only write it
                frame.lap("decode")
                done: Future[Inference] = Future()
                done.set_result(Inference(job.nearness, 0.0, info))
                self._back(frame, done)
                return
            self._to_engine(frame, info)
        except Exception as exc:
            self._fail(frame, exc)

    def _model_info(self) -> ModelInfo:
        info = self.engine.info
        return info if info is not None else self.engine.wait_ready()

    def _to_engine(self, frame: _Frame, info: ModelInfo) -> None:
        assert frame.decoded is not None
        tensor = pixels.prepare(frame.decoded, info.contract, info.profile)
        frame.lap("decode")
        frame.check()
        frame.inference = self.engine.infer(tensor, info.generation)
        if frame.abandoned:  # a newer job came while this one was being handed over
            self.engine.abort(frame.inference, running_too=False)
        frame.inference.add_done_callback(lambda done: self._handoff(frame, done))

    def _newer_written(self, frame: _Frame) -> bool:
        with self._lock:
            return self._written.get(frame.job.output, (0, 0.0))[0] > frame.seq

    def _handoff(self, frame: _Frame, done: Future[Inference]) -> None:
        """Runs on the inference thread: only queue the rest of the job, do nothing else."""
        try:
            self._pool.submit(self._back, frame, done)
        except RuntimeError:  # the pool was shut down after a shutdown timeout
            self._fail(frame, FrameError("stopped before the depth map was written"))

    def _back(self, frame: _Frame, done: Future[Inference]) -> None:
        """render, encode, write (worker thread)."""
        try:
            if done.cancelled():
                raise Superseded("a newer version arrived before inference")
            try:
                inference = done.result()
            except ModelChanged:
                self._to_engine(frame, self._model_info())
                return
            if self._newer_written(frame):
                raise Superseded("a newer version's map was written first")
            info = inference.model  # not the engine's current one: a swap may have finished since
            assert frame.decoded is not None
            frame.result.ms["infer"] = inference.seconds * 1000
            frame.clock = time.perf_counter()
            settings, job = frame.settings, frame.job
            if job.collect:
                self._collect(frame, inference, info)
                return
            nearness = self._normalise(frame, inference, info)
            encoded = _render_encode(inference, info, frame.decoded, job.output.suffix, settings, nearness)
            assert frame.source_stat is not None
            encoded = provenance.embed(encoded, _record(job, frame.source_stat, info, settings))
            frame.lap("encode")
            _ensure_folder(job.output.parent, job.output_roots)
            frame.result.size = frame.decoded.size
            frame.result.model = info.spec.path.name
            frame.result.providers = info.providers
            with self._write_locks[hash(job.output) % len(self._write_locks)]:
                if self._newer_written(frame):
                    raise Superseded("a newer version's map was written first")
                atomic_write(job.output, encoded, job.output_roots)
                if frame.outcome is not None and self.stabiliser.landed(job.output, frame.outcome):
                    frame.result.shot, frame.result.started = frame.outcome.shot, frame.outcome.started
                if settings.sidecar:
                    atomic_write(job.output.with_name(job.output.name + ".json"), self._sidecar(frame), job.output_roots)
                with self._lock:
                    self._written[job.output] = (frame.seq, time.monotonic())
                    self._written.move_to_end(job.output)
                    if len(self._written) > _WRITTEN_MEMORY:
                        self._written.popitem(last=False)
            if job.error_record is not None and job.error_record.exists():
                job.error_record.unlink(missing_ok=True)
            frame.lap("write")
            frame.decoded = None
            frame.future.set_result(frame.result)
        except Exception as exc:
            self._fail(frame, exc)

    def _normalise(self, frame: _Frame, inference: Inference, info: ModelInfo) -> np.ndarray:
        """Step 1 of the render chain: the [0, 1] nearness map at model resolution (worker thread).

        In stable mode the map comes from the output's shot state as it is; the
        state this frame leaves is kept only once its map is written (see `_back`).
        """
        job, settings = frame.job, frame.settings
        if job.nearness is not None:
            return job.nearness
        kind, clip = info.profile.output, settings.render.clip_percent
        if settings.normalise != normalise.STABLE:
            return normalise.frame(inference.prediction, kind, clip)
        assert frame.decoded is not None
        frame.outcome = self.stabiliser.map(
            job.output,
            inference.prediction,
            kind,
            frame.decoded.image,
            key=(info.generation, clip),
            seq=frame.seq,
            clip_percent=clip,
        )
        return frame.outcome.map

    def _collect(self, frame: _Frame, inference: Inference, info: ModelInfo) -> None:
        """Pass 1 of a sequence in `once`: keep what planning needs, write nothing."""
        assert frame.decoded is not None
        result = frame.result
        result.summary = stabilise.summarise(
            inference.prediction, info.profile.output, frame.decoded.image, frame.settings.render.clip_percent
        )
        result.prediction = inference.prediction.astype(np.float16)
        result.size = frame.decoded.size
        result.model = info.spec.path.name
        result.providers = info.providers
        frame.decoded = None
        frame.lap("encode")
        frame.future.set_result(result)

    def _front_image(self, image: _Image) -> None:
        """decode, prepare, hand to the engine (worker thread)."""
        try:
            info = self._model_info()
            image.decoded = pixels.decode(
                image.data,
                max_pixels=image.settings.max_pixels,
                min_size=info.min_frame_size,
                exr_colour=image.settings.exr.colour,
            )
            image.data = b""
            self._image_to_engine(image, info)
        except Exception as exc:
            image.future.set_exception(exc)

    def _image_to_engine(self, image: _Image, info: ModelInfo) -> None:
        assert image.decoded is not None
        tensor = pixels.prepare(image.decoded, info.contract, info.profile)
        image.lap("decode")
        inference = self.engine.infer(tensor, info.generation)
        inference.add_done_callback(lambda done: self._handoff_image(image, done))

    def _handoff_image(self, image: _Image, done: Future[Inference]) -> None:
        """Runs on the inference thread: only queue the rest."""
        try:
            self._pool.submit(self._back_image, image, done)
        except RuntimeError:  # the pool was shut down after a shutdown timeout
            image.future.set_exception(FrameError("stopped before the depth map was made"))

    def _back_image(self, image: _Image, done: Future[Inference]) -> None:
        """render, encode (worker thread)."""
        try:
            try:
                inference = done.result()
            except ModelChanged:
                self._image_to_engine(image, self._model_info())
                return
            assert image.decoded is not None
            image.ms["infer"] = inference.seconds * 1000
            image.clock = time.perf_counter()
            encoded = _render_encode(inference, inference.model, image.decoded, image.ext, image.settings)
            image.lap("encode")
            image.future.set_result(Rendered(encoded, image.decoded.size, dict(image.ms)))
        except Exception as exc:
            image.future.set_exception(exc)
        finally:
            image.decoded = None

    def _sidecar(self, frame: _Frame) -> bytes:
        st = frame.source_stat
        result = frame.result
        record: dict[str, Any] = {
            "source": frame.job.source.name,
            "width": result.size[0] if result.size else None,
            "height": result.size[1] if result.size else None,
            "source_bytes": st.st_size if st else None,
            "source_mtime": st.st_mtime if st else None,
            "model": result.model,
            "providers": list(result.providers),
            "ms": {k: round(v, 2) for k, v in result.ms.items()},
        }
        return json.dumps(record, indent=2).encode() + b"\n"

    def _fail(self, frame: _Frame, exc: BaseException) -> None:
        frame.decoded = None
        if isinstance(exc, DepthwatchError):
            frame.result.error = str(exc)
            frame.result.retryable = isinstance(exc, OutputError) and exc.retryable
            frame.result.superseded = isinstance(exc, Superseded)
            frame.result.inferred = frame.inference is not None and not frame.inference.cancelled()
        else:
            log.debug("unexpected error on %s", shown(frame.job.source), exc_info=exc)
            frame.result.error = f"internal error: {type(exc).__name__}: {exc}"
        if frame.job.error_record is not None and not frame.result.superseded:
            write_error_record(frame.job.error_record, frame.job.source, frame.result.error, frame.job.output_roots)
        if not frame.future.done():
            frame.future.set_result(frame.result)


def _render_encode(
    inference: Inference,
    info: ModelInfo,
    decoded: pixels.Decoded,
    ext: str,
    settings: Settings,
    nearness: np.ndarray | None = None,
) -> bytes:
    """The depth map at the frame's size, encoded for an output ending in `ext` (worker thread).

    `nearness`: step 1's map if already made (output.normalise: stable); else the per-frame one.
    """
    options = replace(settings.render, bits=pixels.bits_for(ext, settings.png_bits))
    if nearness is None:
        nearness = pixels.normalise(inference.prediction, info.profile.output, options)
    depth = pixels.render(nearness, decoded.size, options, guide=decoded.image)
    return pixels.encode(
        depth,
        ext,
        jpeg_quality=settings.jpeg_quality,
        png_compression=settings.png_compression,
        exr_options=settings.exr,
        exr_windows=decoded.windows,
    )


def _record(job: Job, source_stat: os.stat_result, info: ModelInfo, settings: Settings) -> dict[str, Any]:
    """The provenance record a map of this frame version carries (see `provenance`)."""
    return provenance.record_for(
        job.source.name,
        source_stat,
        model=info.spec.path.name,
        normalise=settings.normalise,
        invert=settings.render.levels.invert,
    )


def write_error_record(path: Path, source: Path, reason: str, roots: tuple[Path, ...] = ()) -> None:
    """`<frame name>.error.json` beside the output: why there is no (new) depth map."""
    record = {"source": source.name, "error": reason, "time": time.time()}
    try:
        _ensure_folder(path.parent, roots)
        atomic_write(path, json.dumps(record, indent=2).encode() + b"\n", roots)
    except OutputError as exc:
        log.warning("%s", exc)
