"""Work offered to another thread while this one does its own, and taken back if nobody started it.

Why: a frame on its own (an editor's drop, an API request) goes through its
stages one after another on one worker while the other core waits. Some of
that work splits in two (a JPEG's upper and lower strips: `jpegstrips`), and
the pipeline's idle worker can do one half. Waiting on a pool's future from a
pool thread could wait for ever (every worker waiting on work queued behind
it), so the caller never waits for work that has not started: `take` runs it
on the spot unless another thread already has it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: Hands a no-argument function to another thread to run soon, and returns at once (a
#: pool's `submit`, say); it may also drop it (a pool shut down): `Offered.take` runs it then.
Beside = Callable[[Callable[[], None]], object]


class Offered(Generic[T]):
    """`fn`, offered through `beside`: whichever thread comes first runs it, once."""

    def __init__(self, fn: Callable[[], T], beside: Beside | None) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._started = False
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        if beside is not None:
            try:
                beside(self._run)
            except RuntimeError:  # the pool is shut down: `take` runs it
                pass

    def _claim(self) -> bool:
        with self._lock:
            if self._started:
                return False
            self._started = True
            return True

    def _run(self) -> None:
        if not self._claim():
            return
        try:
            self._result = self._fn()
        except BaseException as exc:  # handed to whoever takes it
            self._error = exc
        finally:
            self._done.set()

    def take(self) -> T:
        """The result: made here if no other thread has started it, else waited for (it is running)."""
        if self._claim():
            return self._fn()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]
