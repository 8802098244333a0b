"""What launchd and systemd are both told about the daemon, and how `depthwatch service` talks to them.

The plist and the unit start the daemon the same way: the same absolute
command line (`run -c <absolute config>`), the same working directory, the
same environment and the same stop timeout, so a service behaves alike on
macOS and Linux and a test can start it exactly as the supervisor would.

`depthwatch service` is a short-lived process of its own that runs
`launchctl` / `systemctl`; the daemon it manages never starts a process.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from depthwatch.errors import EX_CONFIG, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, DepthwatchError

#: Seconds added to daemon.shutdown_timeout_s before a supervisor may SIGKILL:
#: the daemon's own deadline covers the frames in flight, this covers the
#: threads' last joins (each gets at least 0.1 s) and the interpreter's exit.
SHUTDOWN_MARGIN_S = 5
#: Never wait longer than this after SIGTERM. launchd's default is 20 s, and
#: at logout or shutdown every second spent here is a second the user waits.
MAX_STOP_TIMEOUT_S = 30
#: The folders any PATH we hand a service ends with (launchd's own default PATH).
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")
#: A launchctl or systemctl call never takes longer than a stop plus a little.
COMMAND_TIMEOUT_S = MAX_STOP_TIMEOUT_S + 30


def stop_timeout_s(shutdown_timeout_s: float) -> int:
    """Whole seconds a supervisor waits between SIGTERM and SIGKILL.

    Follows the daemon's graceful-shutdown bound plus a margin, so a clean stop
    is never cut short, and stays under MAX_STOP_TIMEOUT_S so a stuck daemon
    cannot hold up logout or shutdown. (ExitTimeOut and TimeoutStopSec take
    whole seconds; the config allows at most 19 s, giving at most 24 s.)
    """
    return min(MAX_STOP_TIMEOUT_S, math.ceil(shutdown_timeout_s) + SHUTDOWN_MARGIN_S)


def program(executable: str | None = None) -> list[str]:
    """The absolute command that starts depthwatch under a supervisor.

    The `depthwatch` entry point beside the interpreter when there is one (a
    virtualenv, a normal install); otherwise `python -m depthwatch`. The entry
    point comes first because `python -m` puts the working directory on
    sys.path, where a stray `depthwatch/` folder would shadow the install.
    The path is made absolute but not resolved: a virtualenv's python is a
    symlink, and following it would leave the virtualenv behind.
    """
    executable = executable if executable is not None else sys.executable
    if not executable:
        raise DepthwatchError(
            "cannot tell which Python runs depthwatch (sys.executable is empty); "
            "run `python -m depthwatch service install` with the Python depthwatch is installed in"
        )
    executable = os.path.abspath(executable)
    script = Path(executable).parent / "depthwatch"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [executable, "-m", "depthwatch"]


def arguments(config: Path, executable: str | None = None) -> list[str]:
    """The full command line: the program, then `run -c <absolute config>`."""
    return [*program(executable), "run", "-c", os.path.abspath(config)]


def search_path(executable: str | None = None, extra: Sequence[str] = ()) -> str:
    """PATH for the daemon: the interpreter's own folder, `extra`, then the system's.

    Supervisors start services with a bare PATH, not the login shell's; naming
    it keeps anything the daemon or its libraries look up on PATH the same as
    in the shell where `depthwatch service install` was run.
    """
    first = os.path.dirname(program(executable)[0])
    folders: list[str] = []
    for folder in (first, *extra, *SYSTEM_PATH):
        if folder not in folders:
            folders.append(folder)
    return os.pathsep.join(folders)


#: The base folders a service would otherwise lose: set in the shell that installs, they are
#: where `models fetch` put the models and where `depthwatch status` reads the status.
PINNED = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")
#: What the supervisor itself gives every service (launchd and systemd alike), beside `environment`.
GIVEN = ("HOME", "USER", "LOGNAME", "SHELL", "TMPDIR")


def environment(executable: str | None = None, extra_path: Sequence[str] = ()) -> dict[str, str]:
    """The variables a supervisor sets for the daemon.

    PYTHONUNBUFFERED: stdout goes to a file under a supervisor, and a block
    buffer would hold anything printed there until the process exits (logging
    goes to stderr, which Python line-buffers anyway). The XDG base folders the
    installing shell sets (`PINNED`): a service starts without the shell's
    variables, so a model fetched under $XDG_DATA_HOME would be "not installed"
    for it, and its status would go where `depthwatch status` does not look.
    """
    pinned = {name: os.environ[name] for name in PINNED if os.path.isabs(os.environ.get(name, ""))}
    return {"PATH": search_path(executable, extra_path), "PYTHONUNBUFFERED": "1", **pinned}


@contextlib.contextmanager
def as_the_service_sees_it(manager_environment: Mapping[str, str] | None = None) -> Iterator[None]:
    """Only the variables a service will have, meanwhile: a config is checked as the daemon will read it.

    Checked with the shell's variables, a config whose folder is under one of them
    (`$SHOTS`) would be "installed and started", its daemon then exit 78 at every
    start, and launchd start it again every 30 s, for good. `manager_environment`:
    what the service manager itself hands every service (systemd's user manager:
    `systemctl --user show-environment`, environment.d included), where it can say.
    """
    saved = dict(os.environ)
    seen = {name: saved[name] for name in GIVEN if name in saved} | dict(manager_environment or {}) | environment()
    os.environ.clear()
    os.environ.update(seen)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def working_directory(config: Path) -> Path:
    """The config file's folder: the config's relative paths are taken from there too.

    So a relative path anywhere means the same thing under the supervisor as it
    does to someone reading the config (launchd would otherwise start in /).
    """
    return Path(os.path.abspath(config)).parent


#: The daemon's own exit statuses (sysexits.h), as a person reads them.
_EXITS = {
    0: "a clean stop",
    EX_CONFIG: "EX_CONFIG: a bad config or a missing model; the log's last line says what to fix",
    EX_UNAVAILABLE: "EX_UNAVAILABLE: something it needs cannot be reached (a farm's scheduler); the log says what",
    EX_SOFTWARE: "EX_SOFTWARE: its inference thread died; a restart may help, the log says why",
    EX_TEMPFAIL: "EX_TEMPFAIL: another daemon watches the same folder; it starts once that one stops",
    #: systemd's own, when it could not start the program at all (systemd.exec(5)).
    200: "systemd could not enter its working directory, the config's folder: moved or renamed? run `depthwatch service install` again",
    203: "systemd could not run the program: the virtualenv moved or was removed? run `depthwatch service install` again",
}
#: systemd's statuses for a start that never reached the program (200..243, systemd.exec(5)).
SYSTEMD_START_FAILURES = range(200, 244)


def describe_exit(code: int | None) -> str:
    """An exit status as a person reads it, with the ones a restart cannot fix spelled out."""
    if code is None:
        return "none yet"
    if code in _EXITS:
        return f"{code} ({_EXITS[code]})"
    if code in SYSTEMD_START_FAILURES:
        return f"{code} (systemd could not start the program; `depthwatch service logs` says why)"
    if 128 < code < 160:  # a shell's way of saying a signal ended it
        return f"{code} (killed by signal {code - 128})"
    return f"{code} (a crash; see the log)"


def describe_end(state: State, stopped: bool = False) -> str:
    """How the service's last run ended: its exit status, or the signal that ended it.

    `stopped`: just after a stop asked for, where a SIGKILL is the supervisor's, after
    the stop timeout; elsewhere it may be anyone's (`kill -9`, the OOM killer, jetsam).
    """
    if state.last_signal is not None and state.last_exit is None:
        if state.last_signal == 9 and stopped:
            return "killed by signal 9, SIGKILL: it did not stop in time, and the frames in flight were lost"
        return f"killed by signal {state.last_signal}{' (SIGKILL)' if state.last_signal == 9 else ''}"
    return f"exit status {describe_exit(state.last_exit)}"


@dataclass(frozen=True)
class State:
    """What a supervisor says about the service, in the same words for both."""

    loaded: bool
    running: bool = False
    pid: int | None = None
    last_exit: int | None = None
    last_signal: int | None = None
    detail: str = ""


# -- running launchctl / systemctl --------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """A finished launchctl / systemctl call."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def reason(self) -> str:
        """The tool's own first line about what went wrong, for a one-line error."""
        for text in (self.stderr, self.stdout):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return f"exit status {self.returncode}"


def run(argv: Sequence[str], *, check: bool = True, capture: bool = True, timeout: float = COMMAND_TIMEOUT_S) -> Ran:
    """Run one supervisor command; with `check`, a failure is a one-line DepthwatchError."""
    argv = tuple(argv)
    if shutil.which(argv[0]) is None:
        raise DepthwatchError(f"`{argv[0]}` is not on PATH; `depthwatch service` needs it to manage the service here")
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=capture,
            text=True,
            timeout=None if not capture else timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DepthwatchError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s") from None
    ran = Ran(argv, proc.returncode, proc.stdout or "", proc.stderr or "")
    if check and not ran.ok:
        raise DepthwatchError(f"`{shlex.join(argv)}` failed: {ran.reason}")
    return ran
