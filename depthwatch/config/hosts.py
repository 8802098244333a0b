"""What the API's listening address reaches: an IP address or a name, this machine alone or others.

The config checks `api.host` with these as it is read (a host reachable from
other machines needs `api.token`), so the answer is known before any socket is
opened, by `depthwatch check` and a reload as much as by `run`. That is why they
live below the config rather than with the API server (`daemon/api.py`), which
is above it.
"""

from __future__ import annotations

import ipaddress


def is_ip(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 address (not a host name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether `host` only ever listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another host name may resolve to any address
