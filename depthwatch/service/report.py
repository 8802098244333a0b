"""`depthwatch service status`, in the same words for launchd and systemd.

What the service manager says about the service (loaded, running, pid, last
exit), then what the daemon itself last wrote to its status file.
"""

from __future__ import annotations

import time
from pathlib import Path

from depthwatch.errors import DepthwatchError
from depthwatch.service.supervision import State, describe_exit


def rows(*, service: str, definition: Path, config: Path | None, state: State, log: str) -> list[tuple[str, str]]:
    """The status as (name, value) rows, in reading order."""
    out: list[tuple[str, str]] = [
        ("service", service),
        ("definition", f"{definition}" if definition.exists() else f"{definition} (not installed)"),
    ]
    if config is not None:
        out.append(("config", str(config)))
    out.append(("loaded", "yes" if state.loaded else "no"))
    if state.loaded:
        running = f"yes, pid {state.pid}" if state.running else "no"
        out.append(("running", f"{running} ({state.detail})" if state.detail else running))
        last = describe_exit(state.last_exit)
        if state.last_signal is not None and state.last_exit is None:
            last = f"killed by signal {state.last_signal}"
        out.append(("last exit", last))
    out.append(("log", log))
    out.extend(status_file_rows(config, state))
    return out


def format_rows(table: list[tuple[str, str]]) -> str:
    return "".join(f"{name + ':':<13}{value}\n" for name, value in table)


def status_file_rows(config_path: Path | None, state: State) -> list[tuple[str, str]]:
    """What the daemon itself last wrote to its status file."""
    if config_path is None:
        return []
    from depthwatch import config as configuration
    from depthwatch.daemon.status import clips_line, parked_note, path_for, read_status

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
    stale = " (from an earlier run)" if state.running and state.pid is not None and data.get("pid") != state.pid else ""
    out = [
        ("status file", f"{path}{stale}"),
        ("daemon", f"{data.get('state')}, pid {data.get('pid')}, updated {ago:.0f} s ago"),
        ("frames", f"{counts.get('done', 0)} done, {counts.get('failed', 0)} failed, {data.get('queue_depth', 0)} queued{parked_note(data)}"),
        *([("clips", clips)] if (clips := clips_line(data)) else []),
    ]
    if data.get("model"):
        out.append(("model", f"{data['model']} on {', '.join(data.get('providers') or []) or '?'}"))
    if counts.get("last_error"):
        out.append(("last error", str(counts["last_error"])))
    return out
