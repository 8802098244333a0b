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
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from depthwatch import __version__
from depthwatch.errors import DepthwatchError

# numpy's BLAS (OpenBLAS) starts a thread per core as it loads, each busy for a moment: about
# 0.05 s of CPU at every start for nothing, since depthwatch multiplies only short vectors, and
# the cores belong to the inference. One thread, unless the user's environment says otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

#: Subcommands, each a module in depthwatch.commands with HELP, add_arguments() and main().
COMMANDS = ("run", "once", "worker", "check", "status", "models", "service")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with the subcommand it names, only that one's module is imported.

    Why: a command module brings in what it runs (run, once, worker and check:
    numpy, OpenCV, the config's checks; about 0.2 s of CPU at every start), and
    `depthwatch status` needs none of it. The other subcommands are still
    known by name, so a misspelt one is refused with the list; the help that
    lists them all (no subcommand named) imports every module for its line,
    as does `argv` None.
    """
    parser = argparse.ArgumentParser(
        prog="depthwatch",
        description="Watch folders for video frames and write their depth maps next to them.",
    )
    parser.add_argument("--version", action="version", version=f"depthwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = None if argv is None else _named_command(argv)
    for name in COMMANDS:
        if named is not None and name != named:
            sub.add_parser(name)
            continue
        module = importlib.import_module(f"depthwatch.commands.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(func=module.main)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` runs (its first word that is not an option), if it is one of COMMANDS."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


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


class Terminated(KeyboardInterrupt):
    """SIGTERM to `once`, as a farm manager cancels or requeues a task: the clean-up Ctrl-C gets, then exit 143.

    Its default action would end the process where it stands: a range task's
    partial segment (megabytes to gigabytes on shared storage) would stay, and nothing be said.
    """


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def _interrupted(args: argparse.Namespace, how: str = "Ctrl-C") -> str:
    if args.command != "once":
        return f"interrupted ({how})"
    from depthwatch.media.video import is_clip_name

    if getattr(args, "join", False):  # the segments are its input: they go only once the depth clip is whole
        return f"interrupted ({how}): no partial depth clip stays, and the segments stay until a join ends; the same command again joins them"
    if getattr(args, "frames", None) and any(is_clip_name(Path(i)) for i in args.inputs):
        return f"interrupted ({how}): nothing of this task stays (its partial segment is removed); run it again"
    if getattr(args, "farm", None):
        again = "maps every frame again (--force)" if getattr(args, "force", False) else "maps only the frames still missing"
        return f"interrupted ({how}): the maps written so far stay; the same command again {again}"
    # A frame past the model as the Ctrl-C came may still be written; one in it or before it is not.
    return f"interrupted ({how}): the maps written so far stay (a frame in flight may be written too); the rest were not made"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    to_file = setup_logging(getattr(args, "log_level", None) or "info")
    if args.command == "once" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # the daemon and the worker handle their own
    try:
        return int(args.func(args) or 0)
    except DepthwatchError as exc:
        print(f"depthwatch: {exc}", file=sys.stderr)
        if to_file:  # the reason is the log's last line there too
            logging.getLogger("depthwatch").error("depthwatch: %s", exc)
        return exc.exit_code
    except Terminated:
        print(f"depthwatch: {_interrupted(args, 'SIGTERM')}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:  # Ctrl-C: said, not a silent 130, and what it leaves
        print(f"depthwatch: {_interrupted(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `depthwatch models list | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0
