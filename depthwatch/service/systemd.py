"""The systemd user service: the `depthwatch service` verbs on its unit (`unitfile`), run with its tools (`systemctl`).

The Linux counterpart of `launchd`; `journalctl --user -u depthwatch.service`
is its log.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from depthwatch.errors import DepthwatchError
from depthwatch.service import logfiles
from depthwatch.service.manager import Manager
from depthwatch.service.supervision import Ran, State, describe_end, run
from depthwatch.service.systemctl import (
    ENVIRONMENT_D_GENERATORS,
    NO_ENTRIES,
    assignments,
    daemon_reload,
    disable,
    enable,
    journal,
    parse_show,
    restart_unit,
    show,
    start_unit,
    stop_unit,
    unreachable,
)
from depthwatch.service.undo import Undo
from depthwatch.service.unitfile import UNIT, config_of, render, unit_path, validate


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
                return assignments(ran.stdout, quoted=False) if ran.ok else {}
        ran = run(["systemctl", "--user", "show-environment"], check=False)
        return assignments(ran.stdout, quoted=True) if ran.ok else {}

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
        text = "".join(line for line in ran.stdout.splitlines(keepends=True) if line.strip() != NO_ENTRIES)
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
