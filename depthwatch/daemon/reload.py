"""The live config reload: when to read the config again, and how a valid one is applied to the running daemon.

SIGHUP asks for it; so does the config file, once it has changed and then
stopped changing (an editor may still be writing). A config that does not
load leaves the last good one in force, with the reason in the status. A
valid one applies the watch and output settings to the next frame, swaps the
model in on the inference thread if another one is named (or its file
changed), and keeps the settings that take effect only at the next start.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from depthwatch.config import Config, ModelConfig
from depthwatch.daemon.locks import FolderLocks
from depthwatch.daemon.reporting import StatusReport
from depthwatch.daemon.status import path_for
from depthwatch.errors import ConfigError, DepthwatchError
from depthwatch.frames.rules import Rules
from depthwatch.frames.settings import Settings
from depthwatch.logtext import shown
from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.model import catalogue
from depthwatch.model.engine import Engine
from depthwatch.model.spec import ModelInfo

log = logging.getLogger("depthwatch")

#: The output settings `Rules` is made from (besides the watch section): a change to any of
#: them makes new Rules, or a frame or clip would still get yesterday's name or format.
_RULES_OUTPUT = ("template", "clip_template", "png_bits", "error_sidecar")


def _stamp_of(path: Path) -> tuple[int, ...] | None:
    """The config file as given and what it leads to: relinking a symlink, or replacing
    the link or its target, changes one of the two. (A frame's version is its `signature`.)"""
    try:
        link, st = os.lstat(path), os.stat(path)
    except OSError:
        return None
    return link.st_ino, link.st_mtime_ns, link.st_ctime_ns, st.st_ino, st.st_mtime_ns, st.st_size


def make_watch_folders(roots: Iterable[Path]) -> None:
    """Make each watch folder whose parent is there (a folder on a volume not mounted yet is
    waited for instead); ConfigError, one line, for one that cannot be made."""
    for root in roots:
        if root.exists() or not root.parent.is_dir():
            continue
        try:
            root.mkdir()
        except FileExistsError:
            pass  # made meanwhile, or a dangling link: the watcher says which
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            raise ConfigError(
                f"cannot make the watch folder {shown(root)}: {reason}; make it yourself or fix the permissions of {shown(root.parent)}"
            ) from None


def _rules_of(config: Config) -> tuple[object, ...]:
    """What `Rules(config.watch, config.output)` depends on."""
    return (config.watch, *(getattr(config.output, name) for name in _RULES_OUTPUT))


def _model_file_key(model: ModelConfig, base: Path) -> tuple[object, ...] | None:
    """The model file a section names, as it is on disk now: path, device, inode, size, mtime.

    A model fixed in place, or fetched again, has another key, so a reload
    loads it again even if the config text did not change. None: no such file.
    """
    try:
        path = catalogue.configured_file(model, base)
        st = os.stat(path)
    except (OSError, DepthwatchError):
        return None
    return str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class ConfigReload:
    """The daemon's config reloads (main thread; `ask` from any thread).

    `loader` reads the config again; without one the daemon keeps the config it was given.
    It is given the `config` in force, and what a valid one is applied to: the
    `engine` (a model swap), the `report`, the folder `locks`, the `queue` (its
    bound), `rewatch` (the watch folders and rules, bounded: it never holds the
    main loop) and `adopt` (the config and settings the next frame reads).
    """

    def __init__(
        self,
        loader: Callable[[], Config] | None,
        *,
        config: Callable[[], Config],
        engine: Callable[[], Engine | None],
        report: StatusReport,
        locks: FolderLocks,
        queue: LatestWinsQueue,
        rewatch: Callable[[Rules, Config], None],
        adopt: Callable[[Config, Settings], None],
    ) -> None:
        self._loader = loader
        self._config = config
        self._engine = engine
        self._report = report
        self._locks = locks
        self._queue = queue
        self._rewatch = rewatch
        self._adopt = adopt
        self._asked = threading.Event()
        config = config()
        self._config_stamp = _stamp_of(config.source) if config.source else None
        self._config_settling: tuple[int, ...] | None = None
        self._swap: Future[ModelInfo] | None = None
        #: The model section in service and its file's key when it was loaded (see
        #: `_model_file_key`); and those of the swap under way.
        self._serving: tuple[ModelConfig, tuple[object, ...] | None] = (config.model, _model_file_key(config.model, config.base))
        self._swap_for = self._serving

    def ask(self) -> None:
        """Reload at the main loop's next look (what SIGHUP asks for)."""
        self._asked.set()

    def poll(self) -> None:
        """Reload on SIGHUP, or once the config file has changed and stopped changing."""
        if self._asked.is_set():
            self._asked.clear()
            self.reload_config("SIGHUP")
            return
        path = self._config().source
        if path is None or self._loader is None:
            return
        stamp = _stamp_of(path)
        if stamp == self._config_stamp:
            self._config_settling = None
        elif stamp != self._config_settling:
            self._config_settling = stamp  # an editor may still be writing: look again next time
        else:
            self._config_stamp, self._config_settling = stamp, None
            self.reload_config(f"{path.name} changed")

    def reload_config(self, why: str) -> bool:
        """Read the config again and apply it; on any error keep the last good config."""
        if self._loader is None:
            return False
        status = self._report.status
        try:
            new = self._loader()
        except ConfigError as exc:
            status.config_error = str(exc)
            self._report.touch()
            log.error("%s; keeping the last good config", exc)
            return False
        log.info("reloading the config (%s)", why)
        self.apply(new)
        return True

    def apply(self, new: Config) -> None:
        """Apply a valid config: watch and output settings for the next frame, a new model by swap."""
        status = self._report.status
        old = self._config()
        status.config_error = None
        self._apply_model(new)
        if _rules_of(new) != _rules_of(old):
            rules = Rules(new.watch, new.output)
            try:
                make_watch_folders(rules.roots)
                self._locks.hold(rules.roots, recursive=new.watch.recursive)
            except DepthwatchError as exc:
                kept = "the watch section and output." + ", output.".join(_RULES_OUTPUT)
                log.error("%s; keeping %s of the last good config (the rest of the edit applies)", exc, kept)
                status.config_error = f"{exc}; keeping {kept} of the last good config"
                new = replace(new, watch=old.watch, output=replace(new.output, **{name: getattr(old.output, name) for name in _RULES_OUTPUT}))
        if _rules_of(new) != _rules_of(old):
            self._rewatch(Rules(new.watch, new.output), new)
        # `old` is what runs: settings kept for the next start stay there, so an edit back to
        # the running value says nothing, and the status tells the running value.
        if (new.daemon.workers, new.daemon.worker_niceness) != (old.daemon.workers, old.daemon.worker_niceness):
            log.warning("daemon.workers and daemon.worker_niceness take effect at the next start")
            new = replace(new, daemon=replace(new.daemon, workers=old.daemon.workers, worker_niceness=old.daemon.worker_niceness))
        if new.daemon.status_file != old.daemon.status_file:
            # Moved live, the old file would stay behind saying "running" with its counts frozen.
            log.warning("daemon.status_file takes effect at the next start; the status stays in %s", shown(path_for(old)))
            new = replace(new, daemon=replace(new.daemon, status_file=old.daemon.status_file))
        if new.daemon.queue_size != old.daemon.queue_size:
            self._queue.maxsize = new.daemon.queue_size  # read under the queue's lock by each put
            log.info("daemon.queue_size is now %d", new.daemon.queue_size)
        if new.api != old.api:
            log.warning("the api settings take effect at the next start")
            new = replace(new, api=old.api)
        self._adopt(new, Settings.from_config(new, watching=True))
        logging.getLogger("depthwatch").setLevel(new.daemon.log_level.upper())
        status.config_loads += 1
        self._report.touch()

    def _apply_model(self, new: Config) -> None:
        """Swap the model in if the config names another one, or its file changed since it was loaded.

        A model that failed to load is tried again at every reload once its
        file has changed (fixed in place, fetched again), even when the config
        text is the same: the status keeps the reason (`model_error`) until a
        load succeeds or the config goes back to the model in service.
        """
        status = self._report.status
        engine = self._engine()
        assert engine is not None
        key = _model_file_key(new.model, new.base)
        if self._swap is not None and self._swap_for != (new.model, key):
            # A load under way that this config no longer asks for (an edit undone, or another model
            # named meanwhile): it must not swap in and serve a model no config names.
            if engine.withdraw(self._swap):
                self._swap, self._swap_for = None, self._serving
            else:
                self.report_swap()  # it swapped in (or failed) just now: below, the model asked for loads after it
        serving, serving_key = self._serving
        if (new.model, key) == (serving, serving_key):
            status.model_error = None  # the model in service is the one asked for
            return
        if self._swap is not None and self._swap_for == (new.model, key):
            return  # that very load is under way
        if new.model == serving and self._swap is None and status.model_error is None and key is not None:
            log.info("model file %s changed; loading it again", shown(new.model.path))
        try:
            spec = catalogue.resolve(new.model, new.base)
        except DepthwatchError as exc:
            log.error("%s; keeping model %s", exc, serving.path)
            status.config_error = status.model_error = str(exc)
            return
        self._swap = engine.reload(spec)  # the main loop reports it when done
        self._swap_for = (new.model, key)

    def report_swap(self) -> None:
        """Once a model swap has finished on the inference thread, say so (main thread)."""
        swap = self._swap
        if swap is None or not swap.done():
            return
        self._swap = None
        report = self._report
        status = report.status
        if swap.exception() is not None:
            # The engine logged it and kept the old model.
            status.config_error = status.model_error = str(swap.exception())
        else:
            self._serving = self._swap_for
            status.model_error = None
            log.info("now using %s", swap.result().describe())
            report.publish_model()
        report.touch()
