"""What a `once` run says: a bar on a terminal (or OpenJD's lines in a farm's task) as it goes, one line at its end.

The bars go to stderr and only on a terminal; the last line (what was done,
how long) goes to stdout, where a script reads it.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def say(lines: list[str]) -> None:
    """Each line on stderr: the notes gathered while the inputs were read."""
    for line in lines:
        print(line, file=sys.stderr)


def summary(frames: int, failed: int, began: float, up_to_date: int = 0) -> None:
    """One line a script (or a person, once the bar is gone) can read: what was done, how long.

    `up_to_date`: maps already made (`once --farm` resuming), not counted as written now.
    """
    done = frames - failed - up_to_date
    already = f", {up_to_date} up to date" if up_to_date else ""
    print(f"{done} depth map{'s' if done != 1 else ''} written{already}, {failed} failed, in {time.monotonic() - began:.1f} s")


def clips_summary(done: int, frames: int | None, failed: int, began: float) -> None:
    """The clips' line: depth clips written, with their frames (here) or on the farm (`frames` None)."""
    where = "on the farm" if frames is None else f"({frames} frame{'s' if frames != 1 else ''})"
    print(f"{done} depth clip{'s' if done != 1 else ''} written {where}, {failed} failed, in {time.monotonic() - began:.1f} s")


def bar(total: int, openjd: bool = False):  # noqa: ANN201 - tqdm or its stand-in
    """The frames' progress: tqdm on a terminal for ten frames or more, OpenJD's lines in a job bundle's task."""
    from tqdm import tqdm

    if openjd:  # a job bundle's task: OpenJD's lines for the farm's monitor
        from depthwatch.batch.taskprogress import TaskProgress

        return TaskProgress(total)
    return tqdm(total=total, unit="frame", disable=total < 10 or not sys.stderr.isatty(), file=sys.stderr)


class ClipBar:
    """One tqdm bar per clip: frames, frames a second, time left."""

    def __init__(self, job: Any) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=None, unit="frame", desc=job.source.name, disable=not sys.stderr.isatty(), file=sys.stderr)

    def update(self, progress: Any) -> None:
        if progress.total and self._bar.total != progress.total:
            self._bar.total = progress.total
            self._bar.refresh()
        self._bar.update(progress.done - self._bar.n)

    def __enter__(self) -> ClipBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bar.close()
