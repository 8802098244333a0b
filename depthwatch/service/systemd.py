"""The systemd user service: its unit file, and the systemctl command lines that manage it.

The Linux counterpart of `launchd`: a `systemd --user` unit, so the daemon
runs as the user, with the user's folders and GPU, and its log goes to the
journal (`journalctl --user -u depthwatch.service`), which rotates it.
Unlike launchd, systemd can be told not to restart after exit 78
(RestartPreventExitStatus), so a bad config or a missing model stops it with
the reason as the last journal line instead of retrying.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from depthwatch.service import supervision
from depthwatch.errors import EX_CONFIG, DepthwatchError
from depthwatch.service.supervision import State

UNIT = "depthwatch.service"
#: Pause before a restart after a crash (exit 78 is never restarted).
RESTART_SEC = 5
#: `systemctl show` properties that `status` reads.
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "ExecMainCode", "ExecMainStatus", "UnitFileState")


def unit_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """~/.config/systemd/user ($XDG_CONFIG_HOME/systemd/user), where `systemd --user` looks first."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    return base / "systemd" / "user"


def unit_path(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    return unit_dir(home, environ) / UNIT


# -- the unit -----------------------------------------------------------------------------


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
        "Type=simple",
        f"ExecStart={' '.join(quote(a) for a in argv)}",
        f"WorkingDirectory={_specifiers(str(supervision.working_directory(config)))}",
        *(f"Environment={quote(f'{k}={v}', dollars=False)}" for k, v in env.items()),
        "# Restart after a crash, not after a clean stop, and never after exit 78",
        "# (EX_CONFIG: a bad config or a missing model, which a restart cannot fix).",
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        f"RestartPreventExitStatus={EX_CONFIG}",
        "# SIGTERM lets the frames in flight finish; SIGKILL only after the daemon's own",
        "# shutdown bound (daemon.shutdown_timeout_s) plus a margin.",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={supervision.stop_timeout_s(shutdown_timeout_s)}",
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
    expected = {"Restart": "on-failure", "RestartPreventExitStatus": str(EX_CONFIG), "KillSignal": "SIGTERM"}
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


# -- systemctl ----------------------------------------------------------------------------


def systemctl(*args: str) -> list[str]:
    return ["systemctl", "--user", *args]


def daemon_reload() -> list[str]:
    """Make systemd read the unit file again after it changed."""
    return systemctl("daemon-reload")


def enable() -> list[str]:
    """Start it at every login (and at boot with `loginctl enable-linger`)."""
    return systemctl("enable", UNIT)


def disable() -> list[str]:
    """Stop it and no longer start it at login."""
    return systemctl("disable", "--now", UNIT)


def start() -> list[str]:
    return systemctl("start", UNIT)


def stop() -> list[str]:
    """SIGTERM, then waits for the exit (SIGKILL after TimeoutStopSec)."""
    return systemctl("stop", UNIT)


def restart() -> list[str]:
    return systemctl("restart", UNIT)


def show() -> list[str]:
    return systemctl("show", UNIT, f"--property={','.join(SHOW_PROPERTIES)}")


def journal(lines: int, follow: bool = False) -> list[str]:
    """The service's log from the journal, lines as the daemon wrote them (they carry their own time)."""
    argv = ["journalctl", "--user", "--unit", UNIT, "--lines", str(lines), "--output", "cat", "--no-pager"]
    return [*argv, "--follow"] if follow else argv


def verify(path: Path) -> list[str]:
    """systemd's own check of a unit file (used by the tests where systemd-analyze exists)."""
    return ["systemd-analyze", "--user", "verify", str(path)]


def parse_show(text: str) -> State:
    """The service's state from `systemctl --user show --property=...` (KEY=VALUE lines)."""
    props = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    loaded = props.get("LoadState", "") == "loaded"
    main_pid = props.get("MainPID", "0")
    pid = int(main_pid) if main_pid.isdigit() and main_pid != "0" else None
    code, status = props.get("ExecMainCode", "0"), props.get("ExecMainStatus", "0")
    # ExecMainCode: 1 exited (status is the exit code), 2 killed / 3 dumped (status is the signal).
    last_exit = int(status) if code == "1" and status.isdigit() else None
    last_signal = int(status) if code in ("2", "3") and status.isdigit() else None
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    return State(
        loaded=loaded,
        running=loaded and active in ("active", "reloading", "deactivating") and sub != "exited",
        pid=pid,
        last_exit=last_exit,
        last_signal=last_signal,
        detail=f"{active} ({sub})" if sub else active,
    )
