"""A clip's way through: decode -> infer -> shot planner -> render -> encode -> rename, in one pass.

Shot-stable over the whole clip is the offline path of `imaging.stabilise`:
each frame is decoded (at the reduced scale a still's JPEG would be: the
model and the edge-aware upscale need no more pixels), run through the model
on the engine's thread (priority BACKGROUND: live frames go first), and fed
with its small Summary to `stabilise.stabilised`, the shot planner `once` and
the farm share. The planner finds the cuts and each shot's range and hands
back each frame's map as soon as the frames it depends on are in, so at most
`stabilise.held_at_most()` frames (with their reduced images) are held however
long the clip: the clip is decoded once, as a stream, and never held.

The depth clip is written under a temporary name beside its final one (the
writer's pid in it, so a start-up sweep removes only a dead writer's) and
renamed into place only once whole: an editor never sees a partial clip. A
stop request, a newer version of the clip, or any error removes the
temporary file and leaves the last good output as it was.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from depthwatch.errors import DepthwatchError, FrameError, ModelChanged, OutputError, Superseded
from depthwatch.frames import timeline
from depthwatch.frames.settings import Settings
from depthwatch.frames.writer import really_inside, temp_name_for
from depthwatch.imaging import clipwrite, codec, normalise, render, sourcemeta, stabilise, tensor, video
from depthwatch.logtext import shown
from depthwatch.model.engine import BACKGROUND, Engine, Inference
from depthwatch.model.spec import ModelInfo
from depthwatch.threadnames import name_this_thread

#: Frames handed to the engine ahead of the one being finished: the model never waits on decoding.
WINDOW = 2
#: The source is checked for a rewrite every this many frames (and at the end).
CHECK_EVERY = 24
#: Times a clip is started over when the model is swapped mid-job.
RESTARTS = 2


@dataclass(frozen=True)
class ClipJob:
    """One clip to turn into one depth clip; keyed by `output` like a frame's job."""

    source: Path
    #: The depth clip, or for an image sequence a path whose name holds the `{frame}` field.
    output: Path
    #: (size, mtime_ns, inode) when the watcher found it complete (None: take what is there).
    signature: tuple[int, int, int] | None = None
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
class ClipResult:
    job: ClipJob
    frames: int = 0
    seconds: float = 0.0
    info: video.ClipInfo | None = None
    error: str | None = None
    #: Stopped for a newer version, or by a stop request: not a failure of the clip.
    superseded: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error:
            return f"{shown(self.job.source)}: {self.error}"
        fps = self.frames / self.seconds if self.seconds > 0 else 0.0
        what = self.info.describe() if self.info else f"{self.frames} frames"
        return f"{shown(self.job.source.name)} -> {shown(self.job.final.name)} {what}: {self.frames} frames in {self.seconds:.1f} s ({fps:.1f} fps)"


class _Restart(Exception):
    """The model was swapped mid-clip: its shots must be planned again with one model."""


def make_clip(
    job: ClipJob,
    engine: Engine,
    settings: Settings,
    *,
    cancelled: Callable[[], str | None] = lambda: None,
    gate: Callable[[], None] = lambda: None,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> ClipResult:
    """Make `job`'s depth clip; the result says what happened (errors included, never raised).

    `cancelled()` is asked between frames: a reason (a newer version, a stop)
    ends the job with nothing written. `gate()` is called before each frame's
    work and may block: the daemon holds clip frames there while live frames
    are waiting. `on_progress` gets the same Progress object after each step.
    """
    began = time.monotonic()
    result = ClipResult(job)
    progress = Progress(job)
    for attempt in range(RESTARTS + 1):
        try:
            result.frames, result.info = _make(job, engine, settings, cancelled, gate, on_progress, progress)
            break
        except _Restart:
            if attempt == RESTARTS:
                result.error = "the model changed while the clip was being mapped, again and again; drop the clip again"
                break
            progress = Progress(job)
        except Superseded as exc:
            result.error, result.superseded = str(exc), True
            break
        except DepthwatchError as exc:
            result.error = str(exc)
            break
    result.seconds = time.monotonic() - began
    return result


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _make(
    job: ClipJob,
    engine: Engine,
    settings: Settings,
    cancelled: Callable[[], str | None],
    gate: Callable[[], None],
    on_progress: Callable[[Progress], None],
    progress: Progress,
) -> tuple[int, video.ClipInfo]:
    signature = job.signature or _signature(job.source)

    def check(k: int) -> None:
        reason = cancelled()
        if reason:
            raise Superseded(reason)
        if k % CHECK_EVERY == 0 and _signature(job.source) != signature:
            raise Superseded("the clip was rewritten while it was being mapped; it starts over with the new version")

    info = engine.info or engine.wait_ready()
    kind = None if job.sequence else clipwrite.kind_for(job.output.suffix)
    if kind is None and not job.sequence:
        raise FrameError(f"cannot write a depth clip as {job.output.suffix!r}; use .mov, .mkv, .mp4 or an image sequence")
    if settings.timeline:
        timeline.check(job.sequence)
    stable = settings.normalise == normalise.STABLE
    with video.Clip(job.source) as clip:
        meta = clip.info
    if meta.width * meta.height > settings.max_pixels:
        raise FrameError(
            f"{meta.width}x{meta.height} is over the limit of {settings.max_pixels / 1e6:.0f} megapixels; raise daemon.max_megapixels"
        )
    progress.frames = progress.total = meta.frames
    progress.phase = "mapping"
    on_progress(progress)
    folder = job.final.parent
    _ensure_folder(folder, job.output_roots)
    temp = temp_name_for(job.final)
    writer: clipwrite.ClipWriter | None = None
    written = 0
    try:
        if job.sequence:
            try:
                os.mkdir(temp)
                (temp / clipwrite.SEQUENCE_MARKER).write_text(clipwrite.MARK + "\n")
            except OSError as exc:
                raise OutputError(f"cannot write in {shown(folder)}: {exc.strerror or exc}") from None
            sink = _WriteBehind(lambda k, depth: _write_still(temp, job.output, k, depth, settings, meta), gate)
        else:
            assert kind is not None
            writer = clipwrite.ClipWriter(temp, kind, meta, sourcemeta.read(job.source, meta.rate))
            sink = _WriteBehind(lambda k, depth: writer.write(depth), gate)  # type: ignore[union-attr]
        bits = 16 if kind is not None else codec.bits_for(job.output.suffix, settings.png_bits)
        options = replace(settings.render, bits=bits)
        clip_percent = settings.render.clip_percent
        size = (meta.width, meta.height)
        try:
            for k, image, nearness in _maps(job.source, meta, engine, info, check, gate, stable, clip_percent):
                sink.put(k, render.render(nearness, size, options, guide=image))
                written += 1
                progress.done = written
                progress.frames = max(progress.frames, written)
                on_progress(progress)
            sink.finish()
        finally:
            sink.close()
        if writer is not None:
            writer.close()
            writer = None
        check(0)  # a last look for a rewrite before the rename
        _rename_into_place(temp, job.final, job.output_roots)
        if settings.timeline:
            timeline.write(job.source, job.final, meta, written, job.output_roots)
    except BaseException:
        if writer is not None:
            writer.abort()
        _remove(temp)
        raise
    return written, meta


def _write_still(folder: Path, output: Path, k: int, depth: np.ndarray, settings: Settings, meta: video.ClipInfo) -> None:
    """Frame k of an image sequence, into the sequence's temporary folder (numbered from output.first_frame)."""
    data = codec.encode(
        depth, output.suffix, jpeg_quality=settings.jpeg_quality, png_compression=settings.png_compression, exr_options=settings.exr,
        exr_frame=clipwrite.sequence_frame(meta, k),
    )
    number = settings.first_frame + k
    try:
        with open(folder / output.name.format(frame=number), "xb") as f:
            f.write(data)
    except OSError as exc:
        raise OutputError(f"cannot write frame {number} of {output.parent.name} in {output.parent.parent}: {exc.strerror or exc}") from None


class _WriteBehind:
    """Encodes and writes the maps on a thread of its own, in order, a few frames behind.

    So decoding, inferring and rendering the next frame overlap encoding this one (the
    encoders release the GIL). It waits at the same `gate` as the clip thread:
    no clip frame is encoded while a live frame is waiting. An error on the
    writing side comes back at the next `put` or at `finish`; `close` always
    ends the thread.
    """

    DEPTH = 3

    def __init__(self, write: Callable[[int, np.ndarray], None], gate: Callable[[], None] = lambda: None) -> None:
        self._write = write
        self._gate = gate
        self._queue: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue(self.DEPTH)
        self._error: BaseException | None = None
        self._abandon = False
        self._thread = threading.Thread(target=self._loop, name="depthwatch-clip-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        name_this_thread()
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None or self._abandon:
                continue
            try:
                self._gate()
                self._write(*item)
            except BaseException as exc:  # handed back to the clip thread
                self._error = exc

    def put(self, k: int, depth: np.ndarray) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((k, depth))

    def finish(self) -> None:
        """Wait for every map to be written; raise what went wrong, if anything did."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """End the thread, dropping what is still queued (after an error or a cancel)."""
        if not self._thread.is_alive():
            return
        self._abandon = True
        self._queue.put(None)
        self._thread.join()


def _inferred(
    source: Path,
    meta: video.ClipInfo,
    engine: Engine,
    info: ModelInfo,
    check: Callable[[int], None],
    gate: Callable[[], None],
    *,
    reduced: bool,
) -> Iterator[tuple[np.ndarray, Inference]]:
    """Each frame (maybe at reduced scale) with its inference, in order; WINDOW frames ahead at the model."""
    size = (meta.width, meta.height)
    scale = _reduction(size, info.min_frame_size) if reduced else 1
    window: deque[tuple[np.ndarray, Future[Inference]]] = deque()
    with video.Clip(source) as clip:
        for k, image in enumerate(clip.frames(scale)):
            check(k)
            gate()
            model_input = tensor.prepare(codec.Decoded(image, size, "clip"), info.contract, info.profile)
            window.append((image, engine.infer(model_input, info.generation, priority=BACKGROUND)))
            if len(window) > WINDOW:
                yield _finish(window.popleft(), info)
        while window:
            yield _finish(window.popleft(), info)


def _finish(item: tuple[np.ndarray, Future[Inference]], info: ModelInfo) -> tuple[np.ndarray, Inference]:
    image, future = item
    try:
        inference = future.result()
    except ModelChanged:
        raise _Restart() from None
    if inference.model.generation != info.generation:
        raise _Restart()
    return image, inference


def _maps(
    source: Path,
    meta: video.ClipInfo,
    engine: Engine,
    info: ModelInfo,
    check: Callable[[int], None],
    gate: Callable[[], None],
    stable: bool,
    clip_percent: tuple[float, float] | None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(k, frame at reduced scale, [0, 1] nearness map) for each frame, in order.

    Stable: through the shot planner, which holds a bounded window of frames
    (each with its reduced image, the guide of the upscale) and gives back each
    map once its shot's neighbourhood is in. Frame: each map on its own.
    """
    kind = info.profile.predicts
    inferred = _inferred(source, meta, engine, info, check, gate, reduced=True)
    if not stable:
        for k, (image, inference) in enumerate(inferred):
            yield k, image, normalise.frame(inference.prediction, kind, clip_percent)
        return

    def frames() -> Iterator[tuple[tuple[int, np.ndarray], stabilise.Summary, np.ndarray]]:
        for k, (image, inference) in enumerate(inferred):
            prediction = inference.prediction
            yield (k, image), stabilise.summarise(prediction, kind, image, clip_percent), prediction

    for (k, image), nearness, _first in stabilise.stabilised(frames(), kind, clip_percent):
        yield k, image, nearness


def _reduction(size: tuple[int, int], min_size: tuple[int, int] | None) -> int:
    """The largest of 8, 4, 2 by which the frame can shrink and still give the model its pixels.

    The same rule as a still JPEG's reduced decode (`codec`), so a clip's frame
    and the same frame as a still get the same map.
    """
    if not min_size:
        return 1
    need = max(min_size)
    short = min(size)
    for factor in (8, 4, 2):
        if short // factor >= need:
            return factor
    return 1


def _ensure_folder(folder: Path, roots: tuple[Path, ...]) -> None:
    if roots and not really_inside(folder if folder.exists() else folder.parent, roots):
        raise OutputError(f"the output folder {shown(folder)} leads outside the configured folders; not writing", retryable=False)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output folder {shown(folder)}: {exc.strerror or exc}") from None


def _rename_into_place(temp: Path, final: Path, roots: tuple[Path, ...]) -> None:
    """The whole clip (file or folder of frames) replaces the last one in one rename.

    Only a depth clip depthwatch made is replaced: anything else at the name
    (an editor's own clip called A001_depth.mov, a folder of their frames) stays.
    """
    if os.path.lexists(final) and not clipwrite.is_ours(final):
        raise OutputError(
            f"{shown(final)} is not a depth clip depthwatch made; not replacing it: move it away or change output.clip_template",
            retryable=False,
        )
    if roots and not really_inside(final.parent, roots):
        raise OutputError(f"the output folder {shown(final.parent)} now leads outside the configured folders; not writing", retryable=False)
    try:
        if temp.is_dir() and final.is_dir():
            # A folder cannot be renamed over a full one: the old one steps aside first.
            old = temp_name_for(final)
            os.rename(final, old)
            os.rename(temp, final)
            _remove(old)
        else:
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final)
    except OSError as exc:
        raise OutputError(f"cannot put {final.name} in place in {final.parent}: {exc.strerror or exc}") from None
    try:
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
