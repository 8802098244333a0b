"""`depthwatch service`: run the daemon under launchd (macOS) or systemd --user (Linux).

The same verbs for both; what they do lives in `depthwatch.service`.
"""

from __future__ import annotations

import argparse

from depthwatch import service

HELP = "run depthwatch as a service: a launchd agent on macOS, a systemd user unit on Linux"

VERBS = {
    "install": "write the service definition, check it, load it and start it (run it again after changing the config); "
    "without a config, first write the documented default to the user's config folder",
    "uninstall": "stop the service and remove its definition (its logs stay)",
    "start": "start the installed service",
    "stop": "stop the service cleanly; it stays stopped until started again or until the next login",
    "restart": "stop the service and start it again",
    "status": "whether the service is loaded and running, its pid and last exit status, and the daemon's status file",
    "logs": "show the end of the service's log",
    "print": "show the service definition that install would write, without installing anything",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--manager",
        choices=service.NAMES,
        help="the service manager to use (default: launchd on macOS, systemd elsewhere)",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, text in VERBS.items():
        sub = verbs.add_parser(name, help=text, description=text, parents=[common])
        if name in ("install", "print"):
            sub.add_argument(
                "-c",
                "--config",
                metavar="CONFIG",
                help="config file the service runs with (default: $DEPTHWATCH_CONFIG, then the user's config folder, "
                "where install writes the documented default if there is none)",
            )
        if name == "logs":
            sub.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="how many lines to show (default 50)")
            sub.add_argument("-f", "--follow", action="store_true", help="keep showing new lines until Ctrl-C")


def main(args: argparse.Namespace) -> int:
    manager = service.manager_for(args.manager)
    if args.verb == "install":
        return manager.install(args.config)
    if args.verb == "print":
        return manager.print_definition(args.config)
    if args.verb == "logs":
        return manager.logs(args.lines, follow=args.follow)
    verbs = {
        "uninstall": manager.uninstall,
        "start": manager.start,
        "stop": manager.stop,
        "restart": manager.restart,
        "status": manager.status,
    }
    return verbs[args.verb]()
