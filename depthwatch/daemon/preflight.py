"""What the daemon checks and says before it watches: the answers to "why is it doing that?".

Which config and which status file, first thing; another daemon on the same
status file warned of; the temporary files dead writers left swept away;
watch patterns that clash with the output template warned of; and what the
ready line says is written. Each is a line a user reads when something is
not as they expected.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from depthwatch.config import Config, OutputConfig
from depthwatch.daemon.status import is_running, path_for, read_status
from depthwatch.frames.rules import Rules, template_clashes
from depthwatch.frames.writer import sweep_temp_files_below
from depthwatch.logtext import shown
from depthwatch.media import video

log = logging.getLogger("depthwatch")


def announce(config: Config) -> None:
    """Which config and which status file, first thing: the answers to "why is it doing that?"."""
    path = path_for(config)
    log.info("config %s; status file %s", shown(config.source) if config.source else "built-in defaults", shown(path))
    if config.daemon.status_file is None:  # the default one lives in a folder of ours
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("status file: cannot create %s: %s", path.parent, exc.strerror or exc)
    try:
        previous = read_status(path)
    except OSError:
        return  # none yet (or unreadable: writing it says so)
    except ValueError as exc:
        log.warning("status file %s is not one depthwatch wrote (%s); it is replaced by this daemon's", shown(path), exc)
        return
    if previous.get("pid") != os.getpid() and is_running(previous):
        log.warning(
            "another depthwatch (pid %s) is running with this config and writes %s; "
            "both would process the same frames: stop one (see `depthwatch status`)",
            previous.get("pid"), path,
        )


def sweep_leftovers(rules: Rules) -> None:
    """Remove the temporary files dead writers left in the watch folders and the folders outputs go to."""
    for folder in rules.output_folders():
        swept, left = sweep_temp_files_below([folder], recursive=rules.recursive and folder in rules.roots)
        if swept:
            log.info("removed %d temporary file(s) left in %s", swept, shown(folder))
        if left:
            log.warning("cannot remove %d temporary file(s) left in %s (is the folder writable?)", left, shown(folder))


def warn_of_clashes(rules: Rules) -> None:
    """One warning per watch pattern whose files would look like depth maps under the output template."""
    for pattern in template_clashes(rules.patterns, rules.template):
        log.warning(
            "watch.patterns %s and output.template %s clash: every %s file looks like a depth map, so none "
            "is mapped, and a map may take the name of one; depthwatch never replaces a file it did not make "
            "(it logs an error instead): change output.template or the patterns",
            pattern, rules.template, pattern,
        )


def writing(patterns: tuple[str, ...], output: OutputConfig) -> str:
    """What the ready line says is written: the frames' template, the clips', or both, as the patterns take."""
    clips = [video.is_clip_name(Path(p)) for p in patterns]
    if all(clips):
        return output.clip_template
    if any(clips) or any(p.endswith("*") for p in patterns):
        return f"{output.template} (frames), {output.clip_template} (clips)"
    return output.template
