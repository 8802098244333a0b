"""The streamed pass: each frame decoded once (at reduced scale), inferred, planned into shots, rendered, written behind.

Shot-stable over the whole clip is the offline path of `imaging.stabilise`:
each frame is decoded (at the reduced scale a still's JPEG would be,
`codec.reduction`: the model and the edge-aware upscale need no more pixels),
run through the model on the engine's thread (priority BACKGROUND: live
frames go first), and fed with its small Summary to `stabilise.stabilised`,
the shot planner `once` and the farm share. The planner finds the cuts and
each shot's range and hands back each frame's map as soon as the frames it
depends on are in, so at most `stabilise.held_at_most()` frames (with their
reduced images) are held however long the clip: the clip is decoded once, as
a stream, and never held. The maps are encoded and written on a thread of
their own, a few frames behind (`WriteBehind`).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from depthwatch.errors import ModelChanged
from depthwatch.imaging import codec, normalise, stabilise, tensor
from depthwatch.media import video
from depthwatch.model.engine import BACKGROUND, Engine, Inference
from depthwatch.model.spec import ModelInfo
from depthwatch.threadnames import name_this_thread

#: Frames handed to the engine ahead of the one being finished: the model never waits on decoding.
WINDOW = 2


class Restart(Exception):
    """The model was swapped mid-clip: its shots must be planned again with one model."""


@dataclass(frozen=True)
class Pass:
    """One streamed pass over a clip: its frames through the model, then into maps.

    `check(k)` is called before frame k (it raises to stop the pass), `gate()`
    before each frame's work (it may block while live frames wait).
    """

    source: Path
    meta: video.ClipInfo
    engine: Engine
    info: ModelInfo
    check: Callable[[int], None]
    gate: Callable[[], None]

    def inferred(self) -> Iterator[tuple[np.ndarray, Inference]]:
        """Each frame at reduced scale with its inference, in order; WINDOW frames ahead at the model."""
        info = self.info
        size = self.meta.shown_size  # frames turned upright, as the model was trained (`orientation`)
        scale = codec.reduction(size, info.min_frame_size)
        window: deque[tuple[np.ndarray, Future[Inference]]] = deque()
        with video.Clip(self.source) as clip:
            for k, image in enumerate(clip.frames(scale, self.meta.turn)):
                self.check(k)
                self.gate()
                model_input = tensor.prepare(codec.Decoded(image, size, "clip"), info.contract, info.profile)
                window.append((image, self.engine.infer(model_input, info.generation, priority=BACKGROUND)))
                if len(window) > WINDOW:
                    yield self._finish(window.popleft())
            while window:
                yield self._finish(window.popleft())

    def _finish(self, item: tuple[np.ndarray, Future[Inference]]) -> tuple[np.ndarray, Inference]:
        image, future = item
        try:
            inference = future.result()
        except ModelChanged:
            raise Restart() from None
        if inference.model.generation != self.info.generation:
            raise Restart()
        return image, inference

    def maps(self, stable: bool, clip_percent: tuple[float, float] | None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(k, frame at reduced scale, [0, 1] nearness map) for each frame, in order.

        Stable: through the shot planner, which holds a bounded window of frames
        (each with its reduced image, the guide of the upscale) and gives back each
        map once its shot's neighbourhood is in. Frame: each map on its own.
        """
        kind = self.info.profile.predicts
        inferred = self.inferred()
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


class WriteBehind:
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
