"""Prefix rewrites between two views of the same shared storage (`farm.path_map`).

A Mac mounts the shots at /Volumes/Shots, the Linux nodes at /mnt/shots: the
client names frames and outputs in its own view, the workers open them in
theirs. Prefixes match whole path components (`/Volumes/Shots` never matches
`/Volumes/ShotsOld`), and the longest matching prefix wins.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath


@dataclass(frozen=True)
class PathMap:
    """(client prefix, worker prefix) pairs, longest client prefix first."""

    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str]) -> PathMap:
        """ValueError (one sentence) for anything that is not absolute prefix -> absolute prefix."""
        pairs = []
        for client, worker in mapping.items():
            for side in (client, worker):
                if not isinstance(side, str) or not side.startswith("/"):
                    raise ValueError(f"maps absolute path prefixes to absolute path prefixes, not {side!r}")
            pairs.append((_clean(client), _clean(worker)))
        clients = [c for c, _ in pairs]
        if len(set(clients)) != len(clients):
            raise ValueError("names the same client prefix twice")
        return cls(tuple(sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)))

    def to_worker(self, path: PurePath | str) -> str:
        """`path` (absolute, the client's view) as the workers see it; unchanged if no prefix matches."""
        text = str(path)
        for client, worker in self.pairs:
            if text == client:
                return worker
            if text.startswith(client.rstrip("/") + "/"):
                return worker.rstrip("/") + "/" + text[len(client.rstrip("/")) + 1 :]
        return text

    def as_dict(self) -> dict[str, str]:
        return dict(self.pairs)

    def __bool__(self) -> bool:
        return bool(self.pairs)


def _clean(prefix: str) -> str:
    cleaned = posixpath.normpath(prefix)
    return "/" if cleaned in ("/", "//") else str(PurePosixPath(cleaned))
