"""`<frame name>.error.json` beside the output (`output.error_sidecar`): why there is no new map.

Written when a frame fails for a reason of its own, removed once a map of it lands.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from depthwatch.errors import OutputError
from depthwatch.frames.writer import atomic_write, ensure_folder

log = logging.getLogger("depthwatch.frames")


def write_error_record(
    path: Path, source: Path, reason: str, roots: tuple[Path, ...] = (), folder_fd: int | None = None
) -> None:
    """The record at `path` for `source`; a failure to write it is a warning, never the frame's error.

    `folder_fd`: the record's folder, already open (the frame's own, as it was read).
    """
    record = {"source": source.name, "error": reason, "time": time.time()}
    try:
        if folder_fd is None:
            ensure_folder(path.parent, roots)
        atomic_write(path, json.dumps(record, indent=2).encode() + b"\n", roots, folder_fd=folder_fd)
    except OutputError as exc:
        log.warning("%s", exc)


def remove_error_record(path: Path, folder_fd: int | None = None) -> None:
    """The frame has its map again: its record goes (through the frame's folder, if it is there)."""
    try:
        if folder_fd is None:
            path.unlink()
        else:
            os.unlink(path.name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
