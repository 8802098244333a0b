"""The HTTP API started where `api.host` and `api.port` say, once the daemon is ready.

Apart from the server (`apiserver`), which imports waitress, an extra: the
daemon imports the server only here, when the API is asked for, and each way
it cannot listen (the extra missing, an address not this machine's, a port
taken) is one line with what to do (exit 78), not a traceback.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TYPE_CHECKING

from depthwatch.daemon.listening import address_problem
from depthwatch.errors import ConfigError

if TYPE_CHECKING:
    from depthwatch.config import ApiConfig
    from depthwatch.daemon.apiserver import ApiServer
    from depthwatch.daemon.backend import ApiBackend


def start_api(backend: ApiBackend, config: ApiConfig, beat: Callable[[], None]) -> ApiServer:
    """The HTTP listener started where `config` says; ConfigError (one line, what to do) where it cannot be.

    The server is imported only here, once the API is asked for: waitress is an extra.
    """
    try:
        from depthwatch.daemon.apiserver import ApiServer
    except ImportError as exc:
        raise ConfigError(
            f"api.enabled needs the api extra ({exc.name} is missing); run: pip install 'depthwatch[api]'"
        ) from None
    problem = address_problem(config.host)
    if problem:
        raise ConfigError(problem)
    api = ApiServer(backend, config, beat=beat)
    try:
        api.start()
    except (OSError, ValueError) as exc:
        where = f"{config.host}:{config.port}"
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"cannot listen on {where}: {exc.strerror}; stop whatever uses that port (the old server?) or change api.port"
            ) from None
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        raise ConfigError(f"cannot listen on {where}: {reason}; check api.host and api.port") from None
    return api
