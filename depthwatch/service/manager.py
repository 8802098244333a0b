"""What every service manager does for `depthwatch service`, and what is written once for all of them.

A subclass (one per manager: `launchd.Launchd`, `systemd.Systemd`) says where
its definition goes and what is in it, and runs the verbs with the manager's
own tools. The rest is the same for every manager and lives here: the config
the service runs with (written from the documented default when the user has
none), print, install's undo, status and the not-installed guard.

`depthwatch service` is a short-lived command of its own, so the verbs talk
to the user directly: results on stdout, one-line problems as DepthwatchError.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from pathlib import Path

from depthwatch.errors import ConfigError, DepthwatchError
from depthwatch.service import config_file, report
from depthwatch.service.supervision import State
from depthwatch.service.undo import Undo

#: `status` exits with this when the service is not running (as `systemctl status` and LSB do).
EXIT_NOT_RUNNING = 3


class Manager(ABC):
    """One service manager's verbs on the depthwatch service."""

    #: The service's name to its manager: the plist's Label, the unit's name.
    label: str
    #: Where `install` writes the definition (the plist, the unit file).
    definition: Path

    # -- what each manager provides -------------------------------------------------------

    @abstractmethod
    def render(self, config: Path, *, shutdown_timeout_s: float) -> bytes:
        """The definition that runs `depthwatch run -c config`, as install writes it."""

    @abstractmethod
    def config_in(self, data: bytes) -> Path | None:
        """The config file an installed definition runs the daemon with; ValueError if it does not read."""

    @abstractmethod
    def display_name(self) -> str:
        """The service as status names it: its label and where the manager keeps it."""

    @abstractmethod
    def log_hint(self) -> str:
        """Where the log is, for status."""

    @abstractmethod
    def state(self) -> State:
        """What the manager says about the service now."""

    @abstractmethod
    def install_definition(self, data: bytes, undo: Undo) -> None:
        """Check `data`, write it to `definition`, load it and start it; every step recorded in `undo`."""

    @abstractmethod
    def uninstall(self) -> int: ...

    @abstractmethod
    def start(self) -> int: ...

    @abstractmethod
    def stop(self) -> int: ...

    @abstractmethod
    def restart(self) -> int: ...

    @abstractmethod
    def logs(self, lines: int, *, follow: bool) -> int: ...

    # -- the same for every manager -------------------------------------------------------

    def print_definition(self, config_arg: str | None) -> int:
        """The definition install would write, installing nothing (not even the default config)."""
        chosen = config_file.choose(config_arg, check_model=False)
        if chosen.new is not None:
            print(f"depthwatch: no config yet: install writes the documented default to {chosen.path}", file=sys.stderr)
        sys.stdout.write(self.render(chosen.path, shutdown_timeout_s=chosen.config.daemon.shutdown_timeout_s).decode())
        return 0

    def manager_environment(self, lasting: bool = True) -> dict[str, str]:
        """The variables the service manager hands every service, where it can say (none by default).

        `lasting`: those it hands at every start, a reboot's too; False: those it holds now.
        """
        return {}

    def install(self, config_arg: str | None) -> int:
        """Install with the config given or the user's; without one, write the documented default first.

        A failure at any step takes back every step before it: no definition,
        no folder and no config from this attempt is left behind.
        """
        chosen = config_file.choose(config_arg, check_model=True, manager_environment=self.manager_environment)
        with Undo() as undo:
            if chosen.new is not None:
                _write_new_config(chosen.path, chosen.new, undo)
            data = self.render(chosen.path, shutdown_timeout_s=chosen.config.daemon.shutdown_timeout_s)
            self.install_definition(data, undo)
        if chosen.new is not None:
            print(
                f"config: wrote the documented default to {chosen.path}; edit it (watch.folders, model.path) "
                "and run `depthwatch service install` again"
            )
        return 0

    def status(self) -> int:
        state = self.state()
        config = None
        if self.definition.exists():
            try:
                config = self.config_in(self.definition.read_bytes())
            except (OSError, ValueError) as exc:
                print(f"{self.definition} cannot be read: {exc}; run `depthwatch service install` again")
        table = report.rows(
            service=self.display_name(), definition=self.definition, config=config, state=state, log=self.log_hint()
        )
        sys.stdout.write(report.format_rows(table))
        return 0 if state.running else EXIT_NOT_RUNNING

    def require_installed(self) -> None:
        if not self.definition.exists():
            raise DepthwatchError(
                f"{self.label} is not installed ({self.definition} is missing); run `depthwatch service install`"
            )


def _write_new_config(path: Path, data: bytes, undo: Undo) -> None:
    """The user's first config, in a folder made for it if need be; never over anything already there."""
    try:
        undo.folder(path.parent)
        undo.create(path, data)
    except FileExistsError:
        raise ConfigError(f"{path} exists but is not a config file; fix or remove it, or pass -c CONFIG") from None
    except OSError as exc:
        raise DepthwatchError(f"cannot write the default config to {path}: {exc.strerror or exc}; pass -c CONFIG") from None
