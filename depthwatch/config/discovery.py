"""Which config file is used: -c, then $DEPTHWATCH_CONFIG, then the user's folder, then ./config.yaml.

A place that cannot be searched, or that holds something other than a file
(a FIFO, a device, a dangling link), stops the search with a one-line error
rather than falling through to the next one, which would quietly run another
config than the one the user wrote.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from depthwatch import paths
from depthwatch.errors import ConfigError
from depthwatch.files import why_not_a_file

ENV_VAR = "DEPTHWATCH_CONFIG"

#: The config file `find(here=True)` takes from the current folder.
LOCAL_FILE = "config.yaml"


def find(explicit: str | os.PathLike[str] | None = None, platform: str | None = None, *, here: bool = False) -> Path | None:
    """The config file to use: -c PATH, then $DEPTHWATCH_CONFIG, then the user's folder,
    then (with `here`) `config.yaml` in the current folder; None: built-in defaults.

    `here` is for commands run by hand (run, once, check, status, models): started
    from a checkout, they use the documented config.yaml there, and the start-up
    line says which file it was. A service always gets an absolute -c.
    """
    if explicit:
        path = Path(os.path.expanduser(str(explicit)))
        if not _is_file(path, "-c CONFIG"):
            raise ConfigError(f"config file {path} {why_not_a_file(path)}; check the -c path")
        return Path(os.path.abspath(path))  # the path given: a symlink relinked is seen
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(os.path.expanduser(env))
        if not _is_file(path, f"${ENV_VAR}"):
            raise ConfigError(f"${ENV_VAR} names {path}, which {why_not_a_file(path)}; fix or unset it")
        return Path(os.path.abspath(path))  # the path given: a symlink relinked is seen
    user = paths.default_config_file(platform)
    if _is_file(user, "-c CONFIG"):
        return user
    _refuse_what_is_there(user)
    if not here:
        return None
    local = Path.cwd() / LOCAL_FILE
    if _is_file(local, "-c CONFIG"):
        return local.resolve()
    _refuse_what_is_there(local)
    return None


def _refuse_what_is_there(path: Path) -> None:
    """ConfigError if something other than a file sits where a config is looked for."""
    if os.path.lexists(path):
        raise ConfigError(f"{path} exists but is not a config file: it {why_not_a_file(path)}; fix or remove it, or pass -c CONFIG")


def _is_file(path: Path, instead: str) -> bool:
    """Whether `path` is a file; ConfigError (exit 78) when a folder on its way cannot be searched.

    Such a folder may hide the user's config: going on with the next place, or
    the built-in defaults, would run another config than the one they wrote.
    """
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except PermissionError:
        folder = _unsearchable(path)
        raise ConfigError(
            f"cannot look for the config file {path}: permission denied on the folder {folder}; "
            f"give yourself access to it (chmod u+rx {shlex.quote(str(folder))}) or name a config with {instead}"
        ) from None
    except (OSError, ValueError):
        return False


def _unsearchable(path: Path) -> Path:
    """The folder on the way to `path` that this user cannot search (the deepest one that can be looked at)."""
    folder = Path(os.path.abspath(path)).parent
    for above in (*reversed(folder.parents), folder):
        try:
            os.stat(above)
        except PermissionError:
            return above.parent
        except OSError:
            break
    return folder
