"""The daemon's signals: SIGTERM and SIGINT ask for a stop, SIGHUP for a reload; the handlers only record them.

The handler is a builtin (dict.__setitem__), not Python code: no frame of ours
runs per signal, so a flood of them can neither nest handlers (RecursionError,
"lost sys.stderr") nor re-enter a lock a handler holds (a deadlock of the main
thread). The main loop acts on what was recorded at its next look (`take`),
so a thousand SIGHUPs between two looks are one reload. Signals are captured
only while the daemon runs, and the previous handlers are put back after it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_NONE = object()


class Signals:
    """What the signal handlers recorded since the last look (`take`, main thread only)."""

    def __init__(self) -> None:
        #: Signal number -> the frame it interrupted, as left by the handler.
        self._caught: dict[int, object] = {}

    @contextmanager
    def captured(self) -> Iterator[None]:
        """The handlers in place while the body runs (main thread only: embedded elsewhere, the owner stops us)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handler = self._caught.__setitem__
        previous = {sig: signal.signal(sig, handler) for sig in (*STOP_SIGNALS, signal.SIGHUP)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            self._caught.clear()

    def take(self) -> tuple[bool, bool]:
        """(a stop was asked for, a reload was asked for) since the last look."""
        caught = self._caught
        if not caught:
            return False, False
        stop = False
        for sig in STOP_SIGNALS:
            if caught.pop(sig, _NONE) is not _NONE:
                stop = True
        return stop, caught.pop(signal.SIGHUP, _NONE) is not _NONE
