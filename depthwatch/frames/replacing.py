"""Whether a file at an output's name may be replaced: asked through the folder's descriptor, right before the rename.

depthwatch replaces only what it wrote. A map is its own when it carries
depthwatch's record (`provenance`); a JSON file beside the maps (sidecar,
error record) when it carries `JSON_MARK`. Anything else at the name (a
user's master `shot.png` under `{stem}.png`, their `shot_depth.png.json`, a
folder, a link) stays, and the write is refused with the reason these checks
give. Each check looks at the name once, without following a link (`_held`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from depthwatch.files import kind_of
from depthwatch.frames import ownership

#: Asked right before the rename, with the folder's descriptor and the target's name:
#: why the file now at that name must not be replaced (None: it may be).
ReplaceCheck = Callable[[int, str], "str | None"]

#: depthwatch's JSON files beside the maps (sidecars, error records) carry this key: ours to replace.
JSON_MARK = "depthwatch"

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _held(folder_fd: int, name: str) -> os.stat_result | str | None:
    """What holds `name` in the open folder, its link not followed: None (nothing), or why it cannot be looked at."""
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc}); not replacing it"


def map_refusal(folder_fd: int, name: str) -> str | None:
    """Why the file named `name` in the open folder must not be replaced by a map (None: it may).

    Only a map depthwatch made (its record inside, read through the folder's
    own descriptor, right before the rename) is ever replaced: a user's file
    that happens to have a map's name (a master `shot.png` under the template
    `{stem}.png`, a photo called `x_depth.jpg`) is left as it is. A format
    that carries no record yet (see `provenance.read`) is never replaced either.
    """
    st = _held(folder_fd, name)
    if not isinstance(st, os.stat_result):
        return st
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink, not a depth map depthwatch made; not replacing it"
    kind = kind_of(st.st_mode)
    if kind is not None:
        return f"is {kind}, not a depth map depthwatch made; not replacing it"
    if not ownership.is_depth_map(Path(name), dir_fd=folder_fd):
        return "is not a depth map depthwatch made (it carries no depthwatch record); not replacing it"
    return None


def map_refusal_at(target: Path) -> str | None:
    """`map_refusal` for a path (`depthwatch once`, before anything is written)."""
    try:
        fd = os.open(target.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None  # no folder yet: nothing to replace
    try:
        return map_refusal(fd, target.name)
    finally:
        os.close(fd)


def json_refusal(legacy: frozenset[str]) -> ReplaceCheck:
    """A `ReplaceCheck` for depthwatch's JSON files: only one it wrote is replaced (or removed).

    Ours: a JSON object with the `JSON_MARK` key, or with exactly the keys
    `legacy` (what versions before the mark wrote). Anything else at the name
    (a user's `shot_depth.png.json`, a folder, a link) stays.
    """

    def refusal(folder_fd: int, name: str) -> str | None:
        st = _held(folder_fd, name)
        if not isinstance(st, os.stat_result):
            return st
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return "is not a file depthwatch wrote; not replacing it"
        try:
            fd = os.open(name, os.O_RDONLY | _CLOEXEC | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=folder_fd)
            with os.fdopen(fd, "rb") as f:
                data = json.loads(f.read(1 << 20))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and (JSON_MARK in data or set(data) == legacy):
            return None
        return "is not a file depthwatch wrote; not replacing it"

    return refusal
