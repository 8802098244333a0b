"""Whether the HTTP API can listen where `api.host` says, asked before it tries.

Why apart from the server: `depthwatch check` asks too, without the api extra's
waitress, so a host that does not resolve (waitress raises a bare ValueError:
a traceback and exit 1, restarted in a loop by the service manager) or an
address that is not this machine's is one line before the daemon ever starts.
"""

from __future__ import annotations

import socket


def bind_host(host: str) -> str:
    """The address to bind for `api.host`: `localhost` is the IPv4 loopback (the classic plugins' 127.0.0.1)."""
    return "127.0.0.1" if host.lower() == "localhost" else host


def address_problem(host: str) -> str | None:
    """Why nothing can listen on `host` here (one line, with what to do), or None."""
    host = bind_host(host)
    try:
        found = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return f"api.host {host!r} is neither an address nor a name this machine can resolve ({reason}); use 127.0.0.1 for this machine only"
    last: OSError | None = None
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0, *address[2:]))  # any free port: the address alone is asked
            return None
        except OSError as exc:
            last = exc
    reason = (last.strerror if last is not None else None) or "no address to bind"
    return (
        f"api.host {host!r} is not an address of this machine ({reason}); use 127.0.0.1 (this machine only), "
        "0.0.0.0 (every network) or one of this machine's own addresses"
    )

