"""Taking back what a failed `depthwatch service install` did, so it leaves the files as it found them.

An install writes in several places (the user's config, the log folder, the
plist or unit and its folder) and then asks the service manager to load it;
when a later step fails, every earlier one is undone, newest first: a file
written is put back as it was (or removed), a folder created is removed again
if it is still empty, and a step registered with `on_failure` runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from depthwatch.files import temp_name_for
from depthwatch.frames.writer import atomic_write


class Undo:
    """The steps of one install, recorded as they are done; used as a context manager.

    Leaving the `with` block by an exception takes every step back and lets the
    exception through; leaving it normally keeps them.
    """

    def __init__(self) -> None:
        self._steps: list[Callable[[], object]] = []

    def __enter__(self) -> Undo:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            self.rollback()

    def on_failure(self, step: Callable[[], object]) -> None:
        """Run `step` if the install fails (after undoing what was done after this call)."""
        self._steps.append(step)

    def folder(self, path: Path) -> None:
        """Create `path` and any missing parents; a failure removes the ones created here."""
        missing = []
        for folder in (path, *path.parents):
            if folder.exists():
                break
            missing.append(folder)
        for folder in reversed(missing):  # the outermost first; undone the other way round
            folder.mkdir(exist_ok=True)
            self._steps.append(lambda folder=folder: _remove_empty(folder))

    def write(self, path: Path, data: bytes) -> None:
        """Replace `path` atomically; a failure puts the old bytes back, or removes it if there were none."""
        previous = path.read_bytes() if path.exists() else None
        atomic_write(path, data)
        self._steps.append(lambda: _put_back(path, previous))

    def create(self, path: Path, data: bytes) -> None:
        """Write a new file at `path`, never replacing anything there (FileExistsError if the name is taken)."""
        tmp = temp_name_for(path)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # complete at once, and unlike a rename it refuses a name already taken
        finally:
            tmp.unlink(missing_ok=True)
        self._steps.append(lambda: path.unlink(missing_ok=True))

    def rollback(self) -> None:
        """Every step back, newest first; each is tried even when one before it fails."""
        while self._steps:
            step = self._steps.pop()
            try:
                step()
            except Exception:  # noqa: BLE001 - the install's own error is the one to report
                pass


def _remove_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (someone put something there meanwhile) or already gone
        pass


def _put_back(path: Path, previous: bytes | None) -> None:
    if previous is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, previous)
