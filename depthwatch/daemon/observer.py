"""watchdog's observer, made for the config, and what it tells: file events and its own warnings.

The handler runs on watchdog's dispatcher thread and only hands each event
on; it returns at once. On Linux the native observer is inotify's, made to
report a file moved in from another folder as a move (complete at once),
not as a creation (maybe still being written); only inotify's close and
move events are trusted to say a file is complete. watchdog says only in
its log that the kernel dropped events, so its warnings are read here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from depthwatch.config import WatchConfig
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch.watch")

#: watchdog's loggers for inotify: it says only there that the kernel dropped events.
_WATCHDOG_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")


def _native_observer() -> Any:
    """watchdog's native observer; on Linux one that reports a file moved in from another
    folder as a move (complete at once), not as a creation (maybe still being written)."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux
        return Observer()
    return InotifyObserver(generate_full_events=True)


def trusts_close_events(observer: Any) -> bool:
    """inotify reports close-after-write and moves reliably; others need the settle check."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux
        return False
    return isinstance(observer, InotifyObserver)


#: The events the watcher acts on where close events are trusted (`Watcher.on_event`). Asked of
#: inotify alone, the kernel sends no others: otherwise every frame the daemon reads (open, close
#: without writing), every map it writes (open, each write's modify) and every folder it syncs raises
#: events that watchdog's threads turn into objects, group and queue, only for the handler to drop
#: them. Not asked for, watchdog's threads spend 1.0-1.15 ms of CPU a frame in a burst of 1080p
#: frames rather than 1.8-2.0 (600 frames, a fast model, three runs each).
#: Elsewhere (polling, FSEvents) the watcher settles files by their changes, and takes every event.
TRUSTED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent, FileClosedEvent, FileMovedEvent, DirCreatedEvent, DirMovedEvent, DirDeletedEvent,
]


def start_observer(config: WatchConfig) -> Any:
    """A started observer of the kind `watch.observer` names (polling every `watch.poll_interval_ms`)."""
    if config.observer == "native" and Observer is not PollingObserver:  # polling: no native one here
        observer = _native_observer()
    else:
        observer = PollingObserver(timeout=config.poll_interval_ms / 1000)
    observer.name = "depthwatch-observer"
    observer.start()
    return observer


class EventHandler(FileSystemEventHandler):
    """Runs on watchdog's dispatcher thread: hand the event over and return."""

    def __init__(self, on_event: Callable[[FileSystemEvent], None]) -> None:
        self._on_event = on_event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._on_event(event)


class WatchdogLog(logging.Handler):
    """watchdog's own warnings as depthwatch lines; one about lost events (inotify's queue
    overflowed: every event beyond it, a frame's among them, is gone) calls `events_lost`."""

    def __init__(self, events_lost: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._events_lost = events_lost

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "overflow" in message.lower():
            self._events_lost()
        else:
            log.log(record.levelno, "watchdog: %s", shown(message))

    def attach(self) -> None:
        """Start reading watchdog's inotify loggers."""
        for name in _WATCHDOG_LOGGERS:
            logging.getLogger(name).addHandler(self)

    def detach(self) -> None:
        for name in _WATCHDOG_LOGGERS:
            logging.getLogger(name).removeHandler(self)
