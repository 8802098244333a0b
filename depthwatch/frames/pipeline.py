"""One frame's way through: read -> decode -> prepare -> infer -> normalise -> render -> encode -> write.

Reading, decoding, rendering, encoding and writing run on a small worker pool;
only `session.run` runs on the inference thread, which hands its result back by
queueing the second half of the job on the pool (never doing it itself), so
the inference thread never waits on disk or image coding. `depthwatch once`,
the daemon, the API and the farm all send frames through here, and get the
same bound on frames in flight (each holds a decoded frame in memory): `once`
and the farm by `submit` blocking, the daemon by `feed`, which pulls from its
latest-wins queue whenever a slot frees. An image held in memory (an API
image body) is a job with bytes for a source and no output: the same path,
minus the read and the write, in the same slots, but never in all of them (a
frame from disk always finds one within about one job), and stopped where it is
by `cancel` once nobody waits for it.

This module schedules; the steps themselves live in their own modules:
`inflight` (what is held for a frame, and the steps that need nothing else:
read, decode, record, sidecar), `reading`, `imaging.codec`, `imaging.tensor`,
the engine, `imaging.render`, `provenance`, `writer`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from depthwatch.errors import (
    DepthwatchError,
    FrameError,
    ModelChanged,
    OutputError,
    Stopped,
    Superseded,
)
from depthwatch.frames import provenance
from depthwatch.frames.errorrecords import remove_error_record, write_error_record
from depthwatch.frames.folders import check_frame_folder
from depthwatch.frames.inflight import OWN_SIDECAR, FrameInFlight, MadeFrom
from depthwatch.frames.job import Job, signature_from
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.replacing import map_refusal
from depthwatch.frames.result import Result
from depthwatch.frames.settings import Settings
from depthwatch.frames.writer import atomic_write, ensure_folder
from depthwatch.imaging import normalise, stabilise, tensor
from depthwatch.imaging.beside import Beside
from depthwatch.imaging.render import Stable, ahead, depth_map
from depthwatch.logtext import shown
from depthwatch.model.contract import NHWC
from depthwatch.model.engine import Engine, Inference
from depthwatch.model.spec import ModelInfo
from depthwatch.threadnames import yield_to_inference

log = logging.getLogger("depthwatch.frames")


#: While an output's maps keep coming at least this often, a newer version of its
#: frame stops the inference in progress. Slower than that (a long scrub, playback),
#: the inference in progress finishes and lands, so the editor still sees a live map.
PREVIEW_INTERVAL_S = 0.25
#: Outputs whose last write is remembered (least recently used forgotten first).
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

    def __init__(
        self,
        engine: Engine,
        workers: int = 2,
        niceness: int = 0,
        in_flight: int | None = None,
        on_stage: Callable[[object, str | None], None] | None = None,
    ) -> None:
        """`on_stage(label, stage)`: called on the worker thread as it begins a job's first or second half
        (label: the frame's (path, version), None for an image in memory), and with stage None as it is
        done with it: the daemon's supervisor keeps what each worker does, on disk too."""
        self.engine = engine
        self._on_stage = on_stage
        #: Frames between submission and result at most: each may hold a decoded frame, so
        #: this bounds memory; two more than the workers keeps the model fed meanwhile.
        self.in_flight = in_flight or workers + 2
        self._slots = threading.Semaphore(self.in_flight)
        #: Images in memory take slots too, but leave one for frames from disk, so that
        #: however many API requests send images, a dropped frame waits about one job.
        self.held_in_flight = max(1, self.in_flight - 1)
        self._held_slots = threading.Semaphore(self.held_in_flight)
        #: Images in memory in flight, by their future (see `cancel`).
        self._held: dict[Future[Result], FrameInFlight] = {}
        self._workers = workers
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="depthwatch-worker",
            initializer=yield_to_inference,
            initargs=(niceness,),
        )
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._newest: dict[Path, FrameInFlight] = {}
        self._seq = itertools.count(1)
        # (seq, time, what it was made from) of the last map written per output; a short
        # memory is enough, since only jobs in flight (a handful) ever compare against it.
        self._written: LRUCache[Path, tuple[int, float, MadeFrom | None]] = LRUCache(_WRITTEN_MEMORY)
        # Shot state per output for output.normalise: stable (bounded; see stabilise).
        self.stabiliser = stabilise.Stabiliser()
        # Writes to one output are serialised (by stripe, to keep this bounded) so the
        # check "nothing newer was written" and the write happen as one.
        self._write_locks = [threading.Lock() for _ in range(64)]
        self._source: tuple[LatestWinsQueue, Callable[[], Settings], Callable[[Job, Result], None]] | None = None

    def submit(self, job: Job, settings: Settings, timeout: float | None = None) -> Future[Result]:
        """Start a job once fewer than `in_flight` are in progress (blocks until then).

        The future always completes with a Result (errors included). TimeoutError
        if no slot freed within `timeout`. A job with no output (image bytes in
        memory) takes no part in latest-wins, may hold all slots but one, and its
        Result carries the encoded map.
        """
        if job.output is None:
            started = time.monotonic()
            if not self._held_slots.acquire(timeout=timeout):
                raise TimeoutError(f"{self.held_in_flight} images still in flight")
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            if not self._slots.acquire(timeout=left):
                self._held_slots.release()
                raise TimeoutError(f"{self.in_flight} frames still in flight")
            return self._start(job, settings)
        if not self._slots.acquire(timeout=timeout):  # None: wait (a Semaphore takes -1 as "not at all")
            raise TimeoutError(f"{self.in_flight} frames still in flight")
        return self._start(job, settings)

    def cancel(self, future: Future[Result]) -> None:
        """Nobody waits for this image's map any more (an API client gone or out of time): stop it.

        Before the model it stops at the next stage; a queued inference is
        dropped and a running one told to stop, so the inference thread moves on
        to work someone still waits for. The future still completes (superseded).
        """
        with self._lock:
            frame = self._held.get(future)
        if frame is None:
            return
        frame.abandoned = True
        if frame.inference is not None:
            self.engine.abort(frame.inference, running_too=True)

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

    def _start(
        self,
        job: Job,
        settings: Settings,
        then: Callable[[Future[Result]], None] | None = None,
    ) -> Future[Result]:
        """Begin a job whose slot is already taken; `then` runs before the slot frees."""
        future: Future[Result] = Future()
        if then is not None:
            future.add_done_callback(then)
        frame = FrameInFlight(job, settings, future, Result(job), seq=next(self._seq))
        older: FrameInFlight | None = None
        with self._lock:
            self._pending += 1
            if job.output is not None:
                older = self._newest.get(job.output)
                self._newest[job.output] = frame
            else:
                self._held[future] = frame
            _, last_map, _ = self._written.get(job.output, (0, float("-inf"), None))
        if older is not None:
            frame.follows = older.future
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

    def _finished(self, frame: FrameInFlight) -> None:
        frame.close_folder()
        frame.follows = frame.ahead = None
        with self._idle:
            if frame.job.output is not None and self._newest.get(frame.job.output) is frame:
                del self._newest[frame.job.output]
            self._held.pop(frame.future, None)
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()
        self._slots.release()
        self.pull()  # a waiting frame from disk first, then another image may take a slot
        if frame.job.output is None:
            self._held_slots.release()

    # -- worker side ----------------------------------------------------------------

    def _front(self, frame: FrameInFlight) -> None:
        """read, decode, prepare, hand to the engine (worker thread)."""
        on_stage = self._on_stage
        if on_stage is not None:
            on_stage(_label(frame.job), "read")
        try:
            self._front_steps(frame)
        finally:
            if on_stage is not None:
                on_stage(None, None)

    def _front_steps(self, frame: FrameInFlight) -> None:
        try:
            frame.check()
            job = frame.job
            data = job.data if job.data is not None else frame.read()
            frame.lap("read")
            info = self._model_info()
            if self._made_already(frame, data, info):
                frame.future.set_result(frame.result)
                return
            frame.decode(data, info)
            del data
            if job.nearness is not None:  # once, pass 2: the map is made, only write it
                done: Future[Inference] = Future()
                done.set_result(Inference(job.nearness, 0.0, info))
                self._back(frame, done)
                return
            self._to_engine(frame, info)
        except Exception as exc:
            self._fail(frame, exc)

    def _made_already(self, frame: FrameInFlight, data: bytes, info: ModelInfo) -> bool:
        """Whether the map on disk was made from these very bytes, with these settings and model.

        Two producers (the watcher, the API) and a watcher that cannot always
        tell two events for one version from two versions within one clock tick
        (same size, mtime and inode) may hand over one version twice; running it
        again would give the same map. The bytes decide: same signature, same
        CRC-32 (0.1 ms a frame), same settings and model, and the map still on
        disk with its record: the job ends `unchanged`, nothing is written.
        """
        job = frame.job
        if job.output is None or job.data is not None or job.nearness is not None or job.collect:
            return False
        assert frame.source_stat is not None
        made_from = MadeFrom(job.source, signature_from(frame.source_stat), zlib.crc32(data), frame.settings, info.generation)
        frame.made_from = made_from
        with self._lock:
            last = self._written.get(job.output)
        if last is None or last[2] != made_from:
            return False
        record = provenance.read(job.output, dir_fd=frame.beside(job.output))
        if record is None or not provenance.same_version(record, frame.source_stat):
            return False
        frame.result.unchanged = True
        return True

    def _model_info(self) -> ModelInfo:
        info = self.engine.info
        return info if info is not None else self.engine.wait_ready()

    def _to_engine(self, frame: FrameInFlight, info: ModelInfo) -> None:
        assert frame.decoded is not None
        prepared = tensor.prepare(frame.decoded, info.contract, info.profile)
        frame.lap("prepare")
        frame.check()
        # What the run is of (a frame on disk, this version): a crash inside the runtime names it (`daemon.blackbox`).
        label = (frame.job.source, signature_from(frame.source_stat)) if frame.source_stat is not None and frame.job.data is None else None
        frame.inference = self.engine.infer(prepared, info.generation, label=label)
        if frame.abandoned:  # a newer job (or a cancel) came while this one was being handed over
            self.engine.abort(frame.inference, running_too=frame.job.output is None)
        elif info.runs_off_the_cpu:
            self._ahead(frame, info, prepared)
        # Only now: the rest of the job starts after the work ahead (at once if the model was quicker).
        frame.inference.add_done_callback(lambda done: self._handoff(frame, done))

    def _ahead(self, frame: FrameInFlight, info: ModelInfo, prepared: np.ndarray) -> None:
        """While the model runs: what the map needs of the frame alone (`render.ahead`).

        Only beside an accelerator's run (`ModelInfo.runs_off_the_cpu`): beside
        a run on the CPU it slows the run as much as it saves. The flow from the
        output's shot is left for later when an older frame of the output is
        still in flight: that one would likely land first and make it stale.
        """
        follows, frame.follows = frame.follows, None
        decoded = frame.decoded
        if decoded is None or frame.job.collect:
            return
        try:
            frame.ahead = ahead(
                decoded,
                _prediction_grid(info, prepared),
                frame.settings.render,
                self._stable(frame, info),
                motion=follows is None or follows.done(),
            )
        except Exception:  # made again after inference, where any real fault is reported
            log.debug("work ahead of the model failed for %s", shown(frame.job.source), exc_info=True)

    def _newer_written(self, frame: FrameInFlight) -> bool:
        if frame.job.output is None:
            return False
        with self._lock:
            return self._written.get(frame.job.output, (0, 0.0, None))[0] > frame.seq

    def _handoff(self, frame: FrameInFlight, done: Future[Inference]) -> None:
        """Runs on the inference thread: only queue the rest of the job, do nothing else."""
        try:
            self._pool.submit(self._back, frame, done)
        except RuntimeError:  # the pool was shut down after a shutdown timeout
            self._fail(frame, FrameError("stopped before the depth map was written"))

    def _back(self, frame: FrameInFlight, done: Future[Inference]) -> None:
        """normalise, render, encode, write (worker thread)."""
        on_stage = self._on_stage
        if on_stage is not None:
            on_stage(_label(frame.job), "render")
        try:
            self._back_steps(frame, done)
        finally:
            if on_stage is not None:
                on_stage(None, None)

    def _back_steps(self, frame: FrameInFlight, done: Future[Inference]) -> None:
        try:
            if done.cancelled():
                if self.engine.interrupted:
                    raise Stopped("the daemon stopped before inference")
                raise Superseded("a newer version arrived before inference")
            try:
                inference = done.result()
            except ModelChanged:
                self._to_engine(frame, self._model_info())
                return
            if self._newer_written(frame):
                raise Superseded("a newer version's map was written first")
            info = inference.model  # not the engine's current one: a swap may have finished since
            decoded = frame.decoded
            assert decoded is not None
            result, settings, job = frame.result, frame.settings, frame.job
            result.ms["infer"] = inference.seconds * 1000
            frame.clock = time.perf_counter()
            result.size = decoded.size
            result.model = info.spec.path.name
            result.providers = info.providers
            if job.collect:
                frame.collect(inference, info)
                return
            made = depth_map(
                inference.prediction,
                info.profile.predicts,
                decoded,
                ext=job.map_ext,
                options=settings.render,
                encoding=settings.encoding,
                nearness=job.nearness,
                stable=self._stable(frame, info),
                lap=frame.lap,
                ahead=frame.ahead,
                beside=self._spare_worker(),
            )
            frame.decoded = None
            if job.output is None:  # an image in memory: the map goes back to whoever asked
                result.data = made.data
                frame.future.set_result(result)
                return
            frame.shot = made.shot
            encoded = provenance.embed(made.data, frame.record(info))
            frame.lap("encode")
            self._write(frame, job.output, encoded)
            frame.lap("write")
            frame.future.set_result(result)
        except Exception as exc:
            self._fail(frame, exc)

    def _spare_worker(self) -> Beside | None:
        """A worker with nothing to do, when this frame is the only one in flight (else None).

        Why: a frame on its own (an editor's drop, an API request) leaves the
        other workers idle while its map is encoded; with a burst every worker
        has a frame of its own, and splitting work would only add hand-offs.
        """
        if self._workers < 2 or self._pending > 1:
            return None
        return self._pool.submit

    def _write(self, frame: FrameInFlight, output: Path, encoded: bytes) -> None:
        """The map (and its sidecar) onto disk, unless a newer job's map got there first."""
        job, result = frame.job, frame.result
        assert frame.folder is not None
        check_frame_folder(job.source, frame.folder)  # the map goes where its frame was read, or nowhere
        beside = frame.beside(output)
        if beside is None:
            ensure_folder(output.parent, job.output_roots)
        with self._write_locks[hash(output) % len(self._write_locks)]:
            if self._newer_written(frame):
                raise Superseded("a newer version's map was written first")
            # Only a map depthwatch made is ever replaced (its record, read just before the rename).
            atomic_write(output, encoded, job.output_roots, folder_fd=beside, may_replace=map_refusal)
            if frame.shot is not None and self.stabiliser.landed(output, frame.shot):
                result.shot, result.started = frame.shot.shot, frame.shot.started
            if frame.settings.sidecar:
                try:
                    atomic_write(
                        output.with_name(output.name + ".json"), frame.sidecar(), job.output_roots,
                        folder_fd=beside, may_replace=OWN_SIDECAR,
                    )
                except OutputError as exc:
                    if exc.retryable:
                        raise
                    log.warning("%s", exc)  # a user's file under the sidecar's name stays; the map is written
            with self._lock:
                self._written[output] = (frame.seq, time.monotonic(), frame.made_from)
        if job.error_record is not None:
            remove_error_record(job.error_record, frame.beside(job.error_record))

    def _stable(self, frame: FrameInFlight, info: ModelInfo) -> Stable | None:
        """output.normalise: stable: where this frame's map joins its output's shot.

        The map comes from the output's shot state as it is; the state this
        frame leaves is kept only once its map is written (see `_write`). An
        image in memory has no output, so no shot: each its own map.
        """
        job, settings = frame.job, frame.settings
        if settings.normalise != normalise.STABLE or job.output is None:
            return None
        return Stable(self.stabiliser, job.output, (info.generation, settings.render.clip_percent), frame.seq)

    def _fail(self, frame: FrameInFlight, exc: BaseException) -> None:
        frame.decoded = None
        result, job = frame.result, frame.job
        if isinstance(exc, DepthwatchError):
            result.failed_with(exc)
            result.inferred = frame.inference is not None and not frame.inference.cancelled()
        else:
            log.error("internal error on %s (a bug; please report it with this traceback)", shown(job.source), exc_info=exc)
            result.error = f"internal error: {type(exc).__name__}: {exc}"
        if job.error_record is not None and not result.superseded:
            # Beside the frame, into the folder it was read from (never a folder swapped in since).
            write_error_record(job.error_record, job.source, result.error, job.output_roots, frame.beside(job.error_record))
        if not frame.future.done():
            frame.future.set_result(result)


def _label(job: Job) -> tuple[Path, object] | None:
    """What a worker notes it works on: a frame on disk and the version the watcher saw; None for bytes in memory."""
    if job.data is not None or job.signature is None:
        return None
    return job.source, job.signature


def _prediction_grid(info: ModelInfo, prepared: np.ndarray) -> tuple[int, int] | None:
    """The prediction's rows and columns as the graph declares them, else the input's (a dynamic graph)."""
    rows, cols = info.contract.output_shape[-2:] if len(info.contract.output_shape) >= 2 else (None, None)
    if isinstance(rows, int) and isinstance(cols, int) and rows > 1 and cols > 1:
        return rows, cols
    if prepared.ndim != 4:
        return None
    return prepared.shape[1:3] if info.contract.layout == NHWC else prepared.shape[2:4]
