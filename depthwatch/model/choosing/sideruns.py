"""Runs on the inference thread that are not a frame's: a warm-up, a measured run, a quantization's steps.

The engine's thread makes them, and two other hands may end them: a stop
ends any of them (EngineStopped), and a live frame ends a preemptible one (a
step of the idle-time measurement, which is made again later: Preempted). A
run is ended through its flag (onnxruntime's `RunOptions.terminate`, checked
between operators; a quantization reads the same flag between its images).
The engine holds one `SideRuns` and hands it to the session maker; neither
reaches into the other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from depthwatch.model.choosing.measurement import Preempted
from depthwatch.model.failures import EngineStopped


class SideRuns:
    """The side run in progress (at most one: one thread makes them), and whether the engine is stopping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The run in progress: its flag, and whether a live frame ends it too.
        self._current: tuple[Any, bool] | None = None
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether a stop was asked for: what is under way ends, and nothing more starts."""
        return self._stopped

    def stop(self) -> None:
        """End the side run in progress, whatever it is, and refuse the next (the engine is stopping)."""
        with self._lock:
            self._stopped = True
            if self._current is not None:
                self._current[0].terminate = True

    def make_way(self) -> None:
        """A live frame came: end the side run in progress if it is preemptible (it is made again later)."""
        with self._lock:
            if self._current is not None and self._current[1]:
                self._current[0].terminate = True

    @contextmanager
    def running(self, flag: Any, preemptible: bool) -> Iterator[None]:
        """Hold `flag` (anything with a `terminate` attribute) as the side run in progress while the block runs.

        Raises EngineStopped before the block when the engine is stopping;
        whatever the block raises after its flag was raised goes up as what
        ended it (EngineStopped, or Preempted for a preemptible run).
        """
        with self._lock:
            if self._stopped:
                raise EngineStopped("the inference engine was stopped")
            self._current = (flag, preemptible)
        try:
            yield
        except Exception:
            self.check(flag, preemptible)
            raise
        finally:
            with self._lock:
                self._current = None

    def check(self, flag: Any, preemptible: bool) -> None:
        """Raise what ended the run flagged by `flag`, if something did (a stop, or a live frame for a preemptible one)."""
        if flag.terminate and self._stopped:
            raise EngineStopped("the inference engine was stopped") from None
        if flag.terminate and preemptible:
            raise Preempted() from None
