"""The inference thread's queue: priorities, first in first out within one, the stop marker last.

What the engine's thread takes next is decided here: the next job, or (with
an idle-time measurement pending) a measurement step once no live frame has
come for IDLE_S, ahead of a clip's frames (BACKGROUND), which would otherwise
never leave it a moment, and after every live frame.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Iterator
from typing import Any

from depthwatch.model.inference import BACKGROUND

#: Taken last, after everything queued before and since: ends the thread.
STOP = object()
#: The stop marker's priority (see `inference` for the others).
_LAST = 2


class Jobs:
    """(priority, order, item) entries: `order` never ties, so items never compare."""

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()

    def put(self, priority: int, item: Any) -> None:
        """`item` behind everything queued at `priority` or ahead of it (a requeued one too), before the stop."""
        self._queue.put((priority, next(self._order), item))

    def put_stop(self) -> None:
        self._queue.put((_LAST, next(self._order), STOP))

    def take(self, step_due_after: float | None) -> tuple[int, Any] | None:
        """The next job as (priority, item), or None when it is time for a measurement step instead.

        `step_due_after`: the monotonic time a measurement step waits for (None: none is pending).
        """
        while True:
            if step_due_after is None:
                priority, _, item = self._queue.get()
                return priority, item
            wait = step_due_after - time.monotonic()
            try:
                priority, order, item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                if wait <= 0:
                    return None
                continue
            if priority == BACKGROUND and wait <= 0:
                self._queue.put((priority, order, item))  # its own place again: clip frames keep their order
                return None
            return priority, item

    def drain(self) -> Iterator[Any]:
        """Every item still queued, the stop marker left out, taken off the queue."""
        while True:
            try:
                item = self._queue.get_nowait()[2]
            except queue.Empty:
                return
            if item is not STOP:
                yield item
