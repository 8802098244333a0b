"""The watch folders' watches and their health: each folder scheduled on the observer, and watched again when it comes back.

A watch folder can vanish (a volume unmounted, the folder deleted and made
again, replaced by another of the same name): its watch is then dead even if
a folder of that name, and maybe that inode number, is back. Once a second
the settle thread looks (`check_health`): a dead observer is replaced, a
folder gone or replaced is watched again once it is there, and scanned for
the frames it brought. A watch folder that is (or lies under) a symlink is
watched through its real folder, and its events' paths are put back under
the watch folder (`as_watched`). Under a recursive inotify watch, the folders
the kernel does not watch (its limit on watches reached) are found from its
own list (`coverage`), said once, and scanned every few seconds instead, until
the limit lets the whole tree be watched (`_watch_whole`): no restart needed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEventHandler

from depthwatch.config import WatchConfig
from depthwatch.daemon import coverage
from depthwatch.daemon.observer import TRUSTED_EVENTS, start_observer, trusts_close_events
from depthwatch.frames.rules import Rules
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch.watch")

#: How often, at most, a recursive inotify watch's folders are checked against the kernel's
#: list of watches (after a folder came, or while some are not watched), and how often the
#: folders it does not watch are scanned for frames instead.
COVERAGE_S = 5.0


class WatchFolders:
    """The observer and one watch per watch folder (settle thread; `as_watched` and `lost` from watchdog's)."""

    def __init__(
        self, rules: Rules, config: WatchConfig, handler: FileSystemEventHandler, scan_later: Callable[..., None]
    ) -> None:
        self.rules = rules
        self.config = config
        self._handler = handler
        self._scan_later = scan_later
        self._observer: Any = None
        self._watches: dict[Path, tuple[Any, tuple[int, int]]] = {}
        #: Watch folders that are (or lie under) a symlink -> the folder watched for them: the
        #: observer watches a link itself, not its folder, so it is given the real one, and
        #: its events' paths are put back under the watch folder (see `as_watched`).
        self._real: dict[Path, Path] = {}
        #: Watch folders whose own deletion was reported: their watch is dead even if a
        #: folder of the same name, and maybe the same inode number, is back.
        self._lost: set[Path] = set()
        #: Whether the observer's close and move events say a file is complete (inotify).
        self.trust_close = False
        #: Recursive watch folders -> the folders under them that inotify does not watch, seen
        #: so at two looks in a row (one watchdog is adding now is not a gap): scanned instead.
        self.unwatched: dict[Path, list[Path]] = {}
        #: The folders not watched at the last look, and whether a folder came since.
        self._suspects: dict[Path, set[Path]] = {}
        self._folders_came = True
        self._next_look = 0.0
        #: Watch folders the observer refused, and why: said once, not at every retry.
        self._refused: dict[Path, str] = {}
        #: Watch folders refused for the inotify watch limit -> when they are scanned next: not
        #: gone, so their frames are found by a scan until a watch can be had.
        self._over_limit: dict[Path, float] = {}
        #: Recursive watch folders the limit left watched in part -> the limit's value then: a
        #: recursive watch is tried again when it is raised.
        self._partial: dict[Path, int | None] = {}

    def start(self) -> None:
        self._new_observer()
        for root in self.rules.roots:
            self._watch(root)

    def stop(self, timeout: float | None = None) -> None:
        observer, self._observer = self._observer, None
        self._watches.clear()
        self._real.clear()
        self.unwatched.clear()
        self._suspects.clear()
        self._over_limit.clear()
        self._partial.clear()
        self._folders_came = True
        if observer is not None:
            observer.stop()
            observer.join(timeout)

    def _new_observer(self) -> None:
        self._observer = start_observer(self.config)
        self.trust_close = trusts_close_events(self._observer)

    def _watch(self, root: Path) -> bool:
        """Start watching `root`; False (and a warning) if it is not there."""
        if not root.is_dir():
            log.warning("watch folder %s does not exist; waiting for it to appear", shown(root))
            return False
        real = Path(os.path.realpath(root))
        self._real.pop(root, None)
        if real != root:
            self._real[root] = real  # before the first event can come
        how = " (recursive)" if self.rules.recursive else ""
        try:
            watch = self._schedule(real, self.rules.recursive)
        except OSError as exc:
            watch = self._watch_top_only(real, exc)
            if watch is None:
                self._refused_now(root, exc)
                return False
            how = (
                f" (recursive, but only this folder is watched: {_refusal(exc)}; "
                f"the folders under it are scanned every {COVERAGE_S:.0f} s until the limit is raised)"
            )
            self._partial[root] = _limit()[1]
        else:
            self._partial.pop(root, None)
        self._refused.pop(root, None)
        if self._over_limit.pop(root, None) is not None:
            self.unwatched.pop(root, None)
        st = root.stat()
        self._watches[root] = (watch, (st.st_dev, st.st_ino))
        self._lost.discard(root)
        self._folders_came = True
        log.info(
            "watching %s%s for %s%s", shown(root), f" (a link to {shown(real)})" if real != root else "",
            ", ".join(self.rules.patterns), how,
        )
        return True

    def _refused_now(self, root: Path, exc: OSError) -> None:
        """Say why `root` cannot be watched, once; at the inotify limit, scan it until it can be."""
        reason = _refusal(exc)
        over = exc.errno == errno.ENOSPC
        if self._refused.get(root) != reason:  # the retry every second is silent
            then = (
                f"frames in it are found by a scan every {COVERAGE_S:.0f} s until it can be; raise the limit "
                f"(sudo sysctl {_limit()[0]}=524288) or set watch.observer: polling" if over else "will retry"
            )
            log.warning("cannot watch %s (%s); %s", shown(root), reason, then)
        self._refused[root] = reason
        if over and root not in self._over_limit:
            self._over_limit[root] = 0.0
            self.unwatched[root] = [root]

    def _watch_top_only(self, real: Path, exc: OSError) -> Any:
        """A recursive watch the kernel's watch limit cut short: watch the folder itself, scan the rest.

        watchdog adds a recursive watch folder by folder and gives the whole watch up at the
        first folder over the limit, so a tree with more folders than the limit allows would
        never be watched at all (a warning every second, no frame ever mapped). Its own folder
        takes one watch; the folders under it are then found unwatched and scanned
        (`_check_coverage`), and said once.
        """
        if not (self.rules.recursive and exc.errno == errno.ENOSPC):
            return None
        try:
            return self._schedule(real, False)
        except OSError:
            return None

    @property
    def waiting_for(self) -> list[Path]:
        """The watch folders not watched now (missing, gone, replaced and not back yet): no frame comes from them."""
        return [root for root in self.rules.roots if root not in self._watches and root not in self._over_limit]

    def as_watched(self, raw: str | bytes) -> Path:
        """An event's path, under the watch folder it was seen through (a link's folder is watched as itself)."""
        path = Path(os.fsdecode(raw))
        for root, real in tuple(self._real.items()):  # a copy: the settle thread may watch a folder again meanwhile
            if path.is_relative_to(real):
                return root / path.relative_to(real)
        return path

    def folder_came(self) -> None:
        """A folder was made or moved into a watch (watchdog's thread): whether inotify watches it is looked at soon."""
        self._folders_came = True

    def lost(self, folder: Path) -> None:
        """A folder's deletion was reported (watchdog's thread): if it is a watch folder, its watch is dead."""
        if folder in self._watches:
            self._lost.add(folder)  # the health check watches it again once it is back

    def check_health(self) -> None:
        """Replace a dead observer; watch a watch folder again that vanished or was replaced and is back."""
        observer = self._observer
        if observer is None or not observer.is_alive():
            log.warning("the file watcher stopped; restarting it")
            self.stop(1.0)
            self._new_observer()
        for root in self.rules.roots:
            current = self._watches.get(root)
            try:
                st = root.stat()
                ino = (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
            except OSError:
                ino = None
            if current is not None and current[1] == ino and root not in self._lost:
                continue
            if current is not None:
                log.warning("watch folder %s disappeared or was replaced; watching it again when it is back", shown(root))
                self._unschedule(current[0])
                del self._watches[root]
                self._real.pop(root, None)
                self._partial.pop(root, None)
            if ino is not None and self._watch(root):
                self._scan_later(root)
            elif root in self._over_limit:
                self._scan_over_limit(root, present=ino is not None)
        self._watch_whole()
        self._check_coverage()

    def _watch_whole(self) -> None:
        """Watch a recursive watch folder whole that the inotify limit left watched in part, once the limit allows.

        Tried when the limit's value rises (what the warning asks for), not on a timer:
        a try takes every watch the limit has left while it walks the tree, and another
        program of the user's asking for one meanwhile would be refused. One whose
        folder alone is watched (the limit refused the recursive watch) gets a recursive
        watch beside it (watchdog gives a refused one's watches back), which then
        replaces the single-folder watch with no moment unwatched. One watched whole but
        for the folders made after the limit was reached is watched anew. Either way the
        folder is scanned once after, for what came while its folders were not watched.
        """
        if not self._partial:
            return
        value = _limit()[1]
        for root, then in tuple(self._partial.items()):
            current = self._watches.get(root)
            if current is None or value is None or (then is not None and value <= then):
                continue
            self._partial[root] = value
            if current[0].is_recursive:  # watched anew: its watch holds watches the new one needs
                self._unschedule(current[0])
                del self._watches[root]
                if self._watch(root):
                    self._scan_later(root)
                continue
            try:
                whole = self._schedule(self._real.get(root, root), True)
            except OSError:
                continue  # still over the limit: said once already
            self._unschedule(current[0])
            self._watches[root] = (whole, current[1])
            del self._partial[root]
            self._folders_came = True
            log.info("watching %s whole now: the limit on inotify watches allows it", shown(root))
            self._scan_later(root)

    def _schedule(self, folder: Path, recursive: bool) -> Any:
        wanted = TRUSTED_EVENTS if self.trust_close else None  # polling settles files by every change
        return self._observer.schedule(self._handler, str(folder), recursive=recursive, event_filter=wanted)

    def _unschedule(self, watch: Any) -> None:
        try:
            self._observer.unschedule(watch)
        except Exception:  # the emitter may already be gone with its folder
            pass

    def _scan_over_limit(self, root: Path, present: bool) -> None:
        """A watch folder the inotify limit keeps unwatched: scanned every few seconds while it is there."""
        if not present:  # gone meanwhile: waited for like any folder that went
            del self._over_limit[root]
            self.unwatched.pop(root, None)
            self._refused.pop(root, None)
            return
        now = time.monotonic()
        if now >= self._over_limit[root]:
            self._over_limit[root] = now + COVERAGE_S
            self._scan_later(root, quiet=True)

    def _check_coverage(self) -> None:
        """Find the folders a recursive inotify watch misses (the kernel's watch limit), say so once, scan them."""
        if not (self.trust_close and self.rules.recursive):  # only inotify watches folder by folder
            return
        now = time.monotonic()
        if now < self._next_look or not (self._folders_came or self._suspects):
            return
        self._folders_came = False
        self._next_look = now + COVERAGE_S
        watched = coverage.watched_folders()
        if watched is None:  # no /proc to ask
            return
        for root in tuple(self._watches):
            real = self._real.get(root, root)
            missing = {root / folder.relative_to(real) for folder in coverage.unwatched(real, watched)}
            lasting = sorted(missing & self._suspects.get(root, set()))
            self._suspects[root] = missing
            if not missing:
                self._suspects.pop(root)
            for folder in coverage.topmost(sorted(missing)):
                self._scan_later(folder, quiet=True)
            if lasting and root not in self.unwatched:
                log.warning("%s", _limit_reached(root, len(lasting)))
            elif not lasting and root in self.unwatched:
                log.info("every folder under %s is watched again", shown(root))
            if lasting:
                self.unwatched[root] = lasting
                if root not in self._partial:  # the limit's value when it first fell short, read once
                    self._partial[root] = _limit()[1]
            else:
                self.unwatched.pop(root, None)
                if self._watches[root][0].is_recursive:
                    self._partial.pop(root, None)


def _limit() -> tuple[str, int | None]:
    """The inotify watch limit that applies here: its name and value (None where it cannot be read)."""
    return coverage.watch_limit() or ("fs.inotify.max_user_watches", None)


def _refusal(exc: OSError) -> str:
    """Why the observer refused a folder, in words: inotify's ENOSPC is its watch limit, not a full disk."""
    if exc.errno == errno.ENOSPC:
        name, value = _limit()
        return f"the system's limit on inotify watches is reached ({name}{f' = {value}' if value is not None else ''})"
    return exc.strerror or str(exc)


def _limit_reached(root: Path, count: int) -> str:
    """The one line that says a watch folder is watched only in part, and what to do."""
    name, value = _limit()
    now = f" ({name} = {value}, shared by every program of this user)" if value is not None else ""
    return (
        f"{count} folder(s) under {shown(root)} are not watched: the system's limit on inotify watches is reached{now}; "
        f"frames in them are found by a scan every {COVERAGE_S:.0f} s instead. Raise it (sudo sysctl {name}=524288) "
        "and they are watched, no restart needed; or set watch.observer: polling"
    )
