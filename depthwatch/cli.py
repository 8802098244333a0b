"""The `depthwatch` command line: one subcommand per module in `depthwatch.commands`.

The only place that prints to the user and picks exit codes: a DepthwatchError
becomes one line on stderr and its exit code (78 for config and model errors,
which a restart cannot fix); anything else keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from depthwatch import __version__
from depthwatch.errors import DepthwatchError

#: Subcommands, each a module in depthwatch.commands with HELP, add_arguments() and main().
COMMANDS = ("run", "once", "worker", "check", "status", "models", "service")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="depthwatch",
        description="Watch folders for video frames and write their depth maps next to them.",
    )
    parser.add_argument("--version", action="version", version=f"depthwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"depthwatch.commands.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(func=module.main)
    return parser


def setup_logging(level: str = "info") -> bool:
    """Human-readable lines on stderr (systemd's journal keeps them), or, where $DEPTHWATCH_LOG_FILE
    names a file (the LaunchAgent), in that file, rotated; True for the file."""
    from depthwatch.service import logfiles

    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    path = os.environ.get(logfiles.LOG_FILE_ENV)
    if path:
        try:
            handler = logfiles.rotating_handler(Path(path))
        except OSError as exc:
            print(f"depthwatch: cannot write the log file {path} (${logfiles.LOG_FILE_ENV}): {exc.strerror or exc}; logging here", file=sys.stderr)
            path = None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("depthwatch")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    return bool(path)


def _interrupted(args: argparse.Namespace) -> str:
    if args.command != "once":
        return "interrupted (Ctrl-C)"
    if getattr(args, "farm", None):
        again = "maps every frame again (--force)" if getattr(args, "force", False) else "maps only the frames still missing"
        return f"interrupted (Ctrl-C): the maps written so far stay; the same command again {again}"
    # A frame past the model as the Ctrl-C came may still be written; one in it or before it is not.
    return "interrupted (Ctrl-C): the maps written so far stay (a frame in flight may be written too); the rest were not made"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    to_file = setup_logging(getattr(args, "log_level", None) or "info")
    try:
        return int(args.func(args) or 0)
    except DepthwatchError as exc:
        print(f"depthwatch: {exc}", file=sys.stderr)
        if to_file:  # the reason is the log's last line there too
            logging.getLogger("depthwatch").error("depthwatch: %s", exc)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C: said, not a silent 130, and what it leaves
        print(f"depthwatch: {_interrupted(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `depthwatch models list | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0
