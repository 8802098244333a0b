"""`depthwatch once`: run files or folders of frames through the engine and exit."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.errors import ConfigError
from depthwatch.formats import EXTENSIONS

HELP = "write depth maps for the given frames (files or folders) and exit"

#: Beside each input unless -o says otherwise; a fixed name would collide across inputs.
DEFAULT_TEMPLATE = "{stem}_depth.jpg"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, or folders of them")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUTPUT",
        help="output file (one input), folder, or name template like '{stem}_depth.png' "
        f"(default: {DEFAULT_TEMPLATE} beside each input)",
    )
    parser.add_argument(
        "--frames",
        metavar="RANGE",
        help="only the numbered frames in RANGE, as render-farm managers cut a job: 1001-1100, 1001-1100x2, 1001,1005",
    )
    parser.add_argument(
        "--farm",
        metavar="SCHEDULER_ADDRESS",
        help="send the frames to a render farm's Dask scheduler (tcp://host:8786) instead of mapping them here; "
        "maps already up to date are skipped, so running it again resumes an interrupted job",
    )
    parser.add_argument("--force", action="store_true", help="with --farm: map every frame, even those up to date")
    add_config_arguments(parser)


def in_range(sources: list[Path], spec: str) -> list[Path]:
    """The numbered frames among `sources` whose number is in the range `spec`."""
    from depthwatch import sequences

    try:
        wanted = sequences.frame_range(spec)
    except ValueError as exc:
        raise ConfigError(f"--frames: {exc}") from None
    kept = []
    for source in sources:
        name = sequences.parse(source)
        if name is not None and name.number in wanted:
            kept.append(source)
    return kept


def collect_inputs(inputs: list[str]) -> list[Path]:
    """The frames named, with folders expanded to the images directly inside them."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir()
                if p.suffix.lower() in EXTENSIONS and p.is_file() and not p.name.startswith(".") and "_depth" not in p.stem
            )
            files.extend(found)
        else:
            files.append(path)  # a missing file is reported as a failed frame
    return files


def output_for(source: Path, output: str | None, single: bool) -> Path:
    if output is None:
        return source.with_name(DEFAULT_TEMPLATE.format(stem=source.stem))
    if "{" in output:
        return source.parent / output.format(stem=source.stem, name=source.name, ext=source.suffix.lstrip("."))
    target = Path(output).expanduser()
    if single and target.suffix and not target.is_dir():
        return target
    return target / DEFAULT_TEMPLATE.format(stem=source.stem)


def main(args: argparse.Namespace) -> int:
    from depthwatch import catalogue
    from depthwatch.engine import Engine
    from depthwatch.pipeline import Job, Pipeline, Settings

    config = config_from_args(args)
    sources = collect_inputs(args.inputs)
    if not sources:
        raise ConfigError("no frames found in " + ", ".join(args.inputs) + "; give image files or folders of them")
    if args.frames:
        sources = in_range(sources, args.frames)
        if not sources:
            raise ConfigError(f"no frames numbered {args.frames} in " + ", ".join(args.inputs) + "; check the range and the names")
    jobs = [Job(s, output_for(s, args.output, len(sources) == 1)) for s in sources]
    if args.farm:
        from depthwatch.farm import client

        jobs = [Job(j.source.absolute(), j.output.absolute()) for j in jobs]  # the path map rewrites absolute paths
        progress = _progress(len(jobs))
        try:
            failures = client.run(args.farm, jobs, config, force=args.force, progress=progress)
        finally:
            progress.close()
        return 1 if failures else 0
    for job in jobs:
        job.output.parent.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_config(config)
    spec = catalogue.resolve(config.model, config.base)
    failures = 0
    with Engine(spec) as engine:
        engine.wait_ready()
        pipeline = Pipeline(engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)
        window = threading.Semaphore(config.daemon.workers + 2)  # bound decoded frames in memory
        progress = _progress(len(jobs))
        futures = []
        for job in jobs:
            window.acquire()
            future = pipeline.submit(job, settings)
            future.add_done_callback(lambda _: (window.release(), progress.update(1)))
            futures.append(future)
        for future in futures:
            result = future.result()
            if not result.ok:
                failures += 1
                progress.write(f"depthwatch: {result.describe()}", file=sys.stderr)
        pipeline.close()
        progress.close()
    return 1 if failures else 0


def _progress(total: int):  # noqa: ANN202 - tqdm or its stand-in
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", disable=total < 10 or not sys.stderr.isatty(), file=sys.stderr)
