"""The systemd user manager's tools: the systemctl and journalctl command lines, and what they say back.

The user manager is reached over the user's session bus, which exists only in
a real login session (or with lingering enabled): over `su`, `sudo` or some
ssh setups every systemctl call fails with "Failed to connect to bus", and
`unreachable` says so in one line with what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from depthwatch.service.supervision import Ran, State
from depthwatch.service.unitfile import UNIT

#: `systemctl show` properties that `status` reads.
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "ExecMainCode", "ExecMainStatus", "UnitFileState")


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


def start_unit() -> list[str]:
    return systemctl("start", UNIT)


def stop_unit() -> list[str]:
    """SIGTERM, then waits for the exit (SIGKILL after TimeoutStopSec)."""
    return systemctl("stop", UNIT)


def restart_unit() -> list[str]:
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
    # Whatever LoadState says: a unit whose file was deleted is "not-found" while its daemon runs on.
    # And a daemon starting (Type=notify: until READY=1, up to minutes) is a process that runs.
    running = (active in ("active", "reloading", "deactivating") and sub != "exited") or (
        active == "activating" and sub == "start" and pid is not None
    )
    return State(
        loaded=loaded,
        running=running,
        pid=pid,
        last_exit=last_exit,
        last_signal=last_signal,
        detail=f"{active} ({sub})" if sub else active,
    )


#: The generator systemd's user manager runs at each start to read environment.d (Debian, Ubuntu, Fedora, Arch).
ENVIRONMENT_D_GENERATORS = (
    "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator",
    "/lib/systemd/user-environment-generators/30-systemd-environment-d-generator",
)


def assignments(text: str, quoted: bool) -> dict[str, str]:
    """NAME=value lines; `quoted`: as `show-environment` writes them, a value with odd characters as $'...'."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.isidentifier():
            found[name] = _c_unescaped(value[2:-1]) if quoted and value.startswith("$'") and value.endswith("'") else value
    return found


_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)
_C_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b"}


def _c_unescaped(text: str) -> str:
    """A $'...' string's contents as the shell reads them (`\\'` a quote, `\\n` a newline, `\\xNN` a byte)."""

    def byte(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] == "x" and len(code) > 1:
            return chr(0xDC00 + int(code[1:], 16)) if int(code[1:], 16) >= 0x80 else chr(int(code[1:], 16))
        if code[0] in "01234567":
            value = int(code, 8) & 0xFF
            return chr(0xDC00 + value) if value >= 0x80 else chr(value)
        return _C_SIMPLE.get(code, code)

    # Bytes given as escapes (\xc3\xa9) are put back as the UTF-8 they spell, as the shell would.
    return os.fsdecode(os.fsencode(_C_ESCAPE.sub(byte, text)))


#: How systemctl says it cannot reach the user manager: "Failed to connect to bus: No medium found",
#: or on newer systemd "Failed to connect to user scope bus via local transport: ...".
_NO_BUS = re.compile(r"Failed to connect to (user scope )?bus")
#: What journalctl prints instead of lines when there are none.
NO_ENTRIES = "-- No entries --"


def unreachable(ran: Ran, environ: Mapping[str, str]) -> str | None:
    """Why the user manager cannot be reached, and what to do, if that is why `ran` failed."""
    if ran.ok or not _NO_BUS.search(ran.stderr + ran.stdout):
        return None
    why = "XDG_RUNTIME_DIR is unset: " if not environ.get("XDG_RUNTIME_DIR") else ""
    return (
        f"the systemd user manager is unreachable ({ran.reason}): {why}there is no user session here; "
        "log in through a real session (not su or sudo), or run `loginctl enable-linger $USER` "
        "and set XDG_RUNTIME_DIR=/run/user/$(id -u)"
    )
