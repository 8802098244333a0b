"""The config file a service runs with: the one named, the user's, or the documented default written for it.

A service needs a config file (the built-in defaults watch a folder relative to
wherever the daemon was started). Someone who has not written one yet gets the
repository's `config.yaml`, which documents every setting, as their user
config: the package reads it through the `depthwatch/default_config.yaml`
symlink, which a wheel build turns into a real file, so an installed
depthwatch has it too. An existing user config is never replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from depthwatch import config as configuration
from depthwatch import paths
from depthwatch.config import Config
from depthwatch.errors import ConfigError, ModelError
from depthwatch.logtext import shown
from depthwatch.model import catalogue
from depthwatch.service import supervision


def _nameable(path: Path) -> None:
    """ConfigError unless a service definition can name `path`: no control character (a plist cannot
    hold one, a unit line ends at a newline) and no backslash (a unit line's continuation)."""
    text = os.path.abspath(path)
    odd = next((c for c in text if ord(c) < 32 or ord(c) == 127 or c == "\\"), None)
    if odd is not None:
        raise ConfigError(
            f"{shown(text)}: its path holds {'a backslash' if odd == chr(92) else 'a control character'}, which a "
            "launchd plist or a systemd unit cannot name; move the config to a folder whose path has none"
        )


def _as_the_service_reads_it(path: Path, base: Path, manager_environment: Callable[..., Mapping[str, str]] | None) -> None:
    """The config and its model found with only the variables a service gets; ConfigError or ModelError if not.

    What the service manager hands every service at each start (systemd's
    environment.d) is asked only when the bare minimum is not enough: one more
    call to it otherwise. A variable it holds now only (`systemctl --user
    set-environment`, a login session's) is refused too, with where to put it
    so that a reboot keeps it.
    """

    def read(extra: Mapping[str, str] | None = None) -> None:
        with supervision.as_the_service_sees_it(extra):
            catalogue.resolve(configuration.load(path).model, base)

    try:
        read()
        return
    except (ConfigError, ModelError):
        if manager_environment is None:
            raise
    lasting = manager_environment()
    try:
        read(lasting)
    except (ConfigError, ModelError) as exc:
        now = manager_environment(lasting=False)
        if not now or now == lasting:
            raise
        try:
            read(now)
        except (ConfigError, ModelError):
            raise exc from None
        raise type(exc)(
            f"{exc}; the user manager has it now (`systemctl --user set-environment`, or the login session), but a "
            "reboot starts the service without it: set it in ~/.config/environment.d/depthwatch.conf (NAME=value)"
        ) from None


def documented_default() -> Path:
    """The default config shipped with depthwatch (config.yaml in the repository)."""
    return Path(__file__).parent.parent / "default_config.yaml"


@dataclass(frozen=True)
class ServiceConfig:
    """The config a service will run with, loaded and checked now rather than in its log."""

    path: Path
    config: Config
    #: The documented default's bytes, still to be written to `path` (the user has no config yet); None: it exists.
    new: bytes | None = None


def choose(
    config_arg: str | None, *, check_model: bool, manager_environment: Callable[[], Mapping[str, str]] | None = None
) -> ServiceConfig:
    """-c CONFIG, $DEPTHWATCH_CONFIG or the user's config; failing those, the documented default for the user's.

    With `check_model`, a model the daemon could not find is refused now, with
    a hint when it is the default config that names it.
    """
    path = configuration.find(config_arg)
    if path is not None:
        _nameable(path)
    new = None
    if path is not None:
        config = configuration.load(path)
    else:
        # Checked where it is shipped: its paths are relative to the file, so they mean the
        # same from the user's config folder once it is written there (which install does).
        path = paths.default_config_file()
        new = documented_default().read_bytes()
        config = configuration.parse(new.decode("utf-8"), documented_default())
    if check_model:
        try:
            catalogue.resolve(config.model, config.base)
        except ModelError as exc:
            if new is None:
                raise
            raise ModelError(
                f"{exc} (the default config install would write to {path} names it; offline, put the model file "
                "where the README says, or write a config whose model.path is an .onnx file you have and pass -c CONFIG)"
            ) from None
        if new is None:  # read again as the daemon will read it: without the shell's variables
            _as_the_service_reads_it(path, config.base, manager_environment)
    return ServiceConfig(path, config, new)
