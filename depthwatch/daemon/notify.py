"""The service manager's readiness protocol (systemd's sd_notify): READY=1, STOPPING=1, WATCHDOG=1.

With `Type=notify` systemd holds `systemctl start` until the daemon says it is
ready, so a model that fails to load fails the start itself instead of a
"started" followed by an exit in the journal. The protocol is one datagram
of `KEY=value` lines to the AF_UNIX socket named in $NOTIFY_SOCKET (a leading
`@` means Linux's abstract namespace); without the variable (launchd, a
terminal) there is nobody to tell and nothing is sent. A few lines of socket
code, so no dependency and nothing forked.

With `WatchdogSec=` in the unit, systemd sets $WATCHDOG_USEC and restarts a
daemon that has not sent WATCHDOG=1 within it: the main loop sends it while
the supervisor finds the daemon able to serve (see `supervisor`), so a daemon
that stops answering is restarted even if it cannot exit.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("depthwatch")


def watchdog_interval(environ: dict[str, str] | None = None) -> float | None:
    """Seconds within which systemd wants WATCHDOG=1 (from $WATCHDOG_USEC), or None when it wants none.

    $WATCHDOG_PID, when set, names the process meant: another's (a child given
    the environment) is not ours to answer for.
    """
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6


def notify(*fields: str, environ: dict[str, str] | None = None) -> bool:
    """Send `fields` ("READY=1", "STATUS=...") to the service manager; False if there is none.

    Never raises: a manager that went away must not take the daemon with it.
    """
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address or not (address.startswith("/") or address.startswith("@")):
        return False  # unset, or a kind of socket (vsock) a user service is never given
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = "\n".join(fields).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as exc:
        log.warning("could not tell the service manager %s: %s", fields[0], exc.strerror or exc)
        return False
    return True
