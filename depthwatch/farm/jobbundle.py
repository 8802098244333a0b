"""`once INPUT --job-bundle DIR`: the input checked with `once`'s own checks (`batch`), and the job bundle written; nothing mapped.

The bundle is the three files a farm takes (`jobtemplate` says what each
holds): `template.yaml`, `parameter_values.yaml` and `asset_references.yaml`.
An input its tasks could not map fails here, with `once`'s line and exit
code, before any file is written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from depthwatch.batch.inputs import collect_inputs, rules_for
from depthwatch.batch.vetting import refuse_replacing
from depthwatch.errors import ConfigError, FrameError, ModelError, OutputError
from depthwatch.farm import jobtemplate
from depthwatch.farm.jobtemplate import CHUNK, OPTIONS, Job, frame_ranges
from depthwatch.files import atomic_write, why_not_a_file
from depthwatch.logtext import shown
from depthwatch.paths import expand_path

FILES = ("template.yaml", "parameter_values.yaml", "asset_references.yaml")


def write_for(
    folder: Path,
    config: Any,
    clips: list[Any],
    refused: list[str],
    frames: list[Path],
    output: str | None,
    *,
    chunk: int | None,
    timeline: bool,
    left_out: Sequence[str] = (),
) -> int:
    """`once`'s inputs (`clips`: the clips' jobs, `refused`: a line for each clip it refused; `frames`: the
    stills and numbered frames) as one job, written into `folder`; 0. `left_out`: `once`'s lines on files of an
    input folder left out, said once the job is not refused."""
    if frames:  # outputs that clash are said now, not by every task
        refuse_replacing(rules_for((f.parent for f in frames), config.output.template).jobs_for(frames)[0])
    if refused:
        raise FrameError(refused[0])  # the clip's line, and the exit once gives it
    if (clips and frames) or len(clips) > 1:
        raise ConfigError(
            "a job bundle maps one clip, or the numbered frames of one folder; write one bundle per clip or folder"
        )
    model = model_of(config)
    size = chunk or CHUNK
    job = clip_job(clips[0], output, config, model, size, timeline) if clips else frames_job(frames, output, config, model, size)
    for line in left_out:
        print(line, file=sys.stderr)
    written = write(folder, job)
    steps = f"{jobtemplate.tasks(job)} range task(s) of up to {size} frames" + (" then a join" if job.clip else "")
    print(
        f"depthwatch: job bundle {shown(folder)}: {shown(job.input.name)}, frames {job.frames}, {steps}; "
        f"submit it with `deadline bundle submit {shown(folder)}`, or run it here with `openjd run {shown(written[0])}`"
    )
    return 0


def write(folder: Path, job: Job) -> list[Path]:
    """The bundle's three files into `folder` (made if need be), each replaced whole; their paths."""
    if os.path.lexists(folder) and not folder.is_dir():
        raise ConfigError(f"--job-bundle {shown(folder)} is a file, not a folder; give a folder for the bundle")
    texts = {
        "template.yaml": jobtemplate.template(job),
        "parameter_values.yaml": jobtemplate.parameter_values(job),
        "asset_references.yaml": jobtemplate.asset_references(),
    }
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            atomic_write(folder / name, yaml.safe_dump(texts[name], sort_keys=False, width=1000).encode())
            written.append(folder / name)
    except OSError as exc:
        raise OutputError(f"cannot write the job bundle in {shown(folder)}: {exc.strerror or exc}", retryable=False) from None
    return written


def model_of(config: Any) -> str:
    """The config's model as a job parameter's value: a catalogue name, or the file's absolute path;
    ModelError (as `once` gives) for a file that is not there."""
    from depthwatch.model.catalogue import is_catalogue_name

    if is_catalogue_name(config.model.path):
        return str(config.model.path)
    path = expand_path(config.model.path, config.base)
    if not path.is_file():
        raise ModelError(f"model file {path} {why_not_a_file(path)}; check model.path (or --model)")
    return str(path)


def clip_job(clip: Any, output: str | None, config: Any, model: str, chunk: int, timeline: bool) -> Job:
    """The job of one clip's depth clip (`clip`: its `ClipJob`); FrameError or ConfigError for a clip its
    range tasks could not map."""
    from depthwatch.batch import rangetasks
    from depthwatch.clips import read_index

    rangetasks.depth_clip_kind(clip)  # an image sequence is made on one node or with once --farm
    count = len(read_index(clip.source))
    if count == 0:
        raise FrameError(f"{shown(clip.source)}: has no frames to map")
    first = config.output.first_frame
    return Job(clip.source, True, frame_ranges(list(range(first, first + count))), output, model, config.source,
               _profile(config), _options(config), timeline, chunk)


def frames_job(frames: list[Path], output: str | None, config: Any, model: str, chunk: int) -> Job:
    """The job of numbered frames of one folder: the folder, or frames named from it (a sequence's files).

    A range task maps every frame of its folder in its range (`once DIR --frames A-B`), so frames
    named from a folder make a job only when no other frame there shares their numbers.
    """
    from depthwatch.frames import sequences

    folders = {f.parent for f in frames}
    if len(folders) > 1:
        raise ConfigError("a job bundle maps the numbered frames of one folder; write one bundle per folder")
    folder = folders.pop()
    named = {f: sequences.parse(f) for f in frames}
    stills = [f for f, name in named.items() if name is None]
    if stills:
        raise ConfigError(
            f"{shown(stills[0])} has no frame number{f' (and {len(stills) - 1} more)' if len(stills) > 1 else ''}: a job bundle's "
            "tasks map frames by number; map stills with once, or name the frames of a sequence"
        )
    numbers = sorted({name.number for name in named.values() if name is not None})
    folder_frames = collect_inputs([str(folder)], config.output.template, config.output.clip_template)
    others = [p for p in folder_frames if p not in named and (n := sequences.parse(p)) is not None and n.number in set(numbers)]
    if others:
        raise ConfigError(
            f"{shown(folder)} holds other frames numbered as these ({shown(others[0].name)}"
            f"{f' and {len(others) - 1} more' if len(others) > 1 else ''}), which the tasks would map too; "
            "give the folder, or move them to a folder of their own"
        )
    return Job(folder, False, frame_ranges(numbers), output, model, config.source, _profile(config), _options(config), False, chunk)


def _options(config: Any) -> dict[str, Any]:
    """This run's values of the options the job carries: the command line's over the config's."""
    return {option: getattr(config.output, option) for option, *_ in OPTIONS}


def _profile(config: Any) -> str | None:
    return None if config.model.profile in (None, "auto") else str(config.model.profile)
