"""Where compiled models live between starts, keyed by what they were compiled from.

onnxruntime's CoreML provider reuses whatever sits in its cache folder: its own
key is a key in the model's metadata or a hash of the model's *path*, never its
contents, and it does not notice an onnxruntime upgrade. A newer model fetched
under the same name would keep running the old compiled graph (or fail to
load). So depthwatch gives every (model contents, onnxruntime version, provider
options) its own folder, named by a hash of the three, and removes the folders
of models that are gone or have changed.

The model's sha256 costs a full read of the file (seconds for a large model),
so it is remembered in `digests.json` beside the cache, keyed by the file's
path, size, mtime_ns and inode: a file rewritten in place or replaced by a
rename changes at least one of them and is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthwatch.files import atomic_write, sha256_of

log = logging.getLogger("depthwatch.cache")

#: Compiled entries kept at most (most recently used first); a compiled model is
#: a few times the size of the ONNX file, so this bounds the folder's size.
MAX_ENTRIES = 6
#: Model digests remembered at most.
MAX_DIGESTS = 64
#: The marker each entry carries: what it was compiled from, and when it was last used.
MARKER = "depthwatch-entry.json"


def read_json(path: Path) -> dict[str, Any]:
    """The file's object, or {} if it is missing or damaged (it is only a cache)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: Any) -> None:
    """Atomically, so a reader (another depthwatch) never sees half a file; a failure is a warning."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError as exc:
        log.warning("could not write %s (%s); it will be computed again next time", path, exc.strerror or exc)


def _stat_key(stat: os.stat_result) -> dict[str, int]:
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def model_digest(path: Path, state_dir: Path) -> str:
    """The model file's sha256, from `digests.json` when the file is unchanged since it was hashed."""
    path = Path(os.path.abspath(path))
    index = state_dir / "digests.json"
    digests = read_json(index)
    stat = path.stat()
    known = digests.get(str(path))
    if (
        isinstance(known, dict)
        and {k: known.get(k) for k in ("size", "mtime_ns", "inode")} == _stat_key(stat)
        and isinstance(known.get("sha256"), str)
        and len(known["sha256"]) == 64
    ):
        return known["sha256"]  # a damaged entry (no digest, not a digest) is hashed again
    digest = sha256_of(path)
    digests[str(path)] = {**_stat_key(stat), "sha256": digest, "used": time.time()}
    if len(digests) > MAX_DIGESTS:
        for old in sorted(digests, key=lambda k: digests[k].get("used", 0))[: len(digests) - MAX_DIGESTS]:
            del digests[old]
    write_json(index, digests)
    return digest


def cache_key(digest: str, runtime_version: str, options: dict[str, Any]) -> str:
    """A folder name for this model's contents, this onnxruntime and these provider options."""
    text = json.dumps({"model": digest, "onnxruntime": runtime_version, "options": options}, sort_keys=True)
    return f"{digest[:12]}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class CompiledFolder:
    """One compiled model's folder, and whether it held a compiled model before this load."""

    path: Path
    existed: bool


def open_entry(root: Path, model: Path, digest: str, runtime_version: str, options: dict[str, Any]) -> CompiledFolder:
    """The folder to hand onnxruntime as its model cache; prunes stale entries first.

    Stale: an entry for the same model path under another key (the model
    changed, onnxruntime was upgraded, or the options differ), an entry whose
    model files are all gone, and the least recently used beyond MAX_ENTRIES.
    An entry names every model path that used it (two projects' copies of one
    model share it): one of them changed leaves it to the others (removed from
    under them, it would be made again by their next start, before `ready`).
    """
    model = Path(os.path.abspath(model))
    key = cache_key(digest, runtime_version, options)
    entry = root / key
    existed = entry.is_dir() and any(p.name != MARKER for p in entry.iterdir())
    entry.mkdir(parents=True, exist_ok=True)
    users = sorted(set(_users(read_json(entry / MARKER))) | {str(model)})
    write_json(
        entry / MARKER,
        {"model": str(model), "models": users, "sha256": digest, "onnxruntime": runtime_version, "options": options, "used": time.time()},
    )
    prune(root, keep=key, model=str(model))
    return CompiledFolder(entry, existed)


def _users(info: dict[str, Any]) -> list[str]:
    """The model paths an entry's marker names (one, before markers named them all)."""
    users = info.get("models")
    if isinstance(users, list):
        return [str(u) for u in users]
    return [str(info["model"])] if info.get("model") else []


def entries(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The entries under `root` that depthwatch made (only folders carrying its marker)."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        marker = child / MARKER
        if child.is_dir() and marker.is_file():
            found.append((child, read_json(marker)))
    return found


def prune(root: Path, keep: str, model: str | None = None) -> list[Path]:
    """Remove stale entries (see open_entry); `keep` is the entry in use now, by `model`. Returns what went."""
    found = entries(root)
    if model is None:
        model = next((info.get("model") for path, info in found if path.name == keep), None)
    doomed: list[Path] = []
    live: list[tuple[Path, dict[str, Any]]] = []
    for path, info in found:
        if path.name == keep:
            continue
        users = _users(info)
        others = [u for u in users if u != model and Path(u).is_file()]
        if not others:
            doomed.append(path)
            continue
        if len(others) != len(users):  # `model` (or a file gone) no longer uses it; the others still do
            write_json(path / MARKER, {**info, "model": others[-1], "models": others})
        live.append((path, info))
    live.sort(key=lambda item: item[1].get("used", 0), reverse=True)
    doomed += [path for path, _ in live[MAX_ENTRIES - 1 :]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed the stale cache entry %s/%s", root.name, path.name)
    return doomed
