"""A clip's way through: decode -> infer -> plan the shots -> decode again -> render -> encode -> rename.

Shot-stable over the whole clip is the batch path of `imaging.stabilise`, in
two passes over a stream, so memory stays bounded however long the clip:

  pass 1  decode each frame (at reduced scale: the model needs few pixels), run
          the model on the engine's thread (priority BACKGROUND: live frames go
          first), and feed its small Summary straight into `stabilise.plan`,
          which finds the cuts and each shot's range as the frames go by. The
          prediction is kept (float16, model resolution) while the clip's hold
          stays under `hold_bytes`; past it, pass 2 runs the model again.
  pass 2  decode again, `stabilise.apply` frame by frame in order, render at
          the clip's size (refined along the frame's edges) and encode.

Nothing holds the clip: one decoded frame at a time, plus a window of
`WINDOW` frames waiting on the model. In `frame` mode there is no pass 1.

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
from depthwatch.frames.pipeline import Settings
from depthwatch.frames.writer import really_inside, temp_name_for
from depthwatch.imaging import clipwrite, normalise, pixels, stabilise, video
from depthwatch.logtext import shown
from depthwatch.model.engine import BACKGROUND, Engine, Inference
from depthwatch.model.spec import ModelInfo

#: Frames handed to the engine ahead of the one being finished: the model never waits on decoding.
WINDOW = 2
#: Predictions kept between the passes (float16 at model resolution: about 2600 frames of a
#: 224x224 model); frames past it are run through the model again in pass 2.
HOLD_BYTES = 256 * 1024 * 1024
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
    """Where a clip job stands; both passes count, so `total` is twice the frames (once in frame mode)."""

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
    hold_bytes: int = HOLD_BYTES,
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
            result.frames, result.info = _make(job, engine, settings, cancelled, gate, on_progress, progress, hold_bytes)
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
    hold_bytes: int,
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
    stable = settings.normalise == normalise.STABLE
    with video.Clip(job.source) as clip:
        meta = clip.info
    if meta.width * meta.height > settings.max_pixels:
        raise FrameError(
            f"{meta.width}x{meta.height} is over the limit of {settings.max_pixels / 1e6:.0f} megapixels; raise daemon.max_megapixels"
        )
    held: list[np.ndarray | None] = []
    plans: list[stabilise.Params] = []
    frames = meta.frames
    progress.frames, progress.total = frames, frames * (2 if stable else 1)
    if stable:
        progress.phase = "depth"
        held_bytes = 0

        def summaries() -> Iterator[stabilise.Summary]:
            nonlocal held_bytes
            for image, inference in _inferred(job.source, meta, engine, info, check, gate, reduced=True):
                prediction = inference.prediction
                yield stabilise.summarise(prediction, info.profile.output, image, settings.render.clip_percent)
                kept = prediction.astype(np.float16)
                held_bytes += kept.nbytes
                held.append(kept if held_bytes <= hold_bytes else None)
                progress.done += 1
                on_progress(progress)

        plans = stabilise.plan(summaries())
        frames = len(plans)
        progress.frames, progress.total, progress.done = frames, 2 * frames, frames
    progress.phase = "writing"
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
            except OSError as exc:
                raise OutputError(f"cannot write in {folder}: {exc.strerror or exc}") from None
            sink = _WriteBehind(lambda k, depth: _write_still(temp, job.output, k, depth, settings), gate)
        else:
            assert kind is not None
            writer = clipwrite.ClipWriter(temp, kind, meta)
            sink = _WriteBehind(lambda k, depth: writer.write(depth), gate)  # type: ignore[union-attr]
        bits = 16 if kind is not None else pixels.bits_for(job.output.suffix, settings.png_bits)
        options = replace(settings.render, bits=bits)
        previous: np.ndarray | None = None
        kind_out = info.profile.output
        clip_percent = settings.render.clip_percent
        try:
            for k, (image, prediction) in enumerate(_second_pass(job.source, meta, engine, info, check, gate, held, stable)):
                if stable:
                    if k >= len(plans):
                        raise FrameError("the clip changed between the two passes (more frames the second time); drop it again")
                    nearness, previous = stabilise.apply(prediction, kind_out, plans[k], previous, clip_percent)
                    held[k] = None
                else:
                    nearness = normalise.frame(prediction, kind_out, clip_percent)
                sink.put(k, pixels.render(nearness, (meta.width, meta.height), options, guide=image))
                written += 1
                progress.done += 1
                on_progress(progress)
            sink.finish()
        finally:
            sink.close()
        if stable and written != len(plans):
            raise FrameError(f"the clip changed between the two passes ({len(plans)} frames, then {written}); drop it again")
        if writer is not None:
            writer.close()
            writer = None
        check(0)  # a last look for a rewrite before the rename
        _rename_into_place(temp, job.final, job.output_roots)
    except BaseException:
        if writer is not None:
            writer.abort()
        _remove(temp)
        raise
    return written, meta


def _write_still(folder: Path, output: Path, k: int, depth: np.ndarray, settings: Settings) -> None:
    """Frame k of an image sequence, into the sequence's temporary folder."""
    data = pixels.encode(
        depth, output.suffix, jpeg_quality=settings.jpeg_quality, png_compression=settings.png_compression, exr_options=settings.exr
    )
    try:
        with open(folder / output.name.format(frame=k), "xb") as f:
            f.write(data)
    except OSError as exc:
        raise OutputError(f"cannot write frame {k} of {output.parent.name} in {output.parent.parent}: {exc.strerror or exc}") from None


class _WriteBehind:
    """Encodes and writes pass 2's maps on a thread of its own, in order, a few frames behind.

    So decoding and rendering the next frame overlap encoding this one (the
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
            tensor = pixels.prepare(pixels.Decoded(image, size, "clip"), info.contract, info.profile)
            window.append((image, engine.infer(tensor, info.generation, priority=BACKGROUND)))
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


def _second_pass(
    source: Path,
    meta: video.ClipInfo,
    engine: Engine,
    info: ModelInfo,
    check: Callable[[int], None],
    gate: Callable[[], None],
    held: list[np.ndarray | None],
    stable: bool,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each frame with its prediction: kept from pass 1, or inferred now.

    The frame comes at the reduced scale pass 1 used, as a still's JPEG is decoded
    at reduced scale: it is the guide of the edge-aware upscale (and the model's
    input), which needs no more pixels than that.
    """
    if not stable or not held or all(p is None for p in held[: len(held)]):
        for image, inference in _inferred(source, meta, engine, info, check, gate, reduced=True):
            yield image, inference.prediction
        return
    scale = _reduction((meta.width, meta.height), info.min_frame_size)
    with video.Clip(source) as clip:
        for k, image in enumerate(clip.frames(scale)):
            check(k)
            gate()
            prediction = held[k] if k < len(held) else None
            if prediction is None:
                if k >= len(held):
                    raise FrameError("the clip changed between the two passes (more frames the second time); drop it again")
                tensor = pixels.prepare(pixels.Decoded(image, (meta.width, meta.height), "clip"), info.contract, info.profile)
                _, inference = _finish((image, engine.infer(tensor, info.generation, priority=BACKGROUND)), info)
                prediction = inference.prediction
            yield image, prediction


def _reduction(size: tuple[int, int], min_size: tuple[int, int] | None) -> int:
    """The largest of 8, 4, 2 by which the frame can shrink and still give the model its pixels.

    The same rule as a still JPEG's reduced decode (`pixels`), so a clip's frame
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
        raise OutputError(f"cannot create the output folder {folder}: {exc.strerror or exc}") from None


def _rename_into_place(temp: Path, final: Path, roots: tuple[Path, ...]) -> None:
    """The whole clip (file or folder of frames) replaces the last one in one rename."""
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
