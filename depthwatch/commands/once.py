"""`depthwatch once`: run files or folders of frames through the engine and exit."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.errors import ConfigError, InputError
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
    add_config_arguments(parser)


def collect_inputs(inputs: list[str]) -> list[Path]:
    """The frames named, with folders expanded to the images directly inside them.

    A name that is not there is refused here, before the model loads: it is a
    typing mistake, not a frame that vanished.
    """
    missing = [item for item in inputs if not os.path.lexists(os.path.expanduser(item))]
    if missing:
        raise InputError(f"no such file or folder: {', '.join(missing)}; check the path")
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
            files.append(path)
    return files


def output_for(source: Path, output: str | None, single: bool) -> Path:
    """Where one input's map goes: a bare name template beside the input, any other path
    relative to the current folder (as every command line tool takes paths)."""
    if output is None:
        return source.with_name(DEFAULT_TEMPLATE.format(stem=source.stem))
    if "{" in output:
        named = Path(output.format(stem=source.stem, name=source.name, ext=source.suffix.lstrip("."))).expanduser()
        return source.parent / named if len(named.parts) == 1 else Path(os.path.abspath(named))
    target = Path(os.path.abspath(Path(output).expanduser()))
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
    for job in jobs:
        job.output.parent.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_config(config)
    spec = catalogue.resolve(config.model, config.base)
    failures = 0
    began = time.monotonic()
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
    # One line a script (or a person, once the bar is gone) can read: what was done, how long.
    done = len(jobs) - failures
    print(f"{done} depth map{'s' if done != 1 else ''} written, {failures} failed, in {time.monotonic() - began:.1f} s")
    return 1 if failures else 0


def _progress(total: int):  # noqa: ANN202 - tqdm or its stand-in
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", disable=total < 10 or not sys.stderr.isatty(), file=sys.stderr)
