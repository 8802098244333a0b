"""`depthwatch run`: the long-lived daemon, in the foreground, for launchd or systemd."""

from __future__ import annotations

import argparse
import logging
import os

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.config import Config

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
    """The command line's settings over the file's, checked the same way (paths from the shell's folder)."""
    from depthwatch.config import override

    if args.watch:
        config = override(config, "--watch", "watch", folders=list(args.watch))
    if args.pattern:
        config = override(config, "--pattern", "watch", patterns=list(args.pattern))
    if args.polling:
        config = override(config, "--polling", "watch", observer="polling")
    if args.output:
        config = override(config, "--output", "output", template=args.output)
    if args.status:
        config = override(config, "--status", "daemon", status_file=args.status)
    if args.api:
        host, port = args.api
        config = override(config, "--api", "api", enabled=True, port=port, **({"host": host} if host else {}))
    return config


def main(args: argparse.Namespace) -> int:
    from depthwatch import config as configuration
    from depthwatch.daemon.lifecycle import Daemon

    config = apply_overrides(config_from_args(args), args)
    configuration.check_combinations(config)
    logging.getLogger("depthwatch").setLevel(config.daemon.log_level.upper())

    def read_config_again() -> Config:
        """The same file with the same command-line overrides, read again (the daemon's live reload)."""
        fresh = apply_overrides(config_from_args(args, config.source, again=True), args)
        configuration.check_combinations(fresh)
        return fresh

    daemon = Daemon(config, loader=read_config_again, catch_crashes=True)
    code = daemon.run()  # SIGTERM/SIGINT stop it (a second one cuts the wait short), SIGHUP reloads
    if daemon.stuck:
        # A worker is stuck in a system call (a hung network volume): the interpreter would
        # wait for it at exit forever. Everything else has unwound and the status file says so.
        logging.shutdown()
        os._exit(code)
    return code
