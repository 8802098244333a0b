"""The launchd LaunchAgent: its plist, the launchctl command lines, and the `depthwatch service` verbs on them.

A per-user agent in the `gui/<uid>` domain, not a system daemon: only a job
in the user's login session reaches the GPU (CoreML, Metal) and the user's
own folders. Everything here takes the home folder and the uid as arguments,
so the plist and the command lines are built and tested on Linux too.

The plist is generated with plistlib, so every value is escaped and typed
correctly and the package needs no data file; `launchd/<LABEL>.plist.template`
in the repository is the same plist with placeholders and comments, for
reading and installing by hand, and a test keeps the two identical.
"""

from __future__ import annotations

import os
import plistlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.parsers.expat import ExpatError

from depthwatch import paths
from depthwatch.errors import DepthwatchError
from depthwatch.service import logfiles, supervision
from depthwatch.service.manager import Manager
from depthwatch.service.supervision import State, describe_end, describe_exit, run
from depthwatch.service.undo import Undo

#: The job's label (reverse DNS), used for the plist's name, the Label key and every service target.
LABEL = "com.depthwatch.agent"
#: launchd starts the job at most this often. KeepAlive also restarts exit 78
#: (launchd cannot be told to spare one exit code), so a broken config or a
#: missing model costs one start and one log line every 30 s, not a spin.
THROTTLE_INTERVAL_S = 30
#: Homebrew's folder on Apple Silicon, which launchd's default PATH lacks.
HOMEBREW_BIN = "/opt/homebrew/bin"
#: The daemon's log, which it writes and rotates itself (logfiles.LOG_FILE_ENV): launchd holds
#: StandardErrorPath open for the job's life, so a file it writes can never be rotated.
LOG_NAME = "depthwatch.log"
#: stdout and stderr: only what bypasses the log (a C library's own lines, a crash's traceback).
STDOUT_NAME = "depthwatch.out.log"
#: What plistlib raises on a file that is not a plist (InvalidFileException is a ValueError).
PARSE_ERRORS = (ValueError, ExpatError)

_COMMENT = """\
<!--
  depthwatch, as a per-user LaunchAgent. Written by `depthwatch service install`:
  change the config and run that again rather than editing this file
  (ExitTimeOut follows the config's daemon.shutdown_timeout_s).
  No OBJC_DISABLE_INITIALIZE_FORK_SAFETY: depthwatch never forks, so the
  Objective-C runtime's fork-safety check has nothing to catch.
-->
"""


# -- where things go ----------------------------------------------------------------------


def agents_dir(home: Path) -> Path:
    return home / "Library" / "LaunchAgents"


def plist_path(home: Path) -> Path:
    return agents_dir(home) / f"{LABEL}.plist"


def log_dir(home: Path) -> Path:
    """paths.log_dir("darwin") (~/Library/Logs/depthwatch, where Console.app looks), under `home`."""
    return home / paths.log_dir("darwin").relative_to(Path.home())


def log_path(home: Path) -> Path:
    return log_dir(home) / LOG_NAME


def stdout_path(home: Path) -> Path:
    return log_dir(home) / STDOUT_NAME


# -- the plist ----------------------------------------------------------------------------


def build(config: Path, *, home: Path, shutdown_timeout_s: float, executable: str | None = None) -> dict[str, Any]:
    """The LaunchAgent for running `depthwatch run -c config` as this user.

    KeepAlive restarts the daemon after a crash (non-zero exit or a fatal
    signal) but not after a clean stop: SIGTERM makes it exit 0. ProcessType
    Interactive keeps macOS from throttling it as a background job, which
    would slow GPU inference.
    """
    config = Path(os.path.abspath(config))
    return {
        "Label": LABEL,
        "ProgramArguments": supervision.arguments(config, executable),
        "WorkingDirectory": str(supervision.working_directory(config)),
        "EnvironmentVariables": {
            **supervision.environment(executable, extra_path=(HOMEBREW_BIN,)),
            logfiles.LOG_FILE_ENV: str(log_path(home)),
        },
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False, "Crashed": True},
        "ThrottleInterval": THROTTLE_INTERVAL_S,
        "ProcessType": "Interactive",
        "ExitTimeOut": supervision.stop_timeout_s(shutdown_timeout_s),
        "StandardOutPath": str(stdout_path(home)),
        "StandardErrorPath": str(stdout_path(home)),
    }


def dumps(plist: dict[str, Any]) -> bytes:
    """The plist as XML, keys in a reading order, with a comment saying where it came from."""
    data = plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=False)
    head, sep, rest = data.partition(b"<plist ")
    return head + _COMMENT.encode() + sep + rest


#: Each key the plist must have, and the type its value must be.
KEY_TYPES: dict[str, type] = {
    "Label": str,
    "ProgramArguments": list,
    "WorkingDirectory": str,
    "EnvironmentVariables": dict,
    "RunAtLoad": bool,
    "KeepAlive": dict,
    "ThrottleInterval": int,
    "ProcessType": str,
    "ExitTimeOut": int,
    "StandardOutPath": str,
    "StandardErrorPath": str,
}


def validate(data: bytes) -> dict[str, Any]:
    """Parse a rendered plist and check it is one launchd can run; DepthwatchError if not.

    The same checks `launchctl bootstrap` would fail on later, with less to
    go on: keys and types, absolute paths that exist, an executable program.
    """
    try:
        plist = plistlib.loads(data)
    except PARSE_ERRORS as exc:
        raise DepthwatchError(f"the LaunchAgent plist does not parse ({exc}); please report this") from None
    problems = list(_problems(plist))
    if problems:
        raise DepthwatchError(f"the LaunchAgent plist is not usable: {'; '.join(problems)}")
    return plist


def _problems(plist: Any) -> list[str]:
    if not isinstance(plist, dict):
        return ["it is not a dictionary"]
    problems = []
    for key, kind in KEY_TYPES.items():
        value = plist.get(key)
        if value is None:
            problems.append(f"{key} is missing")
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(f"{key} must be {kind.__name__}, not {type(value).__name__}")
    if problems:
        return problems
    argv = plist["ProgramArguments"]
    if plist["Label"] != LABEL:
        problems.append(f"Label is {plist['Label']!r}, not {LABEL!r}")
    if not argv or not all(isinstance(a, str) for a in argv):
        problems.append("ProgramArguments must be a list of strings")
    elif not os.path.isabs(argv[0]) or not os.access(argv[0], os.X_OK):
        problems.append(f"{argv[0]} is not an absolute path to an executable")
    elif argv[-3:-1] != ["run", "-c"] or not os.path.isabs(argv[-1]) or not os.path.isfile(argv[-1]):
        problems.append("ProgramArguments must end in `run -c <absolute path of an existing config>`")
    if not os.path.isabs(plist["WorkingDirectory"]) or not os.path.isdir(plist["WorkingDirectory"]):
        problems.append(f"WorkingDirectory {plist['WorkingDirectory']} is not an existing absolute folder")
    for key in ("StandardOutPath", "StandardErrorPath"):
        if not os.path.isabs(plist[key]) or not os.path.isdir(os.path.dirname(plist[key])):
            problems.append(f"{key} {plist[key]} is not in an existing folder (launchd does not create it)")
    env = plist["EnvironmentVariables"]
    if not isinstance(env.get("PATH"), str) or not all(isinstance(v, str) for v in env.values()):
        problems.append("EnvironmentVariables must map names to strings, PATH among them")
    log = env.get(logfiles.LOG_FILE_ENV)
    if not isinstance(log, str) or not os.path.isabs(log) or not os.path.isdir(os.path.dirname(log)):
        problems.append(f"EnvironmentVariables must set {logfiles.LOG_FILE_ENV} to a file in an existing folder (the rotated log)")
    if "OBJC_DISABLE_INITIALIZE_FORK_SAFETY" in env:
        problems.append("OBJC_DISABLE_INITIALIZE_FORK_SAFETY must not be set: depthwatch never forks")
    if plist["KeepAlive"].get("SuccessfulExit") is not False:
        problems.append("KeepAlive must have SuccessfulExit false (restart after a crash, not after a clean stop)")
    if plist["ProcessType"] != "Interactive":
        problems.append("ProcessType must be Interactive (a background job's GPU work is throttled)")
    if not 0 < plist["ExitTimeOut"] <= supervision.MAX_STOP_TIMEOUT_S:
        problems.append(f"ExitTimeOut must be 1..{supervision.MAX_STOP_TIMEOUT_S} s")
    if plist["ThrottleInterval"] < 1:
        problems.append("ThrottleInterval must be at least 1 s")
    return problems


def config_of(plist: dict[str, Any]) -> Path | None:
    """The config file an installed plist runs the daemon with."""
    argv = plist.get("ProgramArguments") if isinstance(plist, dict) else None
    argv = argv if isinstance(argv, list) else []
    if "-c" in argv[:-1]:
        return Path(argv[argv.index("-c") + 1])
    return None


# -- launchctl ----------------------------------------------------------------------------


def domain(uid: int) -> str:
    """The user's GUI login session, where a LaunchAgent lives."""
    return f"gui/{uid}"


def service_target(uid: int) -> str:
    return f"{domain(uid)}/{LABEL}"


def bootstrap(uid: int, plist: Path) -> list[str]:
    """Load the agent; with RunAtLoad this also starts it."""
    return ["launchctl", "bootstrap", domain(uid), str(plist)]


def bootout(uid: int) -> list[str]:
    """Unload the agent: SIGTERM, SIGKILL after ExitTimeOut, and launchd forgets it until the next login."""
    return ["launchctl", "bootout", service_target(uid)]


def enable(uid: int) -> list[str]:
    """Clear a `launchctl disable` left from before, which would make bootstrap fail."""
    return ["launchctl", "enable", service_target(uid)]


def kickstart(uid: int, *, kill: bool = False) -> list[str]:
    """Start it now; with `kill`, stop the running one first (a restart)."""
    return ["launchctl", "kickstart", *(["-k"] if kill else []), service_target(uid)]


def terminate(uid: int) -> list[str]:
    """SIGTERM: the daemon finishes its frames and exits 0, and KeepAlive leaves it stopped."""
    return ["launchctl", "kill", "SIGTERM", service_target(uid)]


def describe(uid: int) -> list[str]:
    """`launchctl print`: loaded or not, state, pid, last exit code."""
    return ["launchctl", "print", service_target(uid)]


def lint(plist: Path) -> list[str]:
    """Apple's own plist check, on macOS."""
    return ["plutil", "-lint", str(plist)]


_FIELD = re.compile(r"^\t([a-z][a-z ]*?) = (.*)$")


def parse_print(text: str, loaded: bool = True) -> State:
    """The service's state from `launchctl print` output (whose format is not an API).

    Only the service's own top-level fields are read (one tab deep), not those
    of nested blocks such as endpoints. `last exit code` reads like `0`,
    `78: EX_CONFIG` or `(never exited)`.
    """
    if not loaded:
        return State(loaded=False)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = _FIELD.match(line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2).strip()
    state = fields.get("state", "")
    return State(
        loaded=True,
        running=state == "running",
        pid=_leading_int(fields.get("pid")),
        last_exit=_leading_int(fields.get("last exit code")),
        last_signal=_trailing_int(fields.get("last terminating signal")),
        detail=state,
    )


def _leading_int(value: str | None) -> int | None:
    match = re.match(r"-?\d+", value or "")
    return int(match.group()) if match else None


def _trailing_int(value: str | None) -> int | None:
    match = re.search(r"(\d+)\s*$", value or "")
    return int(match.group(1)) if match else None


# -- the verbs ----------------------------------------------------------------------------


class Launchd(Manager):
    """The verbs for a LaunchAgent in the user's GUI session (gui/<uid>)."""

    label = LABEL

    def __init__(self, home: Path, uid: int) -> None:
        self.home = home
        self.uid = uid
        self.definition = plist_path(home)

    def render(self, config: Path, *, shutdown_timeout_s: float) -> bytes:
        return dumps(build(config, home=self.home, shutdown_timeout_s=shutdown_timeout_s))

    def config_in(self, data: bytes) -> Path | None:
        try:
            return config_of(plistlib.loads(data))
        except PARSE_ERRORS as exc:
            raise ValueError(str(exc)) from None

    def display_name(self) -> str:
        return f"{LABEL} (launchd, {domain(self.uid)})"

    def log_hint(self) -> str:
        return f"{log_path(self.home)} (`depthwatch service logs`)"

    def install_definition(self, data: bytes, undo: Undo) -> None:
        undo.folder(log_dir(self.home))  # launchd does not create the log folder
        undo.folder(self.definition.parent)
        validate(data)
        was_loaded = self.state().loaded
        if was_loaded:
            self.unload()
            if self.definition.exists():  # the old agent back, as it was (undone after its plist is put back)
                undo.on_failure(lambda: run(bootstrap(self.uid, self.definition), check=False))
        undo.write(self.definition, data)
        run(lint(self.definition))
        run(enable(self.uid))
        self.load()
        print(f"installed {self.definition} and started {LABEL}")
        print(f"log: {log_path(self.home)} (`depthwatch service logs`); check it with `depthwatch service status`")

    def uninstall(self) -> int:
        state = self.state()
        if state.loaded:
            self.unload()
        existed = self.definition.exists()
        if existed:
            self.definition.unlink()
        if not state.loaded and not existed:
            print(f"{LABEL} is not installed; nothing to do")
            return 0
        print(f"stopped and removed {LABEL} ({self.definition}); its logs stay in {log_dir(self.home)}")
        return 0

    def start(self) -> int:
        self.require_installed()
        state = self.state()
        if state.running:
            print(f"{LABEL} is already running (pid {state.pid})")
            return 0
        if state.loaded:
            run(kickstart(self.uid))
        else:
            self.load()
        print(f"started {LABEL}")
        return 0

    def stop(self) -> int:
        self.require_installed()
        state = self.state()
        if not state.running:
            print(f"{LABEL} is not running")
            return 0
        run(terminate(self.uid))
        timeout = self.exit_timeout() + 5
        state = _wait(self.state, lambda s: not s.running, timeout)
        if state.running:
            raise DepthwatchError(
                f"{LABEL} is still running {timeout} s after SIGTERM; "
                f"`launchctl kill SIGKILL {service_target(self.uid)}` stops it at once"
            )
        print(f"stopped {LABEL} ({describe_end(state, stopped=True)})")
        return 0

    def restart(self) -> int:
        self.require_installed()
        if self.state().loaded:
            run(kickstart(self.uid, kill=True))
        else:
            self.load()
        print(f"restarted {LABEL}")
        return 0

    def logs(self, lines: int, *, follow: bool) -> int:
        return logfiles.show([log_path(self.home), stdout_path(self.home)], lines, follow=follow)

    # -- steps --

    def state(self) -> State:
        ran = run(describe(self.uid), check=False)
        return parse_print(ran.stdout, loaded=ran.ok)

    def exit_timeout(self) -> int:
        try:
            value = plistlib.loads(self.definition.read_bytes()).get("ExitTimeOut")
        except (OSError, AttributeError, *PARSE_ERRORS):
            value = None
        return value if isinstance(value, int) else supervision.MAX_STOP_TIMEOUT_S

    def load(self) -> None:
        ran = run(bootstrap(self.uid, self.definition), check=False)
        if not ran.ok:
            raise DepthwatchError(
                f"`launchctl bootstrap` failed: {ran.reason}; a LaunchAgent loads only while you are logged in "
                f"at the Mac's screen ({domain(self.uid)}), and `plutil -lint {self.definition}` checks the file"
            )

    def unload(self) -> None:
        """Boot the agent out and wait until launchd has let go of it (bootstrap fails until then)."""
        timeout = self.exit_timeout() + 5
        ran = run(bootout(self.uid), check=False)
        if _wait(self.state, lambda s: not s.loaded, timeout).loaded:
            raise DepthwatchError(f"`launchctl bootout` did not unload {LABEL} within {timeout} s: {ran.reason}")


def _wait(probe: Callable[[], State], done: Callable[[State], bool], timeout: float) -> State:
    """Ask launchd again until `done`, or until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    state = probe()
    while not done(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = probe()
    return state
