"""`<frame name>.error.json` beside the output (`output.error_sidecar`): why there is no new map.

Written when a frame fails for a reason of its own, removed once a map of it lands.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from depthwatch.errors import OutputError
from depthwatch.frames.writer import atomic_write, ensure_folder

log = logging.getLogger("depthwatch.frames")


def write_error_record(path: Path, source: Path, reason: str, roots: tuple[Path, ...] = ()) -> None:
    """The record at `path` for `source`; a failure to write it is a warning, never the frame's error."""
    record = {"source": source.name, "error": reason, "time": time.time()}
    try:
        ensure_folder(path.parent, roots)
        atomic_write(path, json.dumps(record, indent=2).encode() + b"\n", roots)
    except OutputError as exc:
        log.warning("%s", exc)
