"""`depthwatch models list|fetch`: the catalogue of depth models, and getting one onto this machine.

Downloading lives here and in `depthwatch.fetch`, never in the daemon: `run`
with a missing model names the fetch command and stops.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "list the depth models depthwatch knows and which are here; fetch one into the model folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser(
        "list", help="show the catalogue and which models are in the model folder (checking their sha256)",
        description="Show the catalogue and which models are in the model folder (checking their sha256).",
    )
    fetching = verbs.add_parser(
        "fetch", help="download a catalogue model into the model folder",
        description="Download a catalogue model into the model folder: resumes an interrupted download, "
        "and puts the file in place only after its size, sha256 and an ONNX load check pass.",
    )
    fetching.add_argument("name", metavar="NAME", help="catalogue name (see `depthwatch models list`)")
    fetching.add_argument("--force", action="store_true", help="download again even if a verified copy is there")
    fetching.add_argument(
        "--timeout", type=_seconds, default=30.0, metavar="SECONDS",
        help="give up when the connection stays silent this long (default 30)",
    )
    fetching.add_argument(
        "--accept", action="store_true",
        help="keep a copy put in the model folder by hand, and record its sha256, even though its size is far "
        "from the catalogue's or its sha256 does not match",
    )
    fetching.add_argument("--no-progress", action="store_true", help="no progress bar")
    for verb in (listing, fetching):
        verb.add_argument(
            "-c", "--config", metavar="CONFIG",
            help="config file whose model.folder to use (default: $DEPTHWATCH_CONFIG, then the user's config folder)",
        )
        verb.add_argument("--folder", metavar="DIR", help="model folder (overrides model.folder)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("must be between 0 and 3600 seconds")
    return value


def main(args: argparse.Namespace) -> int:
    from depthwatch import config as configuration
    from depthwatch.paths import expand_path

    config = configuration.load(configuration.find(args.config, here=True))
    folder = expand_path(args.folder, Path.cwd()) if args.folder else config.model.models_folder()
    if args.verb == "fetch":
        return _fetch(args, folder)
    return _list(folder, config.model.path)


def _fetch(args: argparse.Namespace, folder: Path) -> int:
    from depthwatch.model import catalogue, fetch

    entry = catalogue.entry(args.name)
    result = fetch.fetch(
        entry, folder, force=args.force, accept=args.accept, timeout=args.timeout, progress=None if args.no_progress else sys.stderr
    )
    if result.accepted:
        instead = f"; `depthwatch models fetch {entry.name} --force` downloads the catalogue's copy instead" if entry.sha256 else ""
        print(
            f"{entry.name}: kept {result.path} as it is ({fetch.human_size(result.size)}, sha256 {result.sha256}, "
            f"recorded in {fetch.checksum_file(result.path).name}){instead}"
        )
    elif result.downloaded or result.resumed_from:
        how = f"resumed at byte {result.resumed_from}, " if result.resumed_from else ""
        print(f"{entry.name}: saved {result.path} ({how}{fetch.human_size(result.size)}, sha256 {result.sha256})")
    else:
        print(f"{entry.name}: already in {result.path} ({fetch.human_size(result.size)}, sha256 {result.sha256} checked)")
    return 0


def _list(folder: Path, configured: str) -> int:
    from depthwatch.errors import DepthwatchError
    from depthwatch.model import catalogue, fetch
    from depthwatch.model.profiles import PROFILES

    entries = catalogue.load()
    rows = [("NAME", "STATE", "FILE", "SIZE", "INPUT", "LICENCE", "MODEL")]
    hints: list[str] = []
    for entry in entries.values():
        try:
            state = fetch.state(entry, folder)
        except DepthwatchError as exc:
            state = "error"
            hints.append(f"{entry.name}: {exc}")
        if state == "changed":
            hints.append(
                f"{entry.name} does not match its sha256: `depthwatch models fetch {entry.name}` replaces it, "
                "`--accept` keeps it"
            )
        elif state == "accepted":
            hints.append(
                f"{entry.name} was kept with --accept, though its sha256 is not the catalogue's: "
                f"`depthwatch models fetch {entry.name} --force` replaces it"
            )
        elif state == "unverified":
            hints.append(f"{entry.name} has no checksum yet: `depthwatch models fetch {entry.name}` checks it loads and records one")
        profile = PROFILES[entry.profile]
        name = entry.name + (" *" if entry.name == configured else "")
        # The real size of a copy that is here; the download size of one that is not.
        present = folder / entry.file
        if state in ("missing", "error") or not present.is_file():
            size = f"~{entry.approx_mb:g} MB" if entry.approx_mb else "?"
        else:
            real = present.stat().st_size
            size = fetch.human_size(real)
            doubt = fetch.size_doubt(entry, real)
            if doubt:
                hints.append(f"{entry.name}: {entry.file} {doubt}; it is probably another model")
        rows.append((name, state, entry.file, size, f"{profile.input_size or '?'} px", entry.licence, entry.title))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    print(f"model folder: {folder}")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    if configured in entries:
        print("* the model the config runs (model.path)")
    for hint in hints:
        print(hint)
    print("fetch one with: depthwatch models fetch NAME")
    return 0
