"""Settings that are fine alone but impossible together, checked after the file and again after overrides.

Each check names the settings involved and what to change; `where` is the
file's first line, or "command line" when an override made the combination.
"""

from __future__ import annotations

import os
from pathlib import Path

from depthwatch.config.hosts import is_loopback
from depthwatch.config.sections import Config
from depthwatch.errors import ConfigError
from depthwatch.imaging.formats import map_format_problem


def _pattern_ext(pattern: str) -> str | None:
    """The extension every file `pattern` matches ends in, or None where the pattern leaves it open."""
    ext = os.path.splitext(pattern)[1]
    return ext if ext and not set(ext) & set("*?[") else None


def check_combinations(config: Config, where: str = "command line") -> None:
    """Settings that are fine alone but impossible together (also after command-line overrides)."""
    if (config.model.mean is None) != (config.model.std is None):
        raise ConfigError(f"{where}: model.mean and model.std go together; set both or neither")
    out = config.output
    near, far = str(out.near), str(out.far)
    if near.endswith("%") == far.endswith("%") and float(near.rstrip("%")) <= float(far.rstrip("%")):
        raise ConfigError(
            f"{where}: output.near ({out.near}) must be above output.far ({out.far}); "
            "to make near black, set output.invert: true instead"
        )
    if out.png_bits == 32 and Path(out.template).suffix.lower() == ".png":
        raise ConfigError(
            f"{where}: output.png_bits 32 (float) needs a .tif or .exr template, not {out.template!r}; "
            "PNG holds at most 16 bits"
        )
    for pattern in config.watch.patterns:  # patterns that leave the extension open: each frame's job checks
        ext = _pattern_ext(pattern)
        problem = ext and map_format_problem(out.template, ext, out.png_bits, f"a {pattern} frame")
        if problem:
            raise ConfigError(f"{where}: {problem}")
    if config.output.template in config.watch.patterns:
        raise ConfigError(
            f"{where}: output.template {config.output.template!r} is also a watch pattern; "
            "outputs would be processed as frames, so choose a different output name"
        )
    if config.output.clip_template in config.watch.patterns:
        raise ConfigError(
            f"{where}: output.clip_template {config.output.clip_template!r} is also a watch pattern; "
            "depth clips would be processed as clips, so choose a different output name"
        )
    if config.api.enabled and not is_loopback(config.api.host) and config.api.token is None:
        raise ConfigError(
            f"{where}: api.host {config.api.host} is reachable from other machines, and api.token is not set; "
            "set api.token, or listen on 127.0.0.1"
        )
