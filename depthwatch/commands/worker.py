"""`depthwatch worker`: join a render farm's Dask scheduler as one long-lived worker."""

from __future__ import annotations

import argparse
import logging

from depthwatch.commands.common import add_config_arguments, config_from_args

HELP = "join a render farm: a Dask worker that loads the model once and maps the frames it is sent"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scheduler", metavar="SCHEDULER_ADDRESS", help="the Dask scheduler, e.g. tcp://farm-head:8786")
    add_config_arguments(parser)
    parser.add_argument(
        "--workers", metavar="N", type=int, help="threads reading, decoding, encoding and writing frames (overrides daemon.workers)"
    )
    parser.add_argument("--name", metavar="NAME", help="the worker's name on the scheduler's dashboard")
    parser.add_argument("--status", metavar="FILE", help="status JSON file to keep up to date (overrides daemon.status_file)")


def main(args: argparse.Namespace) -> int:
    from depthwatch import config as configuration
    from depthwatch.config import override
    from depthwatch.farm import worker

    config = config_from_args(args)
    if args.workers is not None:
        config = override(config, "--workers", "daemon", workers=args.workers)
    if args.status:
        config = override(config, "--status", "daemon", status_file=args.status)
    configuration.check_combinations(config)
    logging.getLogger("depthwatch").setLevel(config.daemon.log_level.upper())
    return worker.serve(config, args.scheduler, name=args.name, status_file=config.daemon.status_file)
