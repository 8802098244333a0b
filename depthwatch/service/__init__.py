"""Handing the daemon to the system's service manager: launchd on macOS, systemd on Linux.

`manager.Manager` is what `depthwatch service` drives; `launchd` and `systemd`
each hold one manager's verbs (systemd's unit file is `unitfile`, its tools'
command lines `systemctl`), `supervision` what both tell their manager about
the daemon and how they run its tools.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from depthwatch.service.manager import Manager

#: The managers `depthwatch service --manager` knows.
NAMES = ("launchd", "systemd")


def default_name() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def manager_for(name: str | None = None) -> Manager:
    """The named service manager (default: this platform's) for the current user."""
    name = name or default_name()
    if name == "launchd":
        from depthwatch.service.launchd import Launchd

        return Launchd(Path.home(), os.getuid())
    if name == "systemd":
        from depthwatch.service.systemd import Systemd

        return Systemd(Path.home(), os.environ)
    raise ValueError(f"unknown service manager {name!r}; known: {', '.join(NAMES)}")
