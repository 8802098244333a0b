"""The systemd user unit's file: where it goes, its text, and that text read back and checked.

The Linux counterpart of `launchd`'s plist: a `systemd --user` unit, so the
daemon runs as the user, with the user's folders and GPU, and its log goes to
the journal, which rotates it. Unlike launchd, systemd can be told not to
restart after exit 78 (RestartPreventExitStatus), so a bad config or a missing
model stops it with the reason as the last journal line instead of retrying.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from depthwatch.errors import EX_CONFIG, DepthwatchError
from depthwatch.service import supervision

UNIT = "depthwatch.service"
#: Pause before a restart after a crash (exit 78 is never restarted).
RESTART_SEC = 5
#: Exit statuses a restart cannot fix: a bad config or a missing model (78), and systemd's own for a
#: working directory (200) or a program (203) that is not there any more (the folder or virtualenv moved).
NO_RESTART = f"{EX_CONFIG} 200 203"
#: How long systemd waits for READY=1: provider measurement (at most 90 s) plus the model load.
START_TIMEOUT_S = 300


def unit_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """~/.config/systemd/user ($XDG_CONFIG_HOME/systemd/user), where `systemd --user` looks first."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    return base / "systemd" / "user"


def unit_path(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    return unit_dir(home, environ) / UNIT


#: systemd's watchdog: the daemon's main loop answers every WATCHDOG_SEC/2 (`daemon.supervisor`); a minute
#: leaves room for a status write on a slow disk, never for a daemon that has stopped answering.
WATCHDOG_SEC = 60


def render(config: Path, *, shutdown_timeout_s: float, executable: str | None = None) -> str:
    """The unit for running `depthwatch run -c config` as this user.

    Restart=on-failure restarts after a crash but not after `systemctl stop`
    or a clean exit; TimeoutStopSec follows the daemon's graceful shutdown.
    """
    config = Path(os.path.abspath(config))
    argv = supervision.arguments(config, executable)
    env = supervision.environment(executable)
    lines = [
        "# depthwatch, as a systemd user service. Written by `depthwatch service install`:",
        "# change the config and run that again rather than editing this file",
        "# (TimeoutStopSec follows the config's daemon.shutdown_timeout_s).",
        "",
        "[Unit]",
        "Description=depthwatch: depth maps for the video frames dropped in watched folders",
        "",
        "[Service]",
        "# notify: `systemctl start` returns once the daemon sends READY=1 over $NOTIFY_SOCKET,",
        "# after the model has loaded, so a bad model fails the start; STOPPING=1 at shutdown.",
        "Type=notify",
        f"ExecStart={' '.join(quote(a) for a in argv)}",
        "# SIGHUP reloads the config (and the model, if it changed) without a restart.",
        "ExecReload=kill -HUP $MAINPID",
        "# The first load on a machine may measure the providers (up to 90 s) before the",
        "# serving session loads; READY=1 comes after both.",
        f"TimeoutStartSec={START_TIMEOUT_S}",
        f"WorkingDirectory={_specifiers(str(supervision.working_directory(config)))}",
        *(f"Environment={quote(f'{k}={v}', dollars=False)}" for k, v in env.items()),
        "# Restart after a crash, not after a clean stop, and never after exit 78",
        "# (EX_CONFIG: a bad config or a missing model), 200 or 203 (systemd could not",
        "# enter the config's folder or run the program: moved): a restart cannot fix those.",
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        f"RestartPreventExitStatus={NO_RESTART}",
        "# SIGTERM lets the frames in flight finish; SIGKILL only after the daemon's own",
        "# shutdown bound (daemon.shutdown_timeout_s) plus a margin.",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={supervision.stop_timeout_s(shutdown_timeout_s)}",
        "# The daemon sends WATCHDOG=1 every WatchdogSec/2 while it can serve; one that stops",
        "# answering (and cannot exit) is killed and, by Restart=on-failure, started again.",
        f"WatchdogSec={WATCHDOG_SEC}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def quote(value: str, *, dollars: bool = True) -> str:
    """One command-line word as systemd reads it: %-specifiers and $-variables escaped, quoted if needed."""
    value = _specifiers(value)
    if dollars:
        value = value.replace("$", "$$")
    if _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _specifiers(value: str) -> str:
    return value.replace("%", "%%")


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values]}} (keys may repeat, like Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif "=" in line and current is not None:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def words(value: str) -> list[str]:
    """A command line or Environment= value split back into words (undoing `quote`)."""
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(value)]


def exec_start(unit: dict[str, dict[str, list[str]]]) -> list[str]:
    return words(unit.get("Service", {}).get("ExecStart", [""])[-1])


def environment_of(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in unit.get("Service", {}).get("Environment", []):
        for word in shlex.split(value):
            key, _, val = word.replace("%%", "%").partition("=")
            env[key] = val
    return env


def config_of(text: str) -> Path | None:
    """The config file an installed unit runs the daemon with."""
    argv = exec_start(parse(text))
    if "-c" in argv[:-1]:
        return Path(argv[argv.index("-c") + 1])
    return None


def validate(text: str) -> dict[str, dict[str, list[str]]]:
    """Check a rendered unit is one systemd can run; DepthwatchError if not."""
    unit = parse(text)
    service = unit.get("Service", {})
    problems = []
    argv = exec_start(unit)
    if not argv or not os.path.isabs(argv[0]) or not os.access(argv[0], os.X_OK):
        problems.append("ExecStart must start with the absolute path of an executable")
    elif argv[-3:-1] != ["run", "-c"] or not os.path.isfile(argv[-1]):
        problems.append("ExecStart must end in `run -c <absolute path of an existing config>`")
    workdir = service.get("WorkingDirectory", [""])[-1].replace("%%", "%")
    if not os.path.isabs(workdir) or not os.path.isdir(workdir):
        problems.append(f"WorkingDirectory {workdir!r} is not an existing absolute folder")
    expected = {"Restart": "on-failure", "RestartPreventExitStatus": NO_RESTART, "KillSignal": "SIGTERM"}
    for key, value in expected.items():
        if service.get(key, [""])[-1] != value:
            problems.append(f"{key} must be {value}")
    timeout = service.get("TimeoutStopSec", [""])[-1]
    if not timeout.isdigit() or not 0 < int(timeout) <= supervision.MAX_STOP_TIMEOUT_S:
        problems.append(f"TimeoutStopSec must be 1..{supervision.MAX_STOP_TIMEOUT_S} s")
    if "WantedBy" not in unit.get("Install", {}):
        problems.append("[Install] must have WantedBy (so it starts at login)")
    if problems:
        raise DepthwatchError(f"the systemd unit is not usable: {'; '.join(problems)}")
    return unit
