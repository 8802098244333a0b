"""A job bundle's task telling its farm how far it is: OpenJD's `openjd_progress:` and `openjd_status:` lines.

A farm that runs an Open Job Description job (Deadline Cloud, `openjd run`)
reads these lines from a task's output and shows them in its monitor. The
job bundle's tasks pass `--openjd`; without it `once` keeps its own output
(a progress bar on a terminal, nothing in a script), so these lines appear
only where a farm reads them.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

#: Lines at most this often (in percent): a long task's log stays readable.
STEP_PERCENT = 5


class TaskProgress:
    """Frames done out of `total`, as OpenJD's lines; tqdm's `update`, `write` and `close`, so `once` uses either."""

    def __init__(self, total: int, what: str = "frames mapped", out: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self._what = what
        self._out = out or sys.stdout
        self._said = -STEP_PERCENT
        self._lock = threading.Lock()  # the pipeline's threads report as their frames finish
        self.status(f"0 of {total} {what}")

    def status(self, text: str) -> None:
        """One `openjd_status:` line: what the task is doing, shown beside it on the farm."""
        self._say(f"openjd_status: {text}")

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            percent = 100.0 * self.done / self.total if self.total else 100.0
            if percent - self._said >= STEP_PERCENT or self.done >= self.total:
                self._said = int(percent)
                self._say(f"openjd_progress: {percent:.1f}")
                self._say(f"openjd_status: {self.done} of {self.total} {self._what}")

    def write(self, line: str, file: TextIO | None = None) -> None:
        print(line, file=file or sys.stderr, flush=True)

    def close(self) -> None:
        """Nothing to put away: each line is written whole as it comes."""

    def _say(self, line: str) -> None:
        print(line, file=self._out, flush=True)
