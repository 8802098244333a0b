"""`depthwatch once`: run files or folders of frames through the engine and exit.

Numbered frames (`shot_1001.jpg`, see `sequences`) are a sequence: with
`output.normalise: stable` each frame goes through twice. Pass 1 runs the
model and keeps its small stabilise.Summary and its prediction (float16 at
model resolution); the shot planner (`stabilise.stabilised`, which the farm
shares) takes them in frame order, finds the cuts with a few frames of
look-ahead, and gives each frame's map back once the frames it depends on are
in; pass 2 renders and writes it. Both passes run together, a bounded number
of frames apart, so a sequence of any length holds a few dozen predictions.
Stills, and everything in `frame` mode, get their own map each, exactly as
the daemon's per-frame path makes it.

Clips (`shot.mov`, `A001.mp4`: see `imaging.video`) become depth clips of the
same length, rate, timecode, size and pixel aspect (`clips`), by
default `{stem}_depth.mov` beside the clip; `-o` names another file, folder or
template, and its extension picks the codec.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.config import OutputConfig, WatchConfig
from depthwatch.errors import ConfigError, DepthwatchError, FrameError, InputError
from depthwatch.farm.jobtemplate import CHUNK
from depthwatch.frames import provenance
from depthwatch.frames.replacing import map_refusal_at
from depthwatch.frames.rules import Claims, Rules
from depthwatch.imaging.formats import EXTENSIONS
from depthwatch.imaging.video import CLIP_EXTENSIONS, is_clip_name
from depthwatch.imaging.normalise import FRAME, MODES, STABLE
from depthwatch.logtext import shown

HELP = "write depth maps for the given frames (files or folders) and exit"

#: Beside each input unless -o says otherwise; a fixed name would collide across inputs.
DEFAULT_TEMPLATE = "{stem}_depth.jpg"

#: A clip's depth clip, beside it unless -o says otherwise.
DEFAULT_CLIP_TEMPLATE = "{stem}_depth.mov"

log = logging.getLogger("depthwatch.once")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, clips (.mov, .mp4, .mkv, .mxf...), or folders of them")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUTPUT",
        help="output file (one input), folder, or name template like '{stem}_depth.png' "
        f"(default: {DEFAULT_TEMPLATE} beside each input; for a clip {DEFAULT_CLIP_TEMPLATE}). For a clip the "
        "extension picks the codec: .mov ProRes 422 HQ, .mkv FFV1 16-bit, .mp4 H.264 preview, "
        "or an image sequence '{stem}_depth/{frame:04d}.png' (.tif, .exr)",
    )
    parser.add_argument(
        "--frames",
        metavar="RANGE",
        help="only the numbered frames in RANGE, as render-farm managers cut a job: 1001-1100, 1001-1100x2, 1001,1005; "
        "for a clip, one range of its frames (numbered from output.first_frame) made as a segment for --join",
    )
    parser.add_argument(
        "--join",
        action="store_true",
        help="for a clip: join the segments that `once CLIP --frames A-B` tasks made into the depth clip -o names (see docs/farm.md)",
    )
    parser.add_argument(
        "--farm",
        metavar="SCHEDULER_ADDRESS",
        help="send the frames to a render farm's Dask scheduler (tcp://host:8786) instead of mapping them here; "
        "maps already up to date are skipped, so running it again resumes an interrupted job",
    )
    parser.add_argument("--force", action="store_true", help="with --farm: map every frame, even those up to date")
    parser.add_argument(
        "--job-bundle", metavar="DIR", help="map nothing: write into DIR an Open Job Description job bundle of range tasks "
        "(and a join, for a clip) that a farm runs: deadline bundle submit DIR, or openjd run (see docs/farm.md)",
    )
    parser.add_argument("--chunk", metavar="FRAMES", type=int, help=f"with --job-bundle: frames per task (default {CHUNK}, about a minute on a CPU node)")
    parser.add_argument("--openjd", action="store_true", help="print OpenJD's progress and status lines (a job bundle's tasks pass it)")
    parser.add_argument(
        "--timeline", action="store_true", help="beside each depth clip, a timeline with the clip on V1 and its depth clip on V2 (.otio, .fcpxml)"
    )
    levels = parser.add_argument_group("how the map looks (override the config's output section)")
    levels.add_argument("--refine", metavar="MODE", help="edges (depth edges follow the frame's) or none (plain upscale)")
    levels.add_argument("--near", metavar="LEVEL", help="the level shown white: a fraction 0..1 of the range, or a percentile like 80%%")
    levels.add_argument("--far", metavar="LEVEL", help="the level shown black: a fraction 0..1 of the range, or a percentile like 20%%")
    levels.add_argument("--gamma", metavar="G", type=float, help="midtones: above 1 brighter, below 1 darker (0.1..10)")
    levels.add_argument(
        "--normalise",
        choices=MODES,
        help="stable: numbered frames are normalised over each shot as a whole; "
        "frame: each map on its own (overrides output.normalise)",
    )
    add_config_arguments(parser)


def in_range(sources: list[Path], spec: str) -> list[Path]:
    """The numbered frames among `sources` whose number is in the range `spec`."""
    from depthwatch.frames import sequences

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


def template_for(output: str | None, single: bool, default: str = DEFAULT_TEMPLATE) -> str:
    """The output template `-o` stands for: a file (one input), a folder, or a template."""
    if output is None:
        return default
    if "{" in output:
        # A bare name goes beside each input; a path with a folder is taken from the
        # current folder, as every command-line tool takes paths.
        folder, name = os.path.split(os.path.expanduser(output))
        return os.path.join(os.path.abspath(folder), name) if folder else output
    target = Path(output).expanduser()
    if single and target.suffix and not target.is_dir():
        return str(target.absolute())
    return str(target.absolute() / default)


def rules_for(
    folders: Iterable[Path], template: str, clip_template: str = DEFAULT_CLIP_TEMPLATE, error_sidecar: bool = False
) -> Rules:
    """The daemon's own rules, with the inputs' folders as watch folders.

    So `once` names outputs, keeps them inside the allowed folders and tells
    its own earlier outputs from frames exactly as the daemon does, and
    writes (and removes) the error records `output.error_sidecar` asks for.
    """
    roots = tuple(dict.fromkeys(Path(os.path.abspath(f)) for f in folders)) or (Path.cwd(),)
    # A frame named on the command line is taken where its link leads: the user chose it.
    return Rules(
        WatchConfig(folders=roots, patterns=("*",), follow_symlinks=True),
        OutputConfig(template=template, clip_template=clip_template, error_sidecar=error_sidecar),
    )


def collect_inputs(
    inputs: list[str], template: str, clip_template: str = DEFAULT_CLIP_TEMPLATE, left_out: list[str] | None = None
) -> list[Path]:
    """The frames named, with folders expanded to the images directly inside them.

    Inside a folder, hidden files and depthwatch's own outputs (by the output
    rules, not by a word in the name) are left out. A name that is not there is
    refused here, before the model loads: it is a typing mistake, not a frame
    that vanished.
    """
    missing = [item for item in inputs if not os.path.lexists(os.path.expanduser(item))]
    if missing:
        raise InputError(f"no such file or folder: {', '.join(missing)}; check the path")
    files: list[Path] = []
    for item in inputs:
        path = Path(os.path.abspath(Path(item).expanduser()))
        if path.is_dir():
            own = rules_for([path], template, clip_template)
            named_like_maps = []
            for p in sorted(path.iterdir()):
                if not (p.suffix.lower() in EXTENSIONS or p.suffix.lower() in CLIP_EXTENSIONS):
                    continue
                if not p.is_file() or p.name.startswith("."):
                    continue
                if provenance.read(p) is not None or _is_depth_clip(p):  # a map or depth clip made under another -o
                    continue
                if own.is_own_file(p):  # no record of ours: a user's file, named as -o names maps
                    named_like_maps.append(p.name)
                    continue
                files.append(p)
            if named_like_maps and left_out is not None:
                left_out.append(
                    f"depthwatch: {shown(path)}: left out {len(named_like_maps)} file(s) named as -o names depth maps "
                    f"({', '.join(shown(n) for n in named_like_maps[:3])}{', ...' if len(named_like_maps) > 3 else ''}); "
                    "give them to once by name, or rename them, to map them"
                )
        else:
            files.append(path)
    # A frame named twice (`a.jpg ./a.jpg`, a folder and a link to it) is one frame, one map, counted once;
    # a frame that is a link to another (a held frame, `shot.0004 -> shot.0003`) is a frame of its own.
    seen: set[tuple[str, str]] = set()
    once_each = []
    for f in files:
        key = (os.path.realpath(f.parent), f.name)
        if key not in seen:
            seen.add(key)
            once_each.append(f)
    return once_each


def main(args: argparse.Namespace) -> int:
    from depthwatch.config import check_combinations, override
    from depthwatch.frames import sequences
    from depthwatch.frames.pipeline import Pipeline
    from depthwatch.frames.result import Result
    from depthwatch.frames.settings import Settings
    from depthwatch.model import catalogue
    from depthwatch.model.engine import Engine

    if args.job_bundle and (args.farm or args.frames or args.join or args.force):
        raise ConfigError("--job-bundle writes the whole job's tasks: drop --farm, --frames, --join and --force")
    if args.chunk is not None and (not args.job_bundle or args.chunk < 1):
        raise ConfigError("--chunk goes with --job-bundle and takes a number of frames, 1 or more")
    if args.force and not args.farm:
        raise ConfigError("--force goes with --farm (local once always maps every frame); drop it or add --farm ADDRESS")
    if args.farm and (args.model or args.profile):
        # The workers run the model each was started with; taking these silently would say a model ran that did not.
        raise ConfigError(
            f"{'--model' if args.model else '--profile'} chooses the model for local once; a farm's workers run their own "
            "(depthwatch worker --model PATH): drop it, or start the workers with that model"
        )
    config = config_from_args(args)
    single = len(args.inputs) == 1 and not Path(args.inputs[0]).expanduser().is_dir()
    # -o names a clip's output when it ends like one (or when the only input is a clip), else a frame's.
    for_clips = args.output is not None and (_names_clip_output(args.output) or (single and is_clip_name(Path(args.inputs[0]))))
    if for_clips:
        config = override(config, "-o", "output", clip_template=template_for(args.output, single, DEFAULT_CLIP_TEMPLATE))
    else:
        config = override(config, "-o", "output", template=template_for(args.output, single))
    for key in ("refine", "near", "far", "gamma", "normalise"):
        if getattr(args, key) is not None:
            config = override(config, f"--{key}", "output", **{key: getattr(args, key)})
    if args.timeline:
        config = override(config, "--timeline", "output", timeline=True)
    check_combinations(config)
    left_out: list[str] = []  # said once the run is not refused (a refusal is its one line)
    sources = collect_inputs(args.inputs, config.output.template, config.output.clip_template, left_out)
    if not sources:
        _say(left_out)  # what was there, and why it was left out
        raise ConfigError("no frames found in " + ", ".join(args.inputs) + "; give image files, clips or folders of them")
    clips = [s for s in sources if is_clip_name(s)]
    sources = [s for s in sources if not is_clip_name(s)]
    if for_clips and sources:
        # -o named a depth clip or an image sequence: a still's map would otherwise go, unasked, to
        # the frame template's default name, and the run would say it was written.
        raise ConfigError(
            f"-o {shown(args.output)} names a depth clip or an image sequence, and {shown(sources[0])} is not a clip "
            f"({' '.join(sorted(CLIP_EXTENSIONS))}); map stills with an image name or a folder for -o "
            "(.jpg, .png, .tif, .exr), clips in a run of their own"
        )
    if (args.join or (clips and args.frames)) and (args.farm or sources or not clips or (args.join and args.frames)):
        raise ConfigError("--frames on clips and --join are a farm manager's tasks: clips only, without --farm, one of the two at a time")
    if clips:
        from depthwatch.imaging.video import require_av

        try:
            require_av()
        except FrameError as exc:
            raise ConfigError(str(exc)) from None
    clip_jobs, clip_refused = _clip_jobs(clips, config)  # ConfigError, before any work, for a clash
    if args.job_bundle:  # the job written for a farm to run (farm.jobbundle), nothing mapped
        from depthwatch.farm import jobbundle

        if sources:  # outputs that clash are said now, not by every task
            _refuse_replacing(rules_for((s.parent for s in sources), config.output.template).jobs_for(sources)[0])
        collect = partial(collect_inputs, template=config.output.template, clip_template=config.output.clip_template)
        return jobbundle.write_for(Path(args.job_bundle), config, clip_jobs, clip_refused, sources, args.output,
                                   chunk=args.chunk, timeline=args.timeline, collect=collect, left_out=left_out)
    if clips and (args.frames or args.join):  # a farm manager's own tasks (farm.managed)
        from depthwatch.farm import managed

        for line in clip_refused:
            print(f"depthwatch: {line}", file=sys.stderr)
        return 1 if managed.run(clip_jobs, args.frames, args.join, config, task=args.openjd) or clip_refused else 0
    if clips and not sources:
        _say(left_out)
        if args.farm:
            return 1 if _farm_clips(args.farm, clip_jobs, clip_refused, config, args.force) else 0
        return 1 if _clips(clip_jobs, clip_refused, config) else 0
    numbered = sources  # every frame named: a range task's shots are planned with the frames about it
    if args.frames:
        sources = in_range(sources, args.frames)
        if not sources:
            raise ConfigError(f"no frames numbered {args.frames} in " + ", ".join(args.inputs) + "; check the range and the names")
    rules = rules_for((s.parent for s in sources), config.output.template, config.output.clip_template, config.output.error_sidecar)
    settings = Settings.from_config(config)
    jobs, refused = rules.jobs_for(sources)  # ConfigError if two frames share an output
    failures = [f"{shown(source)}: {why}" for source, why in refused]
    _refuse_replacing(jobs)
    _say(left_out)
    if not args.farm:  # the farm client sweeps what its workers left, once its job is over
        _sweep_left_behind(job.output for job in jobs)
    began = time.monotonic()
    progress = _progress(len(sources), args.openjd)
    for line in failures:
        progress.write(f"depthwatch: {line}", file=sys.stderr)
        progress.update(1)
    by_source = {job.source: job for job in jobs}
    # Each sequence to plan: its jobs, and the frames whose maps are written (None: all of them).
    planned: list[tuple[list[Any], set[Path] | None]] = []
    if settings.normalise == STABLE and args.frames:
        # A range task's frames belong to the sequences of all the frames named, even one alone in its
        # range (a chunk of one frame): planned with the frames about it, never as a still, here and on the farm.
        for whole in sequences.sequences(numbered)[0]:
            if any(path in by_source for path in whole.paths):
                planned.append(_with_margin(whole, by_source, rules))
    if args.farm:
        from depthwatch.farm import client

        counts = {"up_to_date": 0}
        # The frames about a range, planned with it and not written (`_with_margin`).
        context = [job for sequence_jobs, written in planned for job in sequence_jobs if written and job.source not in written]
        try:
            farm_failures = (
                client.run(args.farm, jobs, config, force=args.force, progress=progress, counts=counts, context=context)
                if jobs else 0
            )
        finally:
            progress.close()
        _summary(len(sources), len(failures) + farm_failures, began, counts["up_to_date"])
        clip_failures = _farm_clips(args.farm, clip_jobs, clip_refused, config, args.force) if clips else 0
        return 1 if failures or farm_failures or clip_failures else 0
    spec = catalogue.resolve(config.model, config.base)

    def report(done: Future[Result]) -> None:
        result = done.result()
        progress.update(1)
        if not result.ok:
            failures.append(result.describe())
            progress.write(f"depthwatch: {result.describe()}", file=sys.stderr)

    if not jobs:  # every frame already failed: no model needed to say so
        progress.close()
        _summary(len(sources), len(failures), began)
        if clips:
            _clips(clip_jobs, clip_refused, config)
        return 1
    if planned:
        in_sequences = {job.source for sequence_jobs, _ in planned for job in sequence_jobs}
        stills = [job.source for job in jobs if job.source not in in_sequences]
    elif settings.normalise == STABLE:
        found, stills = sequences.sequences([job.source for job in jobs])
        planned = [([by_source[p] for p in sequence.paths], None) for sequence in found]
    else:
        stills = [job.source for job in jobs]
    with Engine(spec) as engine:
        engine.wait_ready()
        def started() -> Pipeline:
            return Pipeline(engine, workers=config.daemon.workers, niceness=config.daemon.worker_niceness)

        pipeline = started()
        for source in stills:  # each its own map, exactly the per-frame one
            pipeline.submit(by_source[source], replace(settings, normalise=FRAME)).add_done_callback(report)
        passes = [_sequence(pipeline, sequence_jobs, written, settings, report) for sequence_jobs, written in planned]
        pipeline.close()  # its threads joined, so every pass 2 has reported: the frames rewritten since pass 1 are known
        if any(changed for changed, _shots in passes):
            pipeline = started()
            for changed, shots in passes:
                _again(pipeline, changed, shots, settings, report)
            pipeline.close()
        progress.close()
        clip_failures = _clips(clip_jobs, clip_refused, config, engine) if clips else 0
    _summary(len(sources), len(failures), began)
    return 1 if failures or clip_failures else 0


def _names_clip_output(output: str) -> bool:
    """Whether -o names a depth clip (.mov, .mkv, .mp4) or an image-sequence template."""
    from depthwatch.imaging import clipwrite

    return clipwrite.kind_for(Path(output).suffix) is not None or clipwrite.is_sequence(output)


def _is_depth_clip(path: Path) -> bool:
    """Whether `path` is a depth clip depthwatch made (its container's mark), whatever its name."""
    from depthwatch.imaging import clipwrite

    if not is_clip_name(path):
        return False
    try:
        return clipwrite.is_ours(path)
    except FrameError:  # no PyAV: the clip is refused for that, with its own line
        return False


def _clip_jobs(clips: list[Path], config: Any) -> tuple[list[Any], list[str]]:
    """Each clip's job, and a line for each clip refused; ConfigError, before any work, for a clash.

    Two clips for one depth clip (`A.mp4` and `A.mov` under `{stem}_depth.mov`), or
    an output that is a file depthwatch did not make, stop the run as a clash of
    frames does (nothing is written): a clip refused only after it was mapped
    would have cost its whole length.
    """
    from depthwatch.clips.job import ClipJob
    from depthwatch.frames import timeline
    from depthwatch.imaging import clipwrite

    rules = rules_for((c.parent for c in clips), config.output.template, config.output.clip_template)
    inputs = {os.path.realpath(c) for c in clips}
    jobs: list[Any] = []
    refused: list[str] = []
    claims = Claims()
    for clip in clips:
        try:
            output = rules.output_for(clip)
        except FrameError as exc:
            refused.append(f"{shown(clip)}: {exc}")
            continue
        if os.path.realpath(output) in inputs:
            refused.append(f"{shown(clip)}: its output {shown(output)} is an input clip; give another -o")
            continue
        if _is_depth_clip(clip):
            refused.append(f"{shown(clip)}: is a depth clip depthwatch made; not taken as a clip")
            continue
        job = ClipJob(clip, output)
        if not claims.claim(job.final, clip, "depth clip", ".mov", " (nothing was written)"):
            continue
        if os.path.lexists(job.final) and not clipwrite.is_ours(job.final):
            raise ConfigError(
                f"{shown(clip)}: its output {shown(job.final)} is not a depth clip depthwatch made; "
                "not replacing it: give another -o (nothing was written)"
            )
        why = timeline.refusal(job.final) if config.output.timeline else None
        if why:
            raise ConfigError(f"{shown(clip)}: {why}; give another -o or leave out --timeline (nothing was written)")
        jobs.append(job)
    return jobs, refused


def _clips(jobs: list[Any], refused: list[str], config: Any, engine: Any = None) -> int:
    """Each clip to its depth clip, one after the other, with a progress bar; returns the failures."""
    from depthwatch.clips.make import make_clip
    from depthwatch.frames.settings import Settings
    from depthwatch.model import catalogue
    from depthwatch.model.engine import Engine

    began = time.monotonic()
    for line in refused:
        print(f"depthwatch: {line}", file=sys.stderr)
    failed, frames = len(refused), 0
    settings = Settings.from_config(config)
    _sweep_left_behind(job.final for job in jobs)
    own = engine is None and bool(jobs)
    if own:
        engine = Engine(catalogue.resolve(config.model, config.base)).start()
    try:
        if jobs:
            engine.wait_ready()
        for job in jobs:
            with _ClipBar(job) as bar:
                result = make_clip(job, engine, settings, on_progress=bar.update)
            if result.ok:
                frames += result.frames
            else:
                failed += 1
                print(f"depthwatch: {result.describe()}", file=sys.stderr)
    finally:
        if own:
            engine.stop()
    done = len(jobs) + len(refused) - failed
    print(f"{done} depth clip{'s' if done != 1 else ''} written ({frames} frame{'s' if frames != 1 else ''}), {failed} failed, in {time.monotonic() - began:.1f} s")
    return failed


def _farm_clips(scheduler: str, jobs: list[Any], refused: list[str], config: Any, force: bool) -> int:
    """Each clip to its depth clip on the farm (`farm.clipclient`); returns the failures."""
    from depthwatch.farm import clipclient

    began = time.monotonic()
    for line in refused:
        print(f"depthwatch: {line}", file=sys.stderr)
    failed = len(refused) + (clipclient.run(scheduler, jobs, config, force=force) if jobs else 0)
    done = len(jobs) + len(refused) - failed
    print(f"{done} depth clip{'s' if done != 1 else ''} written on the farm, {failed} failed, in {time.monotonic() - began:.1f} s")
    return failed


class _ClipBar:
    """One tqdm bar per clip: frames, frames a second, time left."""

    def __init__(self, job: Any) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=None, unit="frame", desc=job.source.name, disable=not sys.stderr.isatty(), file=sys.stderr)

    def update(self, progress: Any) -> None:
        if progress.total and self._bar.total != progress.total:
            self._bar.total = progress.total
            self._bar.refresh()
        self._bar.update(progress.done - self._bar.n)

    def __enter__(self) -> _ClipBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bar.close()


def _sweep_left_behind(outputs: Iterable[Path]) -> None:
    """Remove what a killed depthwatch left beside these outputs: its temporary files and sequence folders.

    The daemon sweeps its folders at every start; a `once` killed mid-run has
    no next start of its own, so the next `once` writing beside it sweeps
    instead (only dead writers' files, and a whole sequence a kill left aside
    mid-swap goes back to its name first: `writer.sweep_temp_files`).
    """
    from depthwatch.frames.writer import sweep_temp_files

    for folder in dict.fromkeys(output.parent for output in outputs):
        swept, left = sweep_temp_files(folder)
        if swept:
            log.info("removed %d temporary file(s) a stopped depthwatch left in %s", swept, shown(folder))
        if left:
            log.warning("cannot remove %d temporary file(s) left in %s (is the folder writable?)", left, shown(folder))


def _refuse_replacing(jobs: list[Any]) -> None:
    """ConfigError, before anything is written, if a map would replace a file depthwatch did not make.

    A folder's files named like outputs are left out of the inputs, so under
    `-o '{stem}.png'` the master shot.png beside shot.jpg is no frame, and
    would be shot.jpg's map; a photo x_depth.jpg beside x.jpg likewise. The
    writer refuses such a file anyway; saying so first means nothing at all
    is written under a template that clashes.
    """
    clashes = [(job, reason) for job in jobs if (reason := map_refusal_at(job.output))]
    if not clashes:
        return
    job, reason = clashes[0]
    more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
    raise ConfigError(
        f"{shown(job.source)}: its output {shown(job.output)} {reason}{more}; give another -o (nothing was written)"
    )


def _with_margin(whole: Any, by_source: dict[Path, Any], rules: Rules) -> tuple[list[Any], set[Path]]:
    """A range task's frames of the sequence `whole`, for the shot planner, and those whose maps are written.

    A range task (`--frames 1001-1050`, a farm manager's cut): the planner
    also sees the sequence's frames up to `stabilise.held_at_most()` on each
    side (run through the model, not written), as a clip's range task does,
    so a shot split between two tasks gets the grey levels it gets in one
    run. Before, each task planned its own frames alone and the levels
    jumped at every task's edge (a step between neighbouring maps three to
    five times the usual).
    """
    from depthwatch.imaging import stabilise

    paths = whole.paths
    mine = [i for i, p in enumerate(paths) if p in by_source]
    written = {paths[i] for i in mine}
    around = stabilise.held_at_most()
    seen = paths[max(0, mine[0] - around) : mine[-1] + around + 1]
    try:
        context, _refused = rules.jobs_for([p for p in seen if p not in written])
    except DepthwatchError:  # frames beyond the range that cannot be read as planned: the range alone
        return [by_source[p] for p in paths if p in written], written
    made = {job.source: job for job in context}
    return [by_source[p] if p in written else made[p] for p in seen if p in written or p in made], written


def _sequence(
    pipeline: Any, jobs: list[Any], written_only: set[Path] | None, settings: Any, report: Any, only: set[Path] | None = None
) -> tuple[set[Path], list[list[Any]]]:
    """Model and summary for each frame, then its map and write, in frame order, with bounded memory.

    `stabilise.stabilised` (the shot planner the farm shares) takes the
    frames in order and gives each map back as soon as the frames it depends
    on are in; pass 1 runs at most `pipeline.in_flight` frames ahead of it.
    So the predictions held at once are bounded (`stabilise.held_at_most()`
    plus those in flight), whatever the sequence's length, and none is computed twice.

    Pass 2 reads each frame again and takes only the version pass 1 ran the
    model on (its signature): a frame rewritten in between would otherwise get
    the old version's depth, the new one's edges, and a record naming the new
    one, which no resume would redo. Such frames are added to the first set
    returned as their pass 2 reports (the shots as planned come second, for
    `_again` to map them from the version there now). `only`: that second
    time, over one shot; only these frames are mapped (the rest of the shot
    keeps its maps), and one rewritten yet again fails.
    """
    from depthwatch.imaging import stabilise

    changed: set[Path] = set()
    shots: list[list[Any]] = []

    def written(done: Future[Any]) -> None:
        result = done.result()
        if result.superseded and only is None:  # rewritten since pass 1: its shot is planned again
            changed.add(result.job.source)
            return
        if result.superseded:
            result.error = "changed again while its shot was being mapped again; no map written (map it once it is settled)"
        report(done)

    keep = only if only is not None else written_only  # frames whose maps are written (None: every one)
    collected = report if keep is None else (lambda done: report(done) if done.result().job.source in keep else None)
    kind = pipeline.engine.wait_ready().profile.predicts
    maps = stabilise.stabilised(_collected(pipeline, jobs, settings, collected), kind, settings.render.clip_percent)
    for job, nearness, first in maps:
        if first or not shots:
            shots.append([])
        shots[-1].append(replace(job, signature=None))
        if keep is None or job.source in keep:
            pipeline.submit(replace(job, nearness=nearness), settings).add_done_callback(written)
    return changed, shots


def _again(pipeline: Any, changed: set[Path], shots: list[list[Any]], settings: Any, report: Any) -> None:
    """The frames rewritten between their two passes, mapped from the version there now.

    Their shot goes through both passes again (its plan, its grey levels,
    come from every frame of it), and only they are written.
    """
    for shot in shots:
        if changed.intersection(job.source for job in shot):
            _sequence(pipeline, shot, None, settings, report, only=changed)


def _collected(pipeline: Any, jobs: list[Any], settings: Any, report: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(job, summary, prediction) of each frame that the model ran on, in frame order; a failed one is reported.

    Each job comes back with the signature of the version the model ran on, for pass 2 to read that one.
    """
    ahead: deque[tuple[Any, Future[Any]]] = deque()
    for job in jobs:
        ahead.append((job, pipeline.submit(replace(job, collect=True), settings)))  # blocks while full
        while len(ahead) > pipeline.in_flight:
            yield from _one(*ahead.popleft(), report)
    while ahead:
        yield from _one(*ahead.popleft(), report)


def _one(job: Any, future: Future[Any], report: Any) -> Iterator[tuple[Any, Any, Any]]:
    result = future.result()
    if not result.ok:
        report(future)
        return
    summary, prediction = result.summary, result.prediction
    result.summary = result.prediction = None  # held by the planner from here, and only as long as it needs
    yield replace(job, signature=result.signature), summary, prediction


def _say(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def _summary(frames: int, failed: int, began: float, up_to_date: int = 0) -> None:
    """One line a script (or a person, once the bar is gone) can read: what was done, how long.

    `up_to_date`: maps already made (`once --farm` resuming), not counted as written now.
    """
    done = frames - failed - up_to_date
    already = f", {up_to_date} up to date" if up_to_date else ""
    print(f"{done} depth map{'s' if done != 1 else ''} written{already}, {failed} failed, in {time.monotonic() - began:.1f} s")


def _progress(total: int, openjd: bool = False):  # noqa: ANN202 - tqdm or its stand-in
    from tqdm import tqdm

    if openjd:  # a job bundle's task: OpenJD's lines for the farm's monitor
        from depthwatch.farm.taskprogress import TaskProgress

        return TaskProgress(total)
    return tqdm(total=total, unit="frame", disable=total < 10 or not sys.stderr.isatty(), file=sys.stderr)
