"""`depthwatch once`: run files or folders of frames through the engine and exit.

Numbered frames (`shot_1001.jpg`, see `sequences`) are a sequence: with
`output.normalise: stable` each sequence goes through twice. Pass 1 runs the
model on every frame and keeps its small stabilise.Summary and its prediction
(float16 at model resolution, up to HOLD_BYTES per sequence; beyond that the
model runs again for those frames in pass 2). `stabilise.plan` then finds the
shots and their ranges, and pass 2 maps the frames in frame order (each
shot's maps filtered over time, so pass 2 must go in order) and writes them.
Stills, and everything in `frame` mode, get their own map each, exactly as
the daemon's per-frame path makes it.
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.errors import ConfigError
from depthwatch.formats import EXTENSIONS
from depthwatch.normalise import FRAME, MODES, STABLE

#: Predictions kept between the passes over one sequence (float16 at model resolution:
#: about 5000 frames of a 224x224 model); frames past it are run through the model again.
HOLD_BYTES = 512 * 1024 * 1024

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
        "--normalise",
        choices=MODES,
        help="stable: numbered frames are normalised over each shot as a whole; "
        "frame: each map on its own (overrides output.normalise)",
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
    from depthwatch import catalogue, sequences
    from depthwatch.engine import Engine
    from depthwatch.pipeline import Job, Pipeline, Settings

    config = config_from_args(args)
    if args.normalise:
        config = config.replace("output", normalise=args.normalise)
    sources = collect_inputs(args.inputs)
    if not sources:
        raise ConfigError("no frames found in " + ", ".join(args.inputs) + "; give image files or folders of them")
    jobs = {s: Job(s, output_for(s, args.output, len(sources) == 1)) for s in sources}
    for job in jobs.values():
        job.output.parent.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_config(config)
    if settings.normalise == STABLE:
        found, stills = sequences.sequences(sources)
    else:
        found, stills = [], sources
    spec = catalogue.resolve(config.model, config.base)
    with Engine(spec) as engine:
        engine.wait_ready()
        pipeline = Pipeline(engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)
        run = _Runner(pipeline, config.daemon.workers + 2, _progress(len(jobs)))
        run.all([jobs[s] for s in stills], replace(settings, normalise=FRAME))
        for sequence in found:
            run.sequence([jobs[p] for p in sequence.paths], settings)
        pipeline.close()
        run.progress.close()
    return 1 if run.failures else 0


class _Runner:
    """Submits jobs with at most `window` in flight (decoded frames are large) and counts failures."""

    def __init__(self, pipeline: Any, window: int, progress: Any) -> None:
        self.pipeline = pipeline
        self.window = threading.Semaphore(window)
        self.progress = progress
        self.failures = 0

    def submit(self, job: Any, settings: Any, count: bool = True) -> Future[Any]:
        self.window.acquire()
        future = self.pipeline.submit(job, settings)
        future.add_done_callback(lambda _: (self.window.release(), count and self.progress.update(1)))
        return future

    def report(self, result: Any) -> bool:
        if not result.ok:
            self.failures += 1
            self.progress.write(f"depthwatch: {result.describe()}", file=sys.stderr)
        return result.ok

    def all(self, jobs: list[Any], settings: Any) -> None:
        for future in [self.submit(job, settings) for job in jobs]:
            self.report(future.result())

    def sequence(self, jobs: list[Any], settings: Any) -> None:
        """Two passes: collect (model, summary) in any order, then map and write in frame order."""
        from depthwatch import stabilise

        collected = [self.submit(replace(job, collect=True), settings, count=False) for job in jobs]
        kept: list[tuple[Any, Any]] = []
        held = 0
        for job, future in zip(jobs, collected):
            result = future.result()
            if not self.report(result):
                self.progress.update(1)
                continue
            held += result.prediction.nbytes
            if held > HOLD_BYTES:
                result.prediction = None  # run the model again in pass 2
            kept.append((job, result))
        plans = stabilise.plan([result.summary for _, result in kept])
        kind = self.pipeline.engine.wait_ready().profile.output
        clip = settings.render.clip_percent
        previous = None
        written = []
        for (job, result), params in zip(kept, plans):
            prediction = result.prediction
            if prediction is None:
                again = self.pipeline.process(replace(job, collect=True), settings)
                if not self.report(again):
                    self.progress.update(1)
                    continue
                prediction = again.prediction
            result.prediction = result.summary = None
            nearness, previous = stabilise.apply(prediction, kind, params, previous, clip)
            written.append(self.submit(replace(job, nearness=nearness), settings))
        for future in written:
            self.report(future.result())


def _progress(total: int):  # noqa: ANN202 - tqdm or its stand-in
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", disable=total < 10 or not sys.stderr.isatty(), file=sys.stderr)
