"""The render farm: depthwatch on Dask distributed, one long-lived session per worker.

`worker` is the worker process (the model loaded once, on the engine's
inference thread, frames through the daemon's `Pipeline`); `tasks` is what the
scheduler runs there (a few frames per task, paths not pixels); `client` is
`depthwatch once --farm`'s side. Only these modules import `distributed`; the
daemon and local `once` never do.
"""

from __future__ import annotations

from depthwatch.errors import FarmError


def require_distributed() -> None:
    """One line saying how to install the extra, instead of an ImportError's traceback."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise FarmError(
            "the render farm needs Dask distributed; install it with: pip install 'depthwatch[farm]'"
        ) from None
