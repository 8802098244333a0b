"""The systemd user service: its unit file, the systemctl command lines, and the `depthwatch service` verbs on them.

The Linux counterpart of `launchd`: a `systemd --user` unit, so the daemon
runs as the user, with the user's folders and GPU, and its log goes to the
journal (`journalctl --user -u depthwatch.service`), which rotates it.
Unlike launchd, systemd can be told not to restart after exit 78
(RestartPreventExitStatus), so a bad config or a missing model stops it with
the reason as the last journal line instead of retrying.

The user manager is reached over the user's session bus, which exists only in
a real login session (or with lingering enabled): over `su`, `sudo` or some
ssh setups every systemctl call fails with "Failed to connect to bus", and the
verbs say so in one line with what to do.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from depthwatch.errors import EX_CONFIG, DepthwatchError
from depthwatch.service import logfiles, supervision
from depthwatch.service.manager import Manager
from depthwatch.service.supervision import Ran, State, describe_end, describe_exit, run
from depthwatch.service.undo import Undo

UNIT = "depthwatch.service"
#: Pause before a restart after a crash (exit 78 is never restarted).
RESTART_SEC = 5
#: Exit statuses a restart cannot fix: a bad config or a missing model (78), and systemd's own for a
#: working directory (200) or a program (203) that is not there any more (the folder or virtualenv moved).
NO_RESTART = f"{EX_CONFIG} 200 203"
#: How long systemd waits for READY=1: provider measurement (at most 90 s) plus the model load.
START_TIMEOUT_S = 300
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


#: How systemctl says it cannot reach the user manager: "Failed to connect to bus: No medium found",
#: or on newer systemd "Failed to connect to user scope bus via local transport: ...".
#: The generator systemd's user manager runs at each start to read environment.d (Debian, Ubuntu, Fedora, Arch).
ENVIRONMENT_D_GENERATORS = (
    "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator",
    "/lib/systemd/user-environment-generators/30-systemd-environment-d-generator",
)


def _assignments(text: str, quoted: bool) -> dict[str, str]:
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


_NO_BUS = re.compile(r"Failed to connect to (user scope )?bus")
#: What journalctl prints instead of lines when there are none.
_NO_ENTRIES = "-- No entries --"


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


# -- the verbs ----------------------------------------------------------------------------


class Systemd(Manager):
    """The verbs for a `systemd --user` service."""

    label = UNIT

    def __init__(self, home: Path, environ: Mapping[str, str]) -> None:
        self.home = home
        self.environ = environ
        self.definition = unit_path(home, environ)

    def render(self, config: Path, *, shutdown_timeout_s: float) -> bytes:
        return render(config, shutdown_timeout_s=shutdown_timeout_s).encode()

    def config_in(self, data: bytes) -> Path | None:
        return config_of(data.decode("utf-8"))

    def display_name(self) -> str:
        return f"{UNIT} (systemd --user)"

    def log_hint(self) -> str:
        return f"journalctl --user -u {UNIT} (`depthwatch service logs`)"

    def install_definition(self, data: bytes, undo: Undo) -> None:
        validate(data.decode("utf-8"))
        undo.folder(self.definition.parent)
        fresh = not self.definition.exists()
        if not fresh and self.state().running:  # last of all: the old unit back and reloaded, its daemon too
            undo.on_failure(self._start_the_old_one)
        undo.on_failure(lambda: run(daemon_reload(), check=False))  # after the unit is put back
        undo.write(self.definition, data)
        self.systemctl(daemon_reload())
        self.systemctl(enable())
        if fresh:  # a first install that fails further on is not left enabled (a dangling wants link)
            undo.on_failure(lambda: run(disable(), check=False))  # before the unit is removed: newest first
        self.systemctl(restart_unit())  # restart, not start: a reinstall must pick up the new unit
        print(f"installed {self.definition} and started {UNIT}; it starts at every login")
        print("to start it at boot, before anyone logs in: `loginctl enable-linger $USER`")
        print(f"log: `depthwatch service logs` (journalctl --user -u {UNIT}); check it with `depthwatch service status`")

    def manager_environment(self, lasting: bool = True) -> dict[str, str]:
        """The variables the user manager hands every unit.

        `lasting`: at each of its starts, a reboot's too: environment.d, as the
        manager's own generator reads it. Not what `systemctl --user
        set-environment` or a login session gave the running manager: those
        are gone at the next boot, and with linger (which install advises) the
        service then starts without them and exits 78 at every start. Without
        the generator, and with `lasting` False: what the manager holds now.
        """
        if lasting:
            generator = next((path for path in ENVIRONMENT_D_GENERATORS if os.access(path, os.X_OK)), None)
            if generator is not None:
                ran = run([generator], check=False)
                return _assignments(ran.stdout, quoted=False) if ran.ok else {}
        ran = run(["systemctl", "--user", "show-environment"], check=False)
        return _assignments(ran.stdout, quoted=True) if ran.ok else {}

    def _start_the_old_one(self) -> None:
        """A reinstall failed after `restart` stopped the service: its old unit is back; start its daemon again."""
        ran = run(restart_unit(), check=False)
        if ran.ok:
            print(f"depthwatch: {UNIT} runs again with the unit it had", file=sys.stderr)
        else:
            print(f"depthwatch: {UNIT} is stopped: its old unit is back but did not start ({ran.reason})", file=sys.stderr)

    def uninstall(self) -> int:
        state = self.state()
        existed = self.definition.exists()
        if not state.loaded and not existed and not state.running:
            print(f"{UNIT} is not installed; nothing to do")
            return 0
        self.systemctl(disable(), check=False)  # fails harmlessly when it was never enabled
        if self.state().running:
            # `disable --now` did not stop it (never enabled, or its stop failed): stop it now, or say why
            # not, before its unit goes from under a daemon that still runs.
            self.systemctl(stop_unit())
            if self.state().running:
                raise DepthwatchError(f"{UNIT} still runs after `systemctl --user stop`; nothing was removed: stop it, then uninstall again")
        if existed:
            self.definition.unlink()
        self.systemctl(daemon_reload())
        print(f"stopped and removed {UNIT} ({self.definition}); its log stays in the journal")
        return 0

    def start(self) -> int:
        self.require_installed()
        self.systemctl(start_unit())
        print(f"started {UNIT}")
        return 0

    def stop(self) -> int:
        if not self.state().running:  # a daemon whose unit file was deleted is stopped all the same
            self.require_installed()
        self.systemctl(stop_unit())  # returns once the daemon has exited
        print(f"stopped {UNIT} ({describe_end(self.state(), stopped=True)})")
        return 0

    def restart(self) -> int:
        self.require_installed()
        self.systemctl(restart_unit())
        print(f"restarted {UNIT}")
        return 0

    def logs(self, lines: int, *, follow: bool) -> int:
        if follow:  # journalctl writes to the terminal itself until Ctrl-C (see logfiles.interruptible)
            with logfiles.interruptible():
                return run(journal(lines, follow=True), check=False, capture=False).returncode
        ran = run(journal(lines), check=False)
        text = "".join(line for line in ran.stdout.splitlines(keepends=True) if line.strip() != _NO_ENTRIES)
        if ran.ok and lines > 0 and not text.strip():
            said = f" (journalctl: {ran.reason})" if ran.stderr.strip() else ""
            print(
                f"depthwatch: the journal has no lines from {UNIT} yet{said}; `depthwatch service status` says whether it ran",
                file=sys.stderr,
            )
            return 0
        sys.stdout.write(text)
        sys.stderr.write(ran.stderr)
        return ran.returncode

    # -- steps --

    def state(self) -> State:
        ran = self.systemctl(show(), check=False)
        return parse_show(ran.stdout) if ran.ok else State(loaded=False)

    def systemctl(self, argv: Sequence[str], *, check: bool = True) -> Ran:
        """Run a systemctl line; an unreachable user manager is one line saying why, whatever `check` says."""
        ran = run(argv, check=False)
        reason = unreachable(ran, self.environ)
        if reason is not None:
            raise DepthwatchError(reason)
        if check and not ran.ok:
            raise DepthwatchError(f"`{shlex.join(argv)}` failed: {ran.reason}")
        return ran
