"""Per-user folders, in the places each platform's users expect them.

macOS: ~/Library/Application Support/depthwatch (config, models),
~/Library/Caches/depthwatch, ~/Library/Logs/depthwatch.
Linux: $XDG_CONFIG_HOME, $XDG_DATA_HOME, $XDG_CACHE_HOME and $XDG_STATE_HOME
(each under depthwatch/).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import platformdirs

APP = "depthwatch"


def _dirs(platform: str | None = None) -> platformdirs.PlatformDirs:
    platform = platform or sys.platform
    if platform == "darwin":
        from platformdirs.macos import MacOS

        return MacOS(APP, appauthor=False)
    if platform.startswith("linux"):
        from platformdirs.unix import Unix

        return Unix(APP, appauthor=False)
    return platformdirs.PlatformDirs(APP, appauthor=False)


def config_dir(platform: str | None = None) -> Path:
    return Path(_dirs(platform).user_config_dir)


def default_config_file(platform: str | None = None) -> Path:
    return config_dir(platform) / "config.yaml"


def models_dir(platform: str | None = None) -> Path:
    return Path(_dirs(platform).user_data_dir) / "models"


def cache_dir(platform: str | None = None) -> Path:
    return Path(_dirs(platform).user_cache_dir)


def state_dir(platform: str | None = None) -> Path:
    return Path(_dirs(platform).user_state_dir)


def log_dir(platform: str | None = None) -> Path:
    """platformdirs' user log folder: ~/Library/Logs/depthwatch (where Console.app looks),
    $XDG_STATE_HOME/depthwatch/log on Linux."""
    return Path(_dirs(platform).user_log_dir)


def expand_path(value: str, base: Path) -> Path:
    """~ and $VARS expanded; relative paths taken from the config file's folder.

    launchd starts processes in /, so a path relative to the working directory
    would mean something different under launchd than in a terminal.
    """
    path = Path(os.path.expandvars(os.path.expanduser(value)))
    return Path(os.path.abspath(path if path.is_absolute() else base / path))


def unset_variables(value: str) -> list[str]:
    """The `$NAME` and `${NAME}` in `value` that are not set (`os.path.expandvars` leaves them as written).

    Why: a folder under `$SHOTS` works from a terminal, while a service (launchd,
    systemd) starts without the shell's variables: the daemon would then watch a
    new, empty folder named `$SHOTS`, and say all is well.
    """
    names = (m.group(1) or m.group(2) for m in re.finditer(r"\$(?:(\w+)|\{([^}]*)\})", value))
    return list(dict.fromkeys(name for name in names if name not in os.environ))
