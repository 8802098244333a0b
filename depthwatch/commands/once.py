"""`depthwatch once`: run files or folders of frames through the engine and exit.

This module reads the arguments and hands the run to `depthwatch.batch`
(inputs, vetting, the frames' plan, mapping here) or to `depthwatch.farm`
(`--farm`, a farm manager's range and join tasks, `--job-bundle`).

Numbered frames (`shot_1001.jpg`, see `sequences`) are a sequence: with
`output.normalise: stable` each frame goes through twice (`batch.passes`).
Stills, and everything in `frame` mode, get their own map each, exactly as
the daemon's per-frame path makes it. Clips (`shot.mov`, `A001.mp4`: see
`media.video`) become depth clips of the same length, rate, timecode, size
and pixel aspect (`clips`), by default `{stem}_depth.mov` beside the clip;
`-o` names another file, folder or template, and its extension picks the codec.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from depthwatch.batch.inputs import DEFAULT_CLIP_TEMPLATE, DEFAULT_TEMPLATE, collect_inputs, names_clip_output, template_for
from depthwatch.batch.progress import say
from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.errors import ConfigError, FrameError
from depthwatch.farm.jobtemplate import CHUNK
from depthwatch.imaging.normalise import MODES
from depthwatch.logtext import shown
from depthwatch.media.video import CLIP_EXTENSIONS, is_clip_name

HELP = "write depth maps for the given frames (files or folders) and exit"


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


def main(args: argparse.Namespace) -> int:
    from depthwatch.batch import cliploop, local, plan, vetting

    _refuse_combinations(args)
    config, for_clips = _config(args)
    left_out: list[str] = []  # said once the run is not refused (a refusal is its one line)
    sources = collect_inputs(args.inputs, config.output.template, config.output.clip_template, left_out)
    if not sources:
        say(left_out)  # what was there, and why it was left out
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
        from depthwatch.media.video import require_av

        try:
            require_av()
        except FrameError as exc:
            raise ConfigError(str(exc)) from None
    clip_jobs, clip_refused = vetting.clip_jobs(clips, config)  # ConfigError, before any work, for a clash
    if args.job_bundle:  # the job written for a farm to run (farm.jobbundle), nothing mapped
        from depthwatch.farm import jobbundle

        return jobbundle.write_for(Path(args.job_bundle), config, clip_jobs, clip_refused, sources, args.output,
                                   chunk=args.chunk, timeline=args.timeline, left_out=left_out)
    if clips and (args.frames or args.join):  # a farm manager's own tasks (batch.rangetasks)
        from depthwatch.batch import rangetasks

        for line in clip_refused:
            print(f"depthwatch: {line}", file=sys.stderr)
        return 1 if rangetasks.run(clip_jobs, args.frames, args.join, config, task=args.openjd) or clip_refused else 0
    if clips and not sources:
        say(left_out)
        if args.farm:
            from depthwatch.farm import batchrun

            return 1 if batchrun.run_clips(args.farm, clip_jobs, clip_refused, config, args.force) else 0
        return 1 if cliploop.run(clip_jobs, clip_refused, config) else 0
    frames = plan.prepare(sources, args.inputs, args.frames, config, left_out, farm=bool(args.farm), openjd=args.openjd)
    if args.farm:
        from depthwatch.farm import batchrun

        return batchrun.run(args.farm, frames, clip_jobs, clip_refused, config, args.force)
    return local.run(frames, config, clip_jobs, clip_refused)


def _refuse_combinations(args: argparse.Namespace) -> None:
    """ConfigError for options that do not go together, before the config is read."""
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


def _config(args: argparse.Namespace) -> tuple[Any, bool]:
    """The config with the command line's options over it, and whether -o names the clips' output."""
    from depthwatch.config import check_combinations, override

    config = config_from_args(args)
    single = len(args.inputs) == 1 and not Path(args.inputs[0]).expanduser().is_dir()
    # -o names a clip's output when it ends like one (or when the only input is a clip), else a frame's.
    for_clips = args.output is not None and (names_clip_output(args.output) or (single and is_clip_name(Path(args.inputs[0]))))
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
    return config, for_clips
