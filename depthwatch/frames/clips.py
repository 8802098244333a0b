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

import logging
import os
import queue
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from depthwatch.errors import DepthwatchError, FrameError, ModelChanged, OutputError, OwnOutput, Superseded
from depthwatch.files import exchange, fsync_folder, rename_noreplace, write_all
from depthwatch.frames import provenance, timeline
from depthwatch.frames.settings import Settings
from depthwatch.frames.writer import is_temp_name, really_inside, remove_own_folder, temp_name_for
from depthwatch.imaging import clipwrite, codec, normalise, render, sourcemeta, stabilise, tensor, video
from depthwatch.logtext import shown
from depthwatch.model.engine import BACKGROUND, Engine, Inference
from depthwatch.model.spec import ModelInfo
from depthwatch.threadnames import name_this_thread

log = logging.getLogger("depthwatch.clips")

#: Frames handed to the engine ahead of the one being finished: the model never waits on decoding.
WINDOW = 2
#: The source is checked for a rewrite every this many frames (and at the end).
CHECK_EVERY = 24
#: Times a clip is started over when the model is swapped mid-job.
RESTARTS = 2
#: Why a clip that changed while it was mapped (and so looked damaged) is no failure.
CHANGED = "the clip changed while it was being mapped (still being copied?); it starts over with the new version"


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
    #: The depth clip could not be written for a cause that may clear (a full disk).
    retryable: bool = False

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
    version = job.signature or _signature(job.source)
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
        except FrameError as exc:
            if _signature(job.source) != version:
                # Damaged, or short, because it is still being written (a copy that preallocates,
                # one that paused): not a bad clip; the version it becomes has an event of its own.
                result.error, result.superseded = CHANGED, True
            else:
                result.error = str(exc)
            break
        except DepthwatchError as exc:
            result.error = str(exc)
            result.retryable = isinstance(exc, OutputError) and exc.retryable
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
    if meta.comment.startswith(clipwrite.MARK):  # a depth clip, or a copy of one, whatever its name
        raise OwnOutput("is a depth clip depthwatch made; not taken as a clip")
    _refuse_replacing(job.final)  # before the work, not after it
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
                _write_new(temp / clipwrite.SEQUENCE_MARKER, clipwrite.marker_text(job.output.name).encode())
                st = os.stat(job.source)
            except OSError as exc:
                raise OutputError(f"cannot write in {shown(folder)}: {exc.strerror or exc}") from None
            # Each frame carries a map's record: never taken for a frame, and known as ours when replaced.
            record = provenance.record_for(
                job.source.name, st, model=info.spec.path.name, normalise=settings.normalise, invert=settings.render.levels.invert
            )
            sink = _WriteBehind(lambda k, depth: _write_still(temp, job.output, k, depth, settings, record, meta), gate)
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
            if written < meta.expected:  # AVI, MXF: settling said it was whole; its header says otherwise
                raise FrameError(
                    f"the clip is cut short: it holds {written} of the {meta.expected} frames its header declares (an unfinished copy?)"
                )
        finally:
            sink.close()
        if writer is not None:
            writer.close()
            writer = None
        check(0)  # a last look for a rewrite before the rename
        _rename_into_place(temp, job.final, job.output_roots, job.output.name if job.sequence else None, settings.swap_folders)
        if settings.timeline:
            timeline.write(job.source, job.final, meta, written, job.output_roots)
    except BaseException:
        if writer is not None:
            writer.abort()
        _remove(temp)
        raise
    return written, meta


def _write_still(
    folder: Path, output: Path, k: int, depth: np.ndarray, settings: Settings, record: dict[str, object], meta: video.ClipInfo
) -> None:
    """Frame k of an image sequence (numbered from output.first_frame), into the sequence's temporary folder,
    on disk before the folder is swapped in."""
    data = codec.encode(
        depth, output.suffix, jpeg_quality=settings.jpeg_quality, png_compression=settings.png_compression, exr_options=settings.exr,
        exr_frame=clipwrite.sequence_frame(meta, k),
    )
    number = settings.first_frame + k
    data = provenance.embed(data, {**record, "frame": number})
    try:
        _write_new(folder / output.name.format(frame=number), data)
    except OSError as exc:
        raise OutputError(f"cannot write frame {number} of {output.parent.name} in {output.parent.parent}: {exc.strerror or exc}") from None


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        write_all(fd, data)  # fsynced: the swap must never bring in frames still in the page cache
    finally:
        os.close(fd)


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


def _rename_into_place(
    temp: Path, final: Path, roots: tuple[Path, ...], frame_name: str | None = None, swap: bool = True
) -> None:
    """The whole clip (file or folder of frames) replaces the last one in one rename.

    Only a depth clip depthwatch made is replaced: anything else at the name
    (an editor's own clip called A001_depth.mov, a folder of their frames) stays,
    and a name that was free is taken only while it still is. A sequence
    folder is swapped for the last one in one step (`files.exchange`), and
    replaces only its own frames: a user's file saved in it stays (see
    `_swap_sequence`). `frame_name`: the sequence's frame names (`{frame:04d}.png`);
    `swap` False: three renames instead of the exchange (see `Settings.swap_folders`).
    """
    _refuse_replacing(final)
    if roots and not really_inside(final.parent, roots):
        raise OutputError(f"the output folder {shown(final.parent)} now leads outside the configured folders; not writing", retryable=False)
    try:
        if not temp.is_dir():
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            assert frame_name is not None
            _mark_whole(temp, frame_name)
            _sync_folder(temp)
        if temp.is_dir() and final.is_dir() and not final.is_symlink():
            assert frame_name is not None
            _swap_sequence(temp, final, frame_name, swap)
        elif os.path.lexists(final):
            os.replace(temp, final)
        else:
            rename_noreplace(temp, final)
    except FileExistsError:
        raise OutputError(
            f"{shown(final)} appeared while the clip was being mapped, and depthwatch did not make it; not replacing it",
            retryable=False,
        ) from None
    except OSError as exc:
        raise OutputError(f"cannot put {shown(final.name)} in place in {shown(final.parent)}: {exc.strerror or exc}") from None
    _sync_folder(final.parent)


def _mark_whole(folder: Path, frame_name: str) -> None:
    """Every frame is on disk: the marker says so (replaced in one rename), before the swap."""
    marker = folder / clipwrite.SEQUENCE_MARKER
    step = temp_name_for(marker)
    _write_new(step, clipwrite.marker_text(frame_name, whole=True).encode())
    os.replace(step, marker)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        fsync_folder(fd)
    finally:
        os.close(fd)


def _own_frame(folder: Path, name: str, frames: re.Pattern[str]) -> bool:
    """Whether `name` in a sequence folder is depthwatch's: the marker, or a frame carrying its record."""
    if name == clipwrite.SEQUENCE_MARKER or is_temp_name(name):
        return True
    return bool(frames.fullmatch(name)) and provenance.read(folder / name) is not None


def _swap_sequence(new: Path, final: Path, frame_name: str, atomic: bool = True) -> None:
    """Swap the new sequence folder for the last one at `final`, keeping the user's files that were in it.

    Before the swap, each user file in the old folder gets a hard link in the
    new one, so it is in `final` at every moment (files that cannot be linked,
    folders, are moved across right after). A user's file under a frame's name
    refuses the swap. After it, a file the user saved in the old folder in
    between wins over the link of its older version; the old folder, now at
    the temporary name, loses only depthwatch's files.
    """
    frames = clipwrite.frames_pattern(frame_name)
    theirs = [e for e in os.scandir(final) if not _own_frame(final, e.name, frames)]
    for entry in theirs:
        if os.path.lexists(new / entry.name):
            raise OutputError(
                f"{shown(entry.name)} in {shown(final)} is not a frame depthwatch made; not replacing it: move it away",
                retryable=False,
            )
    linked: dict[str, int] = {}
    for entry in theirs:
        try:
            os.link(entry.path, new / entry.name, follow_symlinks=False)
            linked[entry.name] = entry.stat(follow_symlinks=False).st_ino
        except OSError:
            pass  # a folder, or no hard links here: moved across after the swap
    try:
        exchange(new, final, atomic)
    except OSError:
        _unlink_all(new, linked)
        raise
    old = new  # the last sequence, now under the temporary name
    if not (old / clipwrite.SEQUENCE_MARKER).is_file():  # not ours after all (swapped in since the check): back
        exchange(old, final, atomic)
        _unlink_all(new, linked)
        raise OutputError(f"{shown(final)} is not a depth clip depthwatch made; not replacing it", retryable=False)
    kept = 0
    try:
        entries = list(os.scandir(old))
    except OSError:
        entries = []
        kept += 1
    for entry in entries:
        name = entry.name
        if _own_frame(old, name, frames):
            continue
        try:
            ino = entry.stat(follow_symlinks=False).st_ino
            if name in linked and ino == linked[name]:
                os.unlink(entry.path)  # its link is in place
            elif name in linked and os.stat(final / name, follow_symlinks=False).st_ino == linked[name]:
                os.replace(entry.path, final / name)  # saved again before the swap: the newer one
            else:
                rename_noreplace(entry.path, final / name)
        except OSError:
            kept += 1
    if not remove_own_folder(old) or kept:
        log.warning(
            "%s: some of the files saved in the last sequence's folder could not be carried over; they are in %s",
            shown(final), shown(old),
        )


def _unlink_all(folder: Path, names: dict[str, int]) -> None:
    for name in names:
        try:
            os.unlink(folder / name)
        except OSError:
            pass


def _refuse_replacing(final: Path) -> None:
    """OutputError if what is at `final` is not a depth clip (or sequence folder) depthwatch made."""
    if os.path.lexists(final) and not clipwrite.is_ours(final):
        raise OutputError(
            f"{shown(final)} is not a depth clip depthwatch made; not replacing it: move it away or change output.clip_template",
            retryable=False,
        )


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
