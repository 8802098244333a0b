"""The status file: a small JSON snapshot a plugin, a script or `depthwatch status` can poll.

One schema for the daemon and the farm's worker (`depthwatch worker`, which
also sends it to the scheduler with each heartbeat); the fields one of them
has no use for stay at their defaults.

Rewritten atomically (see `writer`), so a reader never sees half of it. Every
daemon keeps one: where the config says (`daemon.status_file`), else in the
user's state folder under a name of its own (see `default_path`), so two
daemons started by hand never write the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthwatch import paths
from depthwatch.frames.writer import atomic_write
from depthwatch.processes import pid_alive, start_token

if TYPE_CHECKING:
    from depthwatch.config import Config


@dataclass
class Counters:
    """What the daemon has done since it started."""

    done: int = 0
    failed: int = 0
    superseded: int = 0
    incomplete: int = 0
    retried: int = 0
    #: Files taken for frames that carry depthwatch's own record: a depth map copied in
    #: under a frame's name (or a photo saved from one). Skipped, never mapped again.
    own_maps: int = 0
    #: Shots started (output.normalise: stable): an output's first map, a cut, a model swap;
    #: and of those, the cuts, with the last one as "<frame> -> <output>: shot N (cut)".
    shots: int = 0
    cuts: int = 0
    last_cut: str | None = None
    #: Depth clips written (whole clips; their frames are not in `done`), and clips that failed
    #: (refused, unreadable, not written: not in `failed`, which counts frames).
    clips: int = 0
    clips_failed: int = 0
    last_latency_ms: float | None = None
    #: The last map's milliseconds per stage, named as in the log line (`frameline.STAGES`).
    last_stage_ms: dict[str, float] = field(default_factory=dict)
    last_frame: str | None = None
    last_error: str | None = None
    #: A farm worker: the tasks it took, and frames whose map was already up to date.
    tasks: int = 0
    up_to_date: int = 0


def iso_time(epoch: float) -> str:
    """Local time with its UTC offset, to the second: what people read in a status line."""
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


@dataclass
class Status:
    pid: int = field(default_factory=os.getpid)
    #: This process's start as the kernel keeps it (`processes.start_token`): a later program given
    #: the same pid after a crash or a reboot is not taken for this daemon.
    process_start: str | None = field(default_factory=lambda: start_token(os.getpid()))
    started: float = field(default_factory=time.time)
    #: `started` as ISO 8601, for people and scripts that do not want an epoch.
    started_at: str = ""
    state: str = "starting"
    model: str | None = None
    profile: str | None = None
    providers: list[str] = field(default_factory=list)
    #: The arithmetic the model runs at (fp32, bf16, fp16, int8).
    precision: str | None = None
    contract: str | None = None
    #: Loads of the model asked for (start, reloads, a rebuild on CPU).
    model_loads: int = 0
    #: Every session made: those loads, and each one the idle-time engine measurement made, one at a time.
    sessions_made: int = 0
    #: With `providers: auto`: whether the idle-time engine measurement is still to come or
    #: under way, and how often it moved serving to a faster engine (no load of its own).
    measuring: bool = False
    engine_switches: int = 0
    queue_depth: int = 0
    in_progress: int = 0
    #: Frames whose map could not be written (full disk, no permission), kept until their folder can be.
    parked: int = 0
    watching: list[str] = field(default_factory=list)
    #: Of `watching`, the folders that are gone (or not there yet): no frame can come from them until they are back.
    waiting_for: list[str] = field(default_factory=list)
    #: Of `watching`, recursive folders -> how many folders under them inotify does not watch (its
    #: limit on watches reached): their frames are found by a scan every few seconds instead.
    unwatched: dict[str, int] = field(default_factory=dict)
    config: str | None = None
    #: Configs applied (1 at start, +1 per successful reload) and the last reload's error.
    config_loads: int = 0
    config_error: str | None = None
    #: Why the model asked for is not the one in service: its last load or reload failed
    #: (one line; None once a load of it succeeded, or the config went back to the model in service).
    model_error: str | None = None
    #: Why the daemon is up but not making maps: its model's last predictions were unusable
    #: (NaN, a constant) several in a row. Cleared by the next good map.
    health_error: str | None = None
    #: When the daemon last proved it is alive (epoch seconds): rewritten every few seconds, idle or
    #: not, so a status whose heartbeat is old while its process is still there is a daemon not answering.
    heartbeat_at: float | None = None
    #: What each long-lived thread does now ("idle", or "frame.jpg (decode)") and for how many seconds
    #: (`for_s`), as the supervisor keeps it: a thread stuck on one frame shows here.
    threads: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The HTTP API's address (http://HOST:PORT) when it listens.
    api: str | None = None
    #: A farm worker: its scheduler, its own address on the farm, and when the model
    #: finished loading (epoch seconds): nothing forks after this.
    scheduler: str | None = None
    address: str | None = None
    loaded_at: float | None = None
    counts: Counters = field(default_factory=Counters)
    #: The clip job in progress: source, output, phase, frames, done and total (frames),
    #: rate (frames a second), eta_s; None when no clip is in progress.
    clip: dict[str, Any] | None = None
    clips_waiting: int = 0

    def __post_init__(self) -> None:
        if not self.started_at:
            self.started_at = iso_time(self.started)

    def as_dict(self) -> dict[str, Any]:
        """The snapshot, stamped with the time it was taken (`updated`)."""
        data: dict[str, Any] = asdict(self)
        data["updated"] = time.time()
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.as_dict(), indent=2).encode() + b"\n"


def write_status(path: Path, status: Status) -> None:
    atomic_write(path, status.to_json())


#: The fields the status commands compute with, and the types every version writes them as.
_SHAPES: dict[str, tuple[type, ...]] = {
    "pid": (int, type(None)), "state": (str,), "counts": (dict,), "clip": (dict, type(None)), "updated": (int, float),
    "started": (int, float), "queue_depth": (int,), "in_progress": (int,), "parked": (int,), "clips_waiting": (int,),
    "watching": (list,), "waiting_for": (list,), "unwatched": (dict,), "providers": (list,),
    "heartbeat_at": (int, float, type(None)), "threads": (dict,),
}
_CLIP_NUMBERS = ("done", "total", "rate", "eta_s")
_LATEST_TIME = 1e11  # seconds since 1970: the year 5138; a time past it is no time a daemon wrote


def read_status(path: Path) -> dict[str, Any]:
    """A status file's contents; ValueError for one that is no status (not JSON, not an object, fields of other types).

    ValueError, as for a file that is not JSON: every reader already says "cannot
    read" for it. A stray file in the state folder with `"updated"` as a date
    string must not take `depthwatch status` down with a traceback, hiding every daemon.
    """
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not a status (a JSON object)")  # noqa: TRY004
    for key, types in _SHAPES.items():
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool) and bool not in types):
            raise ValueError(f"its {key} is {json.dumps(data[key])[:40]}, not what a status file holds there")
    for key in ("updated", "started", "heartbeat_at"):
        if data.get(key) is not None and not 0 <= data[key] < _LATEST_TIME:
            raise ValueError(f"its {key} is {data[key]}, no time a daemon wrote")
    clip = data.get("clip") or {}
    if any(clip.get(key) is not None and (not isinstance(clip[key], (int, float)) or isinstance(clip[key], bool)) for key in _CLIP_NUMBERS):
        raise ValueError("its clip holds other than numbers for its progress, not what a status file holds there")
    return data


def status_dir() -> Path:
    """Where daemons without `daemon.status_file` keep theirs; `depthwatch status` looks here."""
    return paths.state_dir() / "daemons"


def default_path(config: Config) -> Path:
    """A status file of this daemon's own: named for its config file, or for its watch folders.

    Two daemons run with the same config file (or, without one, watching the same
    folders) would process the same frames; they share a name, and the second
    one warns at start.
    """
    if config.source is not None:
        return path_for_source(config.source)
    key = "\n".join(sorted(str(f) for f in config.watch.folders))
    return status_dir() / f"defaults-{hashlib.sha256(key.encode()).hexdigest()[:10]}.json"


def path_for_source(source: Path) -> Path:
    """The default status file of a daemon run with the config file `source`, whatever that file holds now."""
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:10]
    return status_dir() / f"{source.stem}-{digest}.json"


def files_for_source(source: Path) -> list[Path]:
    """The status files of daemons run with the config file `source`, found without reading it.

    For `depthwatch status` while that file holds an edit that does not load:
    the daemon runs on in its last good config, and is the one to ask. Its
    default status file, and any in the status folder that names this config.
    """
    default = path_for_source(source)
    found = [default] if default.is_file() else []
    folder = status_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            if path not in found and read_status(path).get("config") == str(source):
                found.append(path)
        except (OSError, ValueError):
            continue
    return found


def path_for(config: Config) -> Path:
    """The status file a daemon with this config writes."""
    return config.daemon.status_file or default_path(config)


def parked_note(data: dict[str, Any]) -> str:
    """What a status says of its parked frames, for the frames line of `status` and `service status` ("" if none)."""
    return f", {data['parked']} waiting for their folder to be writable" if data.get("parked") else ""


def clips_line(data: dict[str, Any]) -> str | None:
    """A status's clips, done, failed and waiting, as both status commands show them (None: no clip seen)."""
    counts = data.get("counts") or {}
    if not (data.get("clip") or counts.get("clips") or counts.get("clips_failed") or data.get("clips_waiting")):
        return None
    return f"{counts.get('clips', 0)} done, {counts.get('clips_failed', 0)} failed, {data.get('clips_waiting', 0)} waiting"


def silent_for(data: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds since a running daemon's last heartbeat when that is past `SILENT_AFTER_S` ("not answering"); else None."""
    from depthwatch.daemon.supervisor import SILENT_AFTER_S

    beat = data.get("heartbeat_at")
    if not isinstance(beat, (int, float)) or data.get("state") != "running":
        return None
    silent = (time.time() if now is None else now) - beat
    return silent if silent > SILENT_AFTER_S else None


def is_running(data: dict[str, Any]) -> bool:
    """A status file's daemon is running: it says so, and its process is still there."""
    token = data.get("process_start")
    return data.get("state") in ("starting", "running", "stopping") and pid_alive(
        data.get("pid"), token if isinstance(token, str) else None
    )
