"""`depthwatch service`: run the daemon under launchd (macOS) or systemd --user (Linux).

The same verbs for both: install, uninstall, start, stop, restart, status,
logs and print. What goes into the plist or the unit, and the exact
launchctl / systemctl command lines, live in `depthwatch.service.launchd` and
`depthwatch.service.systemd`; this module puts them in order and reports.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthwatch.service import launchd, supervision, systemd
from depthwatch.errors import ConfigError, DepthwatchError
from depthwatch.service.supervision import State, describe_exit, run

if TYPE_CHECKING:
    from depthwatch.config import Config

HELP = "run depthwatch as a service: a launchd agent on macOS, a systemd user unit on Linux"

VERBS = {
    "install": "write the service definition, check it, load it and start it (run it again after changing the config)",
    "uninstall": "stop the service and remove its definition (its logs stay)",
    "start": "start the installed service",
    "stop": "stop the service cleanly; it stays stopped until started again or until the next login",
    "restart": "stop the service and start it again",
    "status": "whether the service is loaded and running, its pid and last exit status, and the daemon's status file",
    "logs": "show the end of the service's log",
    "print": "show the service definition that install would write, without installing anything",
}

MANAGERS = ("launchd", "systemd")

#: `status` exits with this when the service is not running (as `systemctl status` and LSB do).
EXIT_NOT_RUNNING = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--manager",
        choices=MANAGERS,
        help="the service manager to use (default: launchd on macOS, systemd elsewhere)",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, text in VERBS.items():
        sub = verbs.add_parser(name, help=text, description=text, parents=[common])
        if name in ("install", "print"):
            sub.add_argument(
                "-c",
                "--config",
                metavar="CONFIG",
                help="config file the service runs with (default: $DEPTHWATCH_CONFIG, then the user's config folder)",
            )
        if name == "logs":
            sub.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="how many lines to show (default 50)")
            sub.add_argument("-f", "--follow", action="store_true", help="keep showing new lines until Ctrl-C")


def main(args: argparse.Namespace) -> int:
    manager = args.manager or ("launchd" if sys.platform == "darwin" else "systemd")
    backend: Launchd | Systemd
    if manager == "launchd":
        backend = Launchd(Path.home(), os.getuid())
    else:
        backend = Systemd(Path.home(), os.environ)
    verbs: dict[str, Callable[[argparse.Namespace], int]] = {
        "install": backend.install,
        "uninstall": backend.uninstall,
        "start": backend.start,
        "stop": backend.stop,
        "restart": backend.restart,
        "status": backend.status,
        "logs": backend.logs,
        "print": backend.print_definition,
    }
    return verbs[args.verb](args)


# -- launchd ------------------------------------------------------------------------------


class Launchd:
    """The verbs for a LaunchAgent in the user's GUI session (gui/<uid>)."""

    def __init__(self, home: Path, uid: int) -> None:
        self.home = home
        self.uid = uid
        self.plist = launchd.plist_path(home)

    def definition(self, config_arg: str | None, *, check_model: bool) -> bytes:
        path, config = load_config(config_arg, check_model=check_model)
        plist = launchd.build(path, home=self.home, shutdown_timeout_s=config.daemon.shutdown_timeout_s)
        return launchd.dumps(plist)

    def print_definition(self, args: argparse.Namespace) -> int:
        sys.stdout.write(self.definition(args.config, check_model=False).decode())
        return 0

    def install(self, args: argparse.Namespace) -> int:
        from depthwatch.writer import atomic_write

        data = self.definition(args.config, check_model=True)
        launchd.log_dir(self.home).mkdir(parents=True, exist_ok=True)
        self.plist.parent.mkdir(parents=True, exist_ok=True)
        launchd.validate(data)
        previous = self.plist.read_bytes() if self.plist.exists() else None
        was_loaded = self.state().loaded
        if was_loaded:
            self.unload()
        atomic_write(self.plist, data)
        try:
            run(launchd.lint(self.plist))
            run(launchd.enable(self.uid))
            self.load()
        except BaseException:
            _put_back(self.plist, previous)
            if was_loaded and previous is not None:
                run(launchd.bootstrap(self.uid, self.plist), check=False)  # the old agent back, as it was
            raise
        print(f"installed {self.plist} and started {launchd.LABEL}")
        print(f"log: {launchd.log_path(self.home)} (`depthwatch service logs`); check it with `depthwatch service status`")
        return 0

    def uninstall(self, args: argparse.Namespace) -> int:
        state = self.state()
        if state.loaded:
            self.unload()
        existed = self.plist.exists()
        if existed:
            self.plist.unlink()
        if not state.loaded and not existed:
            print(f"{launchd.LABEL} is not installed; nothing to do")
            return 0
        print(f"stopped and removed {launchd.LABEL} ({self.plist}); its logs stay in {launchd.log_dir(self.home)}")
        return 0

    def start(self, args: argparse.Namespace) -> int:
        self.require_installed()
        state = self.state()
        if state.running:
            print(f"{launchd.LABEL} is already running (pid {state.pid})")
            return 0
        if state.loaded:
            run(launchd.kickstart(self.uid))
        else:
            self.load()
        print(f"started {launchd.LABEL}")
        return 0

    def stop(self, args: argparse.Namespace) -> int:
        self.require_installed()
        state = self.state()
        if not state.running:
            print(f"{launchd.LABEL} is not running")
            return 0
        run(launchd.stop(self.uid))
        timeout = self.exit_timeout() + 5
        state = _wait(self.state, lambda s: not s.running, timeout)
        if state.running:
            raise DepthwatchError(
                f"{launchd.LABEL} is still running {timeout} s after SIGTERM; "
                f"`launchctl kill SIGKILL {launchd.service_target(self.uid)}` stops it at once"
            )
        print(f"stopped {launchd.LABEL} (exit status {describe_exit(state.last_exit)})")
        return 0

    def restart(self, args: argparse.Namespace) -> int:
        self.require_installed()
        if self.state().loaded:
            run(launchd.kickstart(self.uid, kill=True))
        else:
            self.load()
        print(f"restarted {launchd.LABEL}")
        return 0

    def status(self, args: argparse.Namespace) -> int:
        state = self.state()
        config = None
        if self.plist.exists():
            try:
                config = launchd.config_of(plistlib.loads(self.plist.read_bytes()))
            except (OSError, *launchd.PARSE_ERRORS) as exc:
                print(f"{self.plist} cannot be read: {exc}; run `depthwatch service install` again")
        report(
            service=f"{launchd.LABEL} (launchd, {launchd.domain(self.uid)})",
            definition=self.plist,
            config=config,
            state=state,
            log=f"{launchd.log_path(self.home)} (`depthwatch service logs`)",
        )
        return 0 if state.running else EXIT_NOT_RUNNING

    def logs(self, args: argparse.Namespace) -> int:
        files = [launchd.log_path(self.home), launchd.stdout_path(self.home)]
        return show_logs(files, args.lines, follow=args.follow)

    # -- steps --

    def state(self) -> State:
        ran = run(launchd.describe(self.uid), check=False)
        return launchd.parse_print(ran.stdout, loaded=ran.ok)

    def require_installed(self) -> None:
        if not self.plist.exists():
            raise DepthwatchError(f"{launchd.LABEL} is not installed ({self.plist} is missing); run `depthwatch service install`")

    def exit_timeout(self) -> int:
        try:
            value = plistlib.loads(self.plist.read_bytes()).get("ExitTimeOut")
        except (OSError, *launchd.PARSE_ERRORS):
            value = None
        return value if isinstance(value, int) else supervision.MAX_STOP_TIMEOUT_S

    def load(self) -> None:
        ran = run(launchd.bootstrap(self.uid, self.plist), check=False)
        if not ran.ok:
            raise DepthwatchError(
                f"`launchctl bootstrap` failed: {ran.reason}; a LaunchAgent loads only while you are logged in "
                f"at the Mac's screen ({launchd.domain(self.uid)}), and `plutil -lint {self.plist}` checks the file"
            )

    def unload(self) -> None:
        """Boot the agent out and wait until launchd has let go of it (bootstrap fails until then)."""
        timeout = self.exit_timeout() + 5
        ran = run(launchd.bootout(self.uid), check=False)
        if _wait(self.state, lambda s: not s.loaded, timeout).loaded:
            raise DepthwatchError(f"`launchctl bootout` did not unload {launchd.LABEL} within {timeout} s: {ran.reason}")


# -- systemd ------------------------------------------------------------------------------


class Systemd:
    """The verbs for a `systemd --user` service."""

    def __init__(self, home: Path, environ: Mapping[str, str]) -> None:
        self.home = home
        self.unit = systemd.unit_path(home, environ)

    def definition(self, config_arg: str | None, *, check_model: bool) -> str:
        path, config = load_config(config_arg, check_model=check_model)
        return systemd.render(path, shutdown_timeout_s=config.daemon.shutdown_timeout_s)

    def print_definition(self, args: argparse.Namespace) -> int:
        sys.stdout.write(self.definition(args.config, check_model=False))
        return 0

    def install(self, args: argparse.Namespace) -> int:
        from depthwatch.writer import atomic_write

        text = self.definition(args.config, check_model=True)
        systemd.validate(text)
        self.unit.parent.mkdir(parents=True, exist_ok=True)
        previous = self.unit.read_bytes() if self.unit.exists() else None
        atomic_write(self.unit, text.encode())
        try:
            run(systemd.daemon_reload())
            run(systemd.enable())
            run(systemd.restart())  # restart, not start: a reinstall must pick up the new unit
        except BaseException:
            _put_back(self.unit, previous)
            run(systemd.daemon_reload(), check=False)
            raise
        print(f"installed {self.unit} and started {systemd.UNIT}; it starts at every login")
        print("to start it at boot, before anyone logs in: `loginctl enable-linger $USER`")
        print(f"log: `depthwatch service logs` (journalctl --user -u {systemd.UNIT}); check it with `depthwatch service status`")
        return 0

    def uninstall(self, args: argparse.Namespace) -> int:
        state = self.state()
        existed = self.unit.exists()
        if not state.loaded and not existed:
            print(f"{systemd.UNIT} is not installed; nothing to do")
            return 0
        run(systemd.disable(), check=False)  # fails harmlessly when it was never enabled
        if existed:
            self.unit.unlink()
        run(systemd.daemon_reload())
        print(f"stopped and removed {systemd.UNIT} ({self.unit}); its log stays in the journal")
        return 0

    def start(self, args: argparse.Namespace) -> int:
        self.require_installed()
        run(systemd.start())
        print(f"started {systemd.UNIT}")
        return 0

    def stop(self, args: argparse.Namespace) -> int:
        self.require_installed()
        run(systemd.stop())  # returns once the daemon has exited
        print(f"stopped {systemd.UNIT} (exit status {describe_exit(self.state().last_exit)})")
        return 0

    def restart(self, args: argparse.Namespace) -> int:
        self.require_installed()
        run(systemd.restart())
        print(f"restarted {systemd.UNIT}")
        return 0

    def status(self, args: argparse.Namespace) -> int:
        state = self.state()
        config = None
        if self.unit.exists():
            try:
                config = systemd.config_of(self.unit.read_text())
            except (OSError, ValueError) as exc:
                print(f"{self.unit} cannot be read: {exc}; run `depthwatch service install` again")
        report(
            service=f"{systemd.UNIT} (systemd --user)",
            definition=self.unit,
            config=config,
            state=state,
            log=f"journalctl --user -u {systemd.UNIT} (`depthwatch service logs`)",
        )
        return 0 if state.running else EXIT_NOT_RUNNING

    def logs(self, args: argparse.Namespace) -> int:
        return run(systemd.journal(args.lines, args.follow), check=False, capture=False).returncode

    # -- steps --

    def state(self) -> State:
        ran = run(systemd.show(), check=False)
        return systemd.parse_show(ran.stdout) if ran.ok else State(loaded=False)

    def require_installed(self) -> None:
        if not self.unit.exists():
            raise DepthwatchError(f"{systemd.UNIT} is not installed ({self.unit} is missing); run `depthwatch service install`")


# -- shared -------------------------------------------------------------------------------


def load_config(config_arg: str | None, *, check_model: bool) -> tuple[Path, Config]:
    """The config file a service will run with, loaded and checked now rather than in its log.

    A service needs a config file (the built-in defaults watch a folder
    relative to wherever it was started), so there must be one.
    """
    from depthwatch import catalogue, paths
    from depthwatch import config as configuration

    path = configuration.find(config_arg)
    if path is None:
        raise ConfigError(
            f"no config file for the service: pass -c CONFIG or create {paths.default_config_file()} "
            "(config.yaml in the repository documents every setting)"
        )
    config = configuration.load(path)
    if check_model:
        catalogue.resolve(config.model, config.base)
    return path, config


def report(*, service: str, definition: Path, config: Path | None, state: State, log: str) -> None:
    """`status`, in the same words for launchd and systemd."""
    rows: list[tuple[str, Any]] = [
        ("service", service),
        ("definition", f"{definition}" if definition.exists() else f"{definition} (not installed)"),
    ]
    if config is not None:
        rows.append(("config", config))
    rows.append(("loaded", "yes" if state.loaded else "no"))
    if state.loaded:
        running = f"yes, pid {state.pid}" if state.running else "no"
        rows.append(("running", f"{running} ({state.detail})" if state.detail else running))
        last = describe_exit(state.last_exit)
        if state.last_signal is not None and state.last_exit is None:
            last = f"killed by signal {state.last_signal}"
        rows.append(("last exit", last))
    rows.append(("log", log))
    rows.extend(status_file_rows(config, state))
    for name, value in rows:
        print(f"{name + ':':<13}{value}")


def status_file_rows(config_path: Path | None, state: State) -> list[tuple[str, str]]:
    """What the daemon itself last wrote to its status file (daemon.status_file)."""
    if config_path is None:
        return []
    from depthwatch import config as configuration
    from depthwatch.status import read_status

    try:
        config = configuration.load(config_path)
    except DepthwatchError as exc:
        return [("config", f"does not load: {exc}")]
    path = config.daemon.status_file
    if path is None:
        return [("status file", "none (set daemon.status_file in the config to have one)")]
    try:
        data = read_status(path)
    except FileNotFoundError:
        return [("status file", f"{path} (not written yet)")]
    except (OSError, ValueError) as exc:
        return [("status file", f"{path} (unreadable: {exc})")]
    counts = data.get("counts") or {}
    ago = max(0.0, time.time() - float(data.get("updated") or 0))
    stale = " (from an earlier run)" if state.running and state.pid is not None and data.get("pid") != state.pid else ""
    rows = [
        ("status file", f"{path}{stale}"),
        ("daemon", f"{data.get('state')}, pid {data.get('pid')}, updated {ago:.0f} s ago"),
        ("frames", f"{counts.get('done', 0)} done, {counts.get('failed', 0)} failed, {data.get('queue_depth', 0)} queued"),
    ]
    if data.get("model"):
        rows.append(("model", f"{data['model']} on {', '.join(data.get('providers') or []) or '?'}"))
    if counts.get("last_error"):
        rows.append(("last error", str(counts["last_error"])))
    return rows


def show_logs(files: Sequence[Path], lines: int, *, follow: bool, interval: float = 0.25) -> int:
    """The last `lines` of each log file that has anything in it, then (with `follow`) what is appended."""
    present = [f for f in files if f.is_file()]
    if not present:
        print(f"depthwatch: no log yet: {files[0]} does not exist; is the service installed?", file=sys.stderr)
        return 1
    # Measured once: the tail ends and the follow starts at the same byte, so no line is lost or shown twice.
    sizes = {f: f.stat().st_size for f in present}
    shown = [f for f in present if sizes[f] > 0] or present[:1]
    for i, path in enumerate(shown):
        if len(shown) > 1:
            print(f"{'' if i == 0 else chr(10)}==> {path} <==")
        for line in tail(path, lines, end=sizes[path]):
            print(line)
    sys.stdout.flush()
    if follow:
        _follow(sizes, interval)
    return 0


def tail(path: Path, lines: int, end: int | None = None) -> list[str]:
    """The last `lines` lines of a file (of its first `end` bytes), read from the end: logs grow without bound."""
    if lines <= 0:
        return []
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END) if end is None else end
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(64 * 1024, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


def _follow(offsets: dict[Path, int], interval: float) -> None:
    """Print what is appended to the files after `offsets` until interrupted; starts over on a file that shrank."""
    while True:
        for f in offsets:
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                continue
            if size < offsets[f]:
                offsets[f] = 0
            if size > offsets[f]:
                with open(f, "rb") as handle:
                    handle.seek(offsets[f])
                    chunk = handle.read(size - offsets[f])
                whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for its end
                offsets[f] += len(whole)
                sys.stdout.write(whole.decode("utf-8", errors="replace"))
                sys.stdout.flush()
        time.sleep(interval)


def _wait(probe: Callable[[], State], done: Callable[[State], bool], timeout: float) -> State:
    """Ask the supervisor again until `done`, or until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    state = probe()
    while not done(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = probe()
    return state


def _put_back(path: Path, previous: bytes | None) -> None:
    """Undo a failed install: the old definition back, or none, as it was found."""
    from depthwatch.writer import atomic_write

    if previous is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, previous)
