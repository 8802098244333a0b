"""`depthwatch run`: the long-lived daemon, in the foreground, for launchd or systemd."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path
from types import FrameType

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.config import Config
from depthwatch.paths import expand_path

HELP = "watch folders and write a depth map for every frame dropped in them (runs in the foreground)"

log = logging.getLogger("depthwatch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--watch", metavar="DIR", action="append", help="folder to watch (repeatable; overrides watch.folders)")
    parser.add_argument("--pattern", metavar="GLOB", action="append", help="frame file pattern (repeatable; overrides watch.patterns)")
    parser.add_argument("--output", metavar="TEMPLATE", help="output name template, e.g. '{stem}_depth.jpg' (overrides output.template)")
    parser.add_argument("--status", metavar="FILE", help="status JSON file to keep up to date (overrides daemon.status_file)")
    parser.add_argument("--polling", action="store_true", help="poll instead of using filesystem events (network volumes)")
    parser.add_argument(
        "--api",
        metavar="[HOST:]PORT",
        type=api_address,
        help="serve the HTTP API (POST /predict) on this port, 127.0.0.1 unless HOST is given (turns api.enabled on)",
    )


def api_address(text: str) -> tuple[str | None, int]:
    """`PORT`, `HOST:PORT` or `[IPv6]:PORT`."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else None
    if not port.isdigit() or not 0 <= int(port) <= 65535 or (sep and not host):
        raise argparse.ArgumentTypeError(f"{text!r} is not [HOST:]PORT, e.g. 5000 or 127.0.0.1:5000")
    return host, int(port)


def apply_overrides(config: Config, args: argparse.Namespace) -> Config:
    cwd = Path.cwd()  # paths on the command line are relative to the shell, not the config file
    if args.watch:
        config = config.replace("watch", folders=tuple(expand_path(w, cwd) for w in args.watch))
    if args.pattern:
        config = config.replace("watch", patterns=tuple(args.pattern))
    if args.polling:
        config = config.replace("watch", observer="polling")
    if args.output:
        config = config.replace("output", template=args.output)
    if args.status:
        config = config.replace("daemon", status_file=expand_path(args.status, cwd))
    if args.api:
        host, port = args.api
        config = config.replace("api", enabled=True, port=port, **({"host": host} if host else {}))
    return config


def main(args: argparse.Namespace) -> int:
    from depthwatch import config as configuration
    from depthwatch.daemon import Daemon

    config = apply_overrides(config_from_args(args), args)
    configuration.check_combinations(config)
    logging.getLogger("depthwatch").setLevel(config.daemon.log_level.upper())

    def reload() -> Config:
        """The same file with the same command-line overrides, read again."""
        fresh = apply_overrides(config_from_args(args), args)
        configuration.check_combinations(fresh)
        return fresh

    daemon = Daemon(config, loader=reload)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if daemon.stopping:
            # A second signal: out at once. Still a stop the user asked for, so exit 0
            # (launchd and systemd would restart a non-zero exit); frames left
            # unfinished are picked up by the next start's scan.
            os.write(2, b"depthwatch: second signal, exiting at once\n")
            os._exit(0)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, lambda signum, frame: daemon.request_reload())
    return daemon.run()
