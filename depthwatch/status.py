"""The status file: a small JSON snapshot a plugin or script can poll.

Rewritten atomically (see `writer`), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from depthwatch.writer import atomic_write


@dataclass
class Counters:
    """What the daemon has done since it started."""

    done: int = 0
    failed: int = 0
    superseded: int = 0
    incomplete: int = 0
    retried: int = 0
    #: Shots started (output.normalise: stable): an output's first map, a cut, a model swap;
    #: and of those, the cuts, with the last one as "<frame> -> <output>: shot N (cut)".
    shots: int = 0
    cuts: int = 0
    last_cut: str | None = None
    last_latency_ms: float | None = None
    last_frame: str | None = None
    last_error: str | None = None


@dataclass
class Status:
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)
    state: str = "starting"
    model: str | None = None
    profile: str | None = None
    providers: list[str] = field(default_factory=list)
    contract: str | None = None
    model_loads: int = 0
    queue_depth: int = 0
    in_progress: int = 0
    watching: list[str] = field(default_factory=list)
    config: str | None = None
    #: Configs applied (1 at start, +1 per successful reload) and the last reload's error.
    config_loads: int = 0
    config_error: str | None = None
    counts: Counters = field(default_factory=Counters)

    def to_json(self) -> bytes:
        data: dict[str, Any] = asdict(self)
        data["updated"] = time.time()
        return json.dumps(data, indent=2).encode() + b"\n"


def write_status(path: Path, status: Status) -> None:
    atomic_write(path, status.to_json())


def read_status(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
