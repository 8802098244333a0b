"""`depthwatch status`: what a daemon started by hand (or by a service) is doing, from its status file."""

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
        help="the daemon run with this config file (default: every daemon that keeps its status in the state folder)",
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
    running = 0
    for i, path in enumerate(files):
        if i:
            print()
        running += _show(path)
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


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _show(path: Path) -> bool:
    """Print one daemon's status; True if it is running."""
    from depthwatch.daemon.status import clips_line, is_running, iso_time, parked_note, read_status, silent_for

    try:
        data = read_status(path)
    except FileNotFoundError:
        print(f"depthwatch is not running: no status file at {path} (no daemon has started with it)")
        return False
    except (OSError, ValueError) as exc:
        print(f"depthwatch: cannot read the status file {path}: {exc}")
        return False
    running = is_running(data)
    pid, state = data.get("pid"), data.get("state")
    updated = float(data.get("updated") or 0)
    started = data.get("started_at") or (iso_time(float(data["started"])) if data.get("started") else "?")
    silent = silent_for(data) if running else None
    if silent is not None:
        head = (
            f"not answering, pid {pid}, since {started}: no heartbeat for {silent:.0f} s while its process runs "
            "(stuck: restart it)"
        )
    elif running:
        head = f"{state}, pid {pid}, since {started}"
    elif state == "stopped":
        head = f"not running (stopped at {iso_time(updated)}; pid {pid} started {started})"
    elif state == "failed":  # it said why and exited (70): stopped in order, after a failure
        head = f"not running (it stopped after a failure at {iso_time(updated)}; pid {pid} started {started})"
    elif state == "stalled":  # a model run that could not be given up: it exits (70) for its service manager to restart it
        head = f"not running (stalled at {iso_time(updated)}: a model run could not be given up; pid {pid} started {started})"
    else:
        head = f"not running (pid {pid} is gone without stopping cleanly; it last wrote at {iso_time(updated)}, state {state})"
    counts: dict[str, Any] = data.get("counts") or {}
    rows = [
        ("depthwatch", head),
        ("config", data.get("config") or "built-in defaults"),
        ("status file", f"{path} (updated {max(0.0, time.time() - updated):.0f} s ago)"),
    ]
    if running and silent is None and isinstance(data.get("heartbeat_at"), (int, float)):
        rows.append(("doing", _doing(data)))
    if data.get("model"):
        providers = ", ".join(data.get("providers") or []) or "?"
        precision = f" at {data['precision']}" if isinstance(data.get("precision"), str) else ""
        rows.append(("model", f"{data['model']} (profile {data.get('profile')}; providers {providers}{precision})"))
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
    rows.append((
        "frames",
        f"{counts.get('done', 0)} done, {counts.get('failed', 0)} failed, {counts.get('superseded', 0)} superseded, "
        f"{counts.get('incomplete', 0)} incomplete, {counts.get('retried', 0)} retried, "
        f"{counts.get('own_maps', 0)} depth maps skipped; "
        f"{data.get('queue_depth', 0)} queued, {data.get('in_progress', 0)} in progress"
        f"{'' if running else ' when it stopped (the next start maps them)'}{parked_note(data)}",
    ))
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
