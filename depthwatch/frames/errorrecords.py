"""`<frame name>.error.json` beside the output (`output.error_sidecar`): why there is no new map.

Written when a frame fails for a reason of its own, removed once a map of it lands.
Only a record depthwatch wrote is replaced or removed: a user's file of that
name stays (see `replacing.json_refusal`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from depthwatch.errors import OutputError
from depthwatch import __version__
from depthwatch.frames.replacing import JSON_MARK, json_refusal
from depthwatch.frames.writer import atomic_write, ensure_folder

log = logging.getLogger("depthwatch.frames")

#: Ours: the mark, or the keys records had before it.
_OWN_RECORD = json_refusal(frozenset({"source", "error", "time"}))


def write_error_record(
    path: Path, source: Path, reason: str, roots: tuple[Path, ...] = (), folder_fd: int | None = None
) -> None:
    """The record at `path` for `source`; a failure to write it is a warning, never the frame's error.

    `folder_fd`: the record's folder, already open (the frame's own, as it was read).
    """
    record = {JSON_MARK: __version__, "source": source.name, "error": reason, "time": time.time()}
    try:
        if folder_fd is None:
            ensure_folder(path.parent, roots)
        atomic_write(path, json.dumps(record, indent=2).encode() + b"\n", roots, folder_fd=folder_fd, may_replace=_OWN_RECORD)
    except OutputError as exc:
        log.warning("%s", exc)


def remove_error_record(path: Path, folder_fd: int | None = None) -> None:
    """The frame has its map again: its record goes (through the frame's folder, if it is there), if it is one."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if folder_fd is None else folder_fd
    except OSError:
        return
    try:
        if _OWN_RECORD(fd, path.name) is None:
            os.unlink(path.name, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        if folder_fd is None:
            os.close(fd)
