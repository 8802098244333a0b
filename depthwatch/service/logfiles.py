"""The end of a service's log files, and what is appended to them (launchd's logs are plain files).

Logs grow without bound, so they are read from the end; following polls the
sizes, as `tail -F` does, and starts a file over when it shrank (rotated).

Following ends with Ctrl-C, so SIGINT must raise KeyboardInterrupt whatever the
process inherited: a program started in the background by a non-interactive
shell (a CI runner, `cmd &` in a script, nohup-style launchers) inherits SIGINT
*ignored*, and Python then installs no handler of its own, so `logs -f` would
never stop. The handler is put in place before the first line is printed.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from depthwatch.errors import DepthwatchError

#: A log file the daemon writes itself, rotating it (the LaunchAgent sets it): launchd opens
#: StandardErrorPath once and never lets go of it, so that file can be neither rotated nor
#: reopened, and a line a frame grows it without end.
LOG_FILE_ENV = "DEPTHWATCH_LOG_FILE"
#: The log file is started over at this size; this many earlier ones are kept (.1 the newest).
ROTATE_BYTES = 10 * 2**20
ROTATE_KEEP = 5


def rotating_handler(path: Path) -> logging.Handler:
    """The standard library's rotating handler on `path`; OSError if it cannot be opened for appending."""
    return _LogFile(path, maxBytes=ROTATE_BYTES, backupCount=ROTATE_KEEP, encoding="utf-8")


class _LogFile(logging.handlers.RotatingFileHandler):
    """The rotating log file, where a line that cannot be written (a full disk) is counted, not lost unsaid.

    The standard handler prints Python's 30-line "--- Logging error ---" for
    each such line on stderr (under launchd a file on the same full disk, never
    rotated), and once the disk has room the log goes on as if nothing had been
    missed. Here stderr gets one line when the writing stops, and the log's
    first line after says how many lines are missing and why.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lost = 0
        self._why = ""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        why = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__) if exc is not None else "unknown"
        if not self._lost:
            with contextlib.suppress(OSError, ValueError):
                print(f"depthwatch: cannot write the log file {self.baseFilename} ({why}); its lines are counted until it can", file=sys.stderr)
        self._lost += 1
        self._why = why

    def emit(self, record: logging.LogRecord) -> None:
        lost = self._lost
        if lost:
            notice = logging.LogRecord(
                record.name, logging.WARNING, __file__, 0,
                "%d log line(s) are missing before this one: the log file could not be written (%s)", (lost, self._why), None,
            )
            super().emit(notice)
            if self._lost > lost:  # still cannot: counted (the one more is this record's), said once it can
                return
            self._lost = 0
        super().emit(record)


def show(files: Sequence[Path], lines: int, *, follow: bool, interval: float = 0.25) -> int:
    """The last `lines` of each log file that has anything in it, then (with `follow`) what is appended.

    The first file is the main log; when no file exists yet, that is an error
    (the service was never installed or never started); when they are all
    empty, one line says so instead of nothing.
    """
    present = [f for f in files if f.is_file()]
    if not present:
        raise DepthwatchError(f"no log yet: {files[0]} does not exist; is the service installed?")
    with interruptible() if follow else contextlib.nullcontext():
        return _show(files, present, lines, follow=follow, interval=interval)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here even if this process was started with it ignored
    (and a program started meanwhile, journalctl, gets it at its default, not ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; its owner decides
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _show(files: Sequence[Path], present: list[Path], lines: int, *, follow: bool, interval: float) -> int:
    # Measured once: the tail ends and the follow starts at the same byte, so no line is lost or shown twice.
    sizes = {f: f.stat().st_size for f in present}
    shown = [f for f in present if sizes[f] > 0]
    if not shown:
        waiting = "; waiting for new lines (Ctrl-C to stop)" if follow else ""
        print(f"depthwatch: the log is empty: the daemon has written nothing to {files[0]} yet{waiting}", file=sys.stderr)
    for i, path in enumerate(shown):
        if len(shown) > 1:
            print(f"{'' if i == 0 else chr(10)}==> {path} <==")
        for line in tail(path, lines, end=sizes[path]):
            print(line)
    sys.stdout.flush()
    if follow:
        _follow(sizes, interval)
    return 0


def tail(path: Path, lines: int, end: int | None = None) -> list[str]:
    """The last `lines` lines of a file (of its first `end` bytes), read from the end."""
    if lines <= 0:
        return []
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END) if end is None else end
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(64 * 1024, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


def _follow(offsets: dict[Path, int], interval: float) -> None:
    """Print what is appended to the files after `offsets` until interrupted; starts over on a file that shrank."""
    while True:
        for f in offsets:
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                continue
            if size < offsets[f]:
                offsets[f] = 0
            if size > offsets[f]:
                with open(f, "rb") as handle:
                    handle.seek(offsets[f])
                    chunk = handle.read(size - offsets[f])
                whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for its end
                offsets[f] += len(whole)
                sys.stdout.write(whole.decode("utf-8", errors="replace"))
                sys.stdout.flush()
        time.sleep(interval)
