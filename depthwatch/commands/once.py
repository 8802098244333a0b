"""`depthwatch once`: run files or folders of frames through the engine and exit."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.errors import ConfigError, DepthwatchError
from depthwatch.formats import EXTENSIONS
from depthwatch.names import shown

HELP = "write depth maps for the given frames (files or folders) and exit"

#: Beside each input unless -o says otherwise; a fixed name would collide across inputs.
DEFAULT_TEMPLATE = "{stem}_depth.jpg"


class UsageError(DepthwatchError):
    """The command line asks for something that would do harm (EX_USAGE)."""

    exit_code = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, or folders of them")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUTPUT",
        help="output file (one input), folder, or name template like '{stem}_depth.png' "
        f"(default: {DEFAULT_TEMPLATE} beside each input)",
    )
    add_config_arguments(parser)


def collect_inputs(inputs: list[str]) -> list[Path]:
    """The frames named, with folders expanded to the images directly inside them."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir()
                if p.suffix.lower() in EXTENSIONS and p.is_file() and not p.name.startswith(".") and not _is_depth_map(p)
            )
            files.extend(found)
        else:
            files.append(path)  # a missing file is reported as a failed frame
    return files


def _is_depth_map(path: Path) -> bool:
    """One of depthwatch's own maps (it carries a provenance record), whatever its name."""
    from depthwatch import provenance

    return provenance.read(path) is not None


def check_outputs(jobs: list) -> None:  # noqa: ANN001 - pipeline.Job, imported late
    """Refuse before any work a map that would replace one of the inputs."""
    inputs = {os.path.realpath(job.source) for job in jobs}
    for job in jobs:
        if os.path.realpath(job.output) in inputs:
            raise UsageError(
                f"the output {shown(job.output)} is an input frame; writing it would replace the frame: give another -o"
            )


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
    jobs = [Job(s, output_for(s, args.output, len(sources) == 1)) for s in sources]
    check_outputs(jobs)
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
