"""`depthwatch once`: run files or folders of frames through the engine and exit."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from depthwatch import config as configuration
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
    levels = parser.add_argument_group("how the map looks (override the config's output section)")
    levels.add_argument("--refine", metavar="MODE", help="edges (depth edges follow the frame's) or none (plain upscale)")
    levels.add_argument("--near", metavar="LEVEL", help="the level shown white: a fraction 0..1 of the range, or a percentile like 80%%")
    levels.add_argument("--far", metavar="LEVEL", help="the level shown black: a fraction 0..1 of the range, or a percentile like 20%%")
    levels.add_argument("--gamma", metavar="G", help="midtones: above 1 brighter, below 1 darker (0.1..10)")
    add_config_arguments(parser)


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
    from depthwatch import catalogue, imaging
    from depthwatch.engine import Engine
    from depthwatch.pipeline import Job, Pipeline, Settings

    config = config_from_args(args)
    for key in ("refine", "near", "far", "gamma"):
        if getattr(args, key) is not None:
            config = configuration.override(config, "output", key, getattr(args, key), where=f"--{key}")
    configuration.check_combinations(config)
    sources = collect_inputs(args.inputs)
    if not sources:
        raise ConfigError("no frames found in " + ", ".join(args.inputs) + "; give image files or folders of them")
    jobs = [Job(s, output_for(s, args.output, len(sources) == 1)) for s in sources]
    unwritable = sorted({job.output.suffix or "(no extension)" for job in jobs if not imaging.can_encode(job.output.suffix)})
    if unwritable:
        raise ConfigError(
            f"-o {args.output}: cannot write depth maps as {', '.join(unwritable)}; "
            "use .jpg, .png or .tif (.tif with output.png_bits: 32 for float)"
        )
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
