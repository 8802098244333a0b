"""`depthwatch status`: what a daemon started by hand (or by a service) is doing, from its status file.

Without -c or --status it lists the state folder, where every daemon that
ever ran leaves its file: the running ones first, in full, then each one not
running in one line (`--status FILE` shows one in full).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from depthwatch.logtext import one_line

HELP = "show whether depthwatch is running, with its pid, model, counts and last error (from its status file)"

#: Exit status when no daemon is running (as `depthwatch service status`, `systemctl status` and LSB).
EXIT_NOT_RUNNING = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", metavar="CONFIG",
        help="the daemon run with this config file (default: every daemon that keeps its status in the state "
        "folder, the running ones first; each one not running in one line)",
    )
    parser.add_argument("--status", metavar="FILE", help="read this status file (what `run --status FILE` wrote)")


def main(args: argparse.Namespace) -> int:
    from depthwatch import config as configuration
    from depthwatch.daemon import status
    from depthwatch.errors import ConfigError, DepthwatchError
    from depthwatch.paths import expand_path

    if args.status:
        files = [expand_path(args.status, Path.cwd())]
    elif args.config:
        source = configuration.find(args.config, here=True)
        try:
            files = [status.path_for(configuration.load(source))]
        except ConfigError as exc:
            # An edit that does not load: a daemon run with this file keeps its last good config, and
            # is still the one to ask (its status says so too, as config_error).
            files = status.files_for_source(source) if source is not None else []
            if not files:
                raise
            print(f"depthwatch: {exc} (a daemon running with it keeps its last good config)", file=sys.stderr)
    else:
        folder = status.status_dir()
        files = sorted(folder.glob("*.json"), key=_mtime, reverse=True) if folder.is_dir() else []
        own: Path | None = None
        source: Path | None = None
        try:  # the config `run` here would use may name a status file of its own
            source = configuration.find(here=True)
            own = status.path_for(configuration.load(source))
        except DepthwatchError:
            if source is not None:  # the file does not load now: its daemon's status files first, found without it
                theirs = status.files_for_source(source)
                files = [*theirs, *(f for f in files if f not in theirs)]
        if own is not None and own.parent != folder and own.is_file():
            files.insert(0, own)
        if not files:
            print(f"depthwatch is not running: no status file in {folder} (a daemon writes one there as it starts)")
            return EXIT_NOT_RUNNING
        return _list(files)
    running = 0
    for i, path in enumerate(files):
        if i:
            print()
        data = _read(path)
        running += data is not None and _show(path, data)
    return 0 if running else EXIT_NOT_RUNNING


def _list(files: list[Path]) -> int:
    """Every daemon in `files`: the running ones in full, then one line for each one not running.

    With none running, the first (the one this folder's config runs, else the last to
    write) is shown in full: how it ended is what the question is about.
    """
    from depthwatch.daemon.status import is_running

    found = [(path, data, is_running(data)) for path in files if (data := _read(path)) is not None]
    running = [(path, data) for path, data, alive in found if alive]
    stopped = [(path, data) for path, data, alive in found if not alive]
    in_full = running or stopped[:1]
    in_a_line = stopped if running else stopped[1:]
    for i, (path, data) in enumerate(in_full):
        if i:
            print()
        _show(path, data)
    if in_a_line:
        print()
    for path, data in in_a_line:
        print(_line_of_the_stopped(path, data))
    return 0 if running else EXIT_NOT_RUNNING


def _clip_line(clip: dict[str, Any], stopped: bool = False) -> str:
    """`A001.mov -> A001_depth.mov: 120/300 frames, 45.0 fps, about 4 s left`; of a daemon gone, where it stopped."""
    done, total = int(clip.get("done") or 0), int(clip.get("total") or 0)
    eta = clip.get("eta_s")
    left = f", about {eta:.0f} s left" if isinstance(eta, (int, float)) else ""
    name = Path(str(clip.get("source"))).name
    output = Path(str(clip.get("output"))).name
    if stopped:
        return f"{name} -> {output}: stopped at {done}/{total or '?'} frames (the next start maps it again)"
    return f"{name} -> {output}: {done}/{total or '?'} frames, {float(clip.get('rate') or 0):.1f} fps{left}"


def _doing(data: dict[str, Any]) -> str:
    """`idle`, or what the busy threads work on and for how long, from the supervisor's record."""
    threads = data.get("threads") if isinstance(data.get("threads"), dict) else {}
    busy = [
        f"{name}: {record.get('doing')} for {float(record.get('for_s') or 0):.0f} s"
        for name, record in threads.items()
        if isinstance(record, dict) and record.get("doing") not in (None, "idle")
    ]
    return "; ".join(busy) if busy else "idle"


def _sessions_line(data: dict[str, Any]) -> str:
    """What was loaded: the model asked for, and every session made, the engine measurement's included."""
    loads, made = data.get("model_loads", 0), data["sessions_made"]
    line = f"model loaded {loads} time(s) (start, reloads); {made} session(s) made in all"
    if made > loads:
        line += f" ({made - loads} by the engine measurement, one at a time, in idle time)"
    return line


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _read(path: Path) -> dict[str, Any] | None:
    """A status file's contents; None, said in one line, where there is none or it cannot be read."""
    from depthwatch.daemon.status import read_status

    try:
        return read_status(path)
    except FileNotFoundError:
        print(f"depthwatch is not running: no status file at {path} (no daemon has started with it)")
    except (OSError, ValueError) as exc:
        print(f"depthwatch: cannot read the status file {path}: {exc}")
    return None


def _head(data: dict[str, Any], running: bool) -> str:
    """Whether the daemon runs, since when, or how it ended."""
    from depthwatch.daemon.status import iso_time, silent_for

    pid, state = data.get("pid"), data.get("state")
    updated = float(data.get("updated") or 0)
    started = data.get("started_at") or (iso_time(float(data["started"])) if data.get("started") else "?")
    silent = silent_for(data) if running else None
    if silent is not None:
        return (
            f"not answering, pid {pid}, since {started}: no heartbeat for {silent:.0f} s while its process runs "
            "(stuck: restart it)"
        )
    if running:
        return f"{state}, pid {pid}, since {started}"
    if state == "stopped":
        return f"not running (stopped at {iso_time(updated)}; pid {pid} started {started})"
    if state == "failed":  # it said why and exited (70): stopped in order, after a failure
        return f"not running (it stopped after a failure at {iso_time(updated)}; pid {pid} started {started})"
    if state == "stalled":  # a model run that could not be given up: it exits (70) for its service manager to restart it
        return f"not running (stalled at {iso_time(updated)}: a model run could not be given up; pid {pid} started {started})"
    return f"not running (pid {pid} is gone without stopping cleanly; it last wrote at {iso_time(updated)}, state {state})"


def _left(data: dict[str, Any]) -> int:
    """Frames a daemon no longer running had queued or in hand: the next start maps them."""
    return int(data.get("queue_depth") or 0) + int(data.get("in_progress") or 0)


def _line_of_the_stopped(path: Path, data: dict[str, Any]) -> str:
    """One line for a daemon not running: how it ended, its config, what it left, its status file."""
    left = _left(data)
    frames = f"{left} frame(s) left for the next start; " if left else ""
    return one_line(
        f"depthwatch:  {_head(data, running=False)}; config {data.get('config') or 'built-in defaults'}; "
        f"{frames}status file {path}"
    )


def _show(path: Path, data: dict[str, Any]) -> bool:
    """Print one daemon's status in full; True if it is running."""
    from depthwatch.daemon.status import clips_line, is_running, parked_note, silent_for

    running = is_running(data)
    head = _head(data, running)
    updated = float(data.get("updated") or 0)
    counts: dict[str, Any] = data.get("counts") or {}
    rows = [
        ("depthwatch", head),
        ("config", data.get("config") or "built-in defaults"),
        ("status file", f"{path} (updated {max(0.0, time.time() - updated):.0f} s ago)"),
    ]
    if running and silent_for(data) is None and isinstance(data.get("heartbeat_at"), (int, float)):
        rows.append(("doing", _doing(data)))
    if data.get("model"):
        providers = ", ".join(data.get("providers") or []) or "?"
        precision = f" at {data['precision']}" if isinstance(data.get("precision"), str) else ""
        rows.append(("model", f"{data['model']} (profile {data.get('profile')}; providers {providers}{precision})"))
    if isinstance(data.get("sessions_made"), int):
        rows.append(("sessions", _sessions_line(data)))
    if data.get("watching"):
        rows.append(("watching", ", ".join(data["watching"])))
    if data.get("waiting_for") and running:  # a stopped daemon waits for nothing (an old file may say so)
        rows.append(("waiting for", ", ".join(data["waiting_for"]) + " (gone: no frame comes from it until it is back)"))
    if data.get("unwatched") and running:
        rows.append((
            "not watched",
            "; ".join(f"{count} folder(s) of {root}" for root, count in data["unwatched"].items())
            + " (the system's inotify watch limit: scanned every few seconds instead)",
        ))
    frames = (
        f"{counts.get('done', 0)} done, {counts.get('failed', 0)} failed, {counts.get('superseded', 0)} superseded, "
        f"{counts.get('incomplete', 0)} incomplete, {counts.get('retried', 0)} retried, "
        f"{counts.get('own_maps', 0)} depth maps skipped"
    )
    in_hand = f"; {data.get('queue_depth', 0)} queued, {data.get('in_progress', 0)} in progress"
    if running:
        frames += in_hand
    elif _left(data):  # a daemon gone with nothing left says nothing of it
        frames += f"{in_hand} when it stopped (the next start maps them)"
    rows.append(("frames", frames + parked_note(data)))
    clip = data.get("clip")
    clips = clips_line(data)
    if clips:
        rows.append(("clips", clips))
    if clip:
        rows.append(("clip", _clip_line(clip) if running else _clip_line(clip, stopped=True)))
    last = counts.get("last_frame")
    latency = counts.get("last_latency_ms")
    rows.append(("last frame", f"{last} ({latency} ms)" if last else "none yet"))
    rows.append(("last error", counts.get("last_error") or "none"))
    if data.get("config_error") and data["config_error"] != data.get("model_error"):  # an edit's model: said once, below
        rows.append(("config error", data["config_error"]))
    if data.get("model_error"):
        rows.append(("model error", data["model_error"]))
    if data.get("health_error"):
        rows.append(("health", data["health_error"]))
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        # Escaped as the log escapes names: a frame named with a newline cannot add lines of its own
        # (a forged "last error: none" under a real one); what is escaped already is not escaped again.
        print(f"{name + ':':<{width}}{one_line(str(value))}")
    return running
