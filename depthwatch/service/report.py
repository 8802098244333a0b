"""`depthwatch service status`, in the same words for launchd and systemd.

What the service manager says about the service (loaded, running, pid, last
exit), then what the daemon itself last wrote to its status file.
"""

from __future__ import annotations

import time
from pathlib import Path

from depthwatch.errors import DepthwatchError
from depthwatch.logtext import one_line
from depthwatch.service.supervision import State, describe_end


def rows(*, service: str, definition: Path, config: Path | None, state: State, log: str) -> list[tuple[str, str]]:
    """The status as (name, value) rows, in reading order."""
    out: list[tuple[str, str]] = [
        ("service", service),
        ("definition", f"{definition}" if definition.exists() else f"{definition} (not installed)"),
    ]
    if config is not None:
        out.append(("config", str(config)))
    out.append(("loaded", "yes" if state.loaded else "no (its definition is gone; the daemon still runs)" if state.running else "no"))
    if state.loaded or state.running:
        running = f"yes, pid {state.pid}" if state.running else "no"
        out.append(("running", f"{running} ({state.detail})" if state.detail else running))
        last = describe_end(state)
        out.append(("last exit", last.removeprefix("exit status ")))
    out.append(("log", log))
    out.extend(status_file_rows(config, state))
    return out


def format_rows(table: list[tuple[str, str]]) -> str:
    """One line a row, whatever a value holds (a name with a newline adds no line of its own)."""
    return "".join(f"{name + ':':<13}{one_line(value)}\n" for name, value in table)


def status_file_rows(config_path: Path | None, state: State) -> list[tuple[str, str]]:
    """What the daemon itself last wrote to its status file."""
    if config_path is None:
        return []
    from depthwatch import config as configuration
    from depthwatch.daemon.status import clips_line, is_running, parked_note, path_for, read_status, silent_for

    try:
        config = configuration.load(config_path)
    except DepthwatchError as exc:
        return [("config", f"does not load: {exc}")]
    path = path_for(config)  # daemon.status_file, or the one every daemon keeps in the state folder
    try:
        data = read_status(path)
    except FileNotFoundError:
        return [("status file", f"{path} (not written yet)")]
    except (OSError, ValueError) as exc:
        return [("status file", f"{path} (unreadable: {exc})")]
    counts = data.get("counts") or {}
    ago = max(0.0, time.time() - float(data.get("updated") or 0))
    pid, said = data.get("pid"), data.get("state")
    alive = is_running(data)
    stale = " (from an earlier run)" if not alive or (state.running and state.pid is not None and pid != state.pid) else ""
    silent = silent_for(data) if alive else None
    if silent is not None:
        daemon = f"not answering, pid {pid}: no heartbeat for {silent:.0f} s while its process runs (stuck: restart it)"
    elif alive:
        # A daemon run by hand with this config, beside (or instead of) the service's own.
        theirs = "" if state.pid in (None, pid) else f" (not the service's: its pid is {state.pid})"
        daemon = f"{said}, pid {pid}{theirs}, updated {ago:.0f} s ago"
    elif said == "stalled":
        daemon = f"stalled, pid {pid}: a model run could not be given up; it exits for the service manager to restart it"
    elif said == "stopped":
        daemon = f"stopped, pid {pid}, updated {ago:.0f} s ago"
    else:  # what `depthwatch status` says of it: the file says running, its process is gone
        daemon = f"not running (pid {pid} is gone without stopping cleanly; it last wrote {ago:.0f} s ago, state {said})"
    out = [
        ("status file", f"{path}{stale}"),
        ("daemon", daemon),
        ("frames", f"{counts.get('done', 0)} done, {counts.get('failed', 0)} failed, {data.get('queue_depth', 0)} queued{parked_note(data)}"),
        *([("clips", clips)] if (clips := clips_line(data)) else []),
    ]
    if data.get("model"):
        out.append(("model", f"{data['model']} on {', '.join(data.get('providers') or []) or '?'}"))
    if counts.get("last_error"):
        out.append(("last error", str(counts["last_error"])))
    return out
