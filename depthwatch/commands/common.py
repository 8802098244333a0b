"""Options shared by the subcommands that read a config."""

from __future__ import annotations

import argparse
from pathlib import Path

from depthwatch import config as configuration
from depthwatch.config import Config
from depthwatch.model.catalogue import is_catalogue_name
from depthwatch.paths import expand_path


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", metavar="CONFIG", help="config file (default: $DEPTHWATCH_CONFIG, then the user's config folder, then ./config.yaml)"
    )
    parser.add_argument("--model", metavar="PATH", help="model file or catalogue name (overrides model.path)")
    parser.add_argument("--profile", metavar="NAME", help="model profile (overrides model.profile)")


def config_from_args(args: argparse.Namespace, found: Path | None = None, *, again: bool = False) -> Config:
    """Find and load the config, then apply the command-line overrides.

    Paths given on the command line are relative to the shell's folder, unlike
    paths in the config file, which are relative to the file. `again`: read
    `found`, the file found at start (a daemon's reload), not search again: a
    config moved away or a user config appearing must not switch a running
    daemon to another file, or to the built-in defaults, without a word.
    """
    config = configuration.load(found, running=True) if again else configuration.load(configuration.find(args.config, here=True))
    if args.model:
        model = args.model if is_catalogue_name(args.model) else str(expand_path(args.model, Path.cwd()))
        config = configuration.override(config, "--model", "model", path=model)
    if args.profile:
        config = configuration.override(config, "--profile", "model", profile=args.profile)
    return config
