"""An Open Job Description job for depthwatch's range tasks: the template, this shot's values, the asset references.

A farm manager runs jobs, not commands: Deadline Cloud takes an OpenJD job
bundle as it is (`deadline bundle submit DIR`), and `openjd run` runs one
here, task by task, as a farm would. `jobbundle` writes these three as its files:

- the template (`jobtemplate-2023-09`): the job's parameters and steps. A
  clip is a step of range tasks (`once CLIP --frames A-B`, each making its
  range's segment, `batch.rangetasks`), cut by OpenJD's own task chunking
  (`CHUNK[INT]`, contiguous chunks of `ChunkSize` frames), then a join step
  that depends on it (`once CLIP --join`). A folder of numbered frames is one
  step of range tasks over its frame numbers (`once DIR --frames A-B`). Both
  kinds of range task look past their range for the shot planner, so the
  maps do not depend on where the job is cut.
- this shot's values, in Deadline Cloud's form (`parameterValues: [{name, value}]`):
  the only part with this machine's paths.
- the asset references, in Deadline Cloud's form, empty: every path the job
  reads or writes is a job parameter with its `dataFlow`, which is what job
  attachments and path mapping follow.

The template names no file of this machine: paths are parameters, so the
same template serves another shot with other values, and a node that sees
the storage under other paths gets them mapped. The tasks run `depthwatch`
from the node's PATH (a queue environment, a rez or conda package), or the
command the `DepthwatchCommand` parameter names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthwatch.imaging.normalise import MODES

#: Frames a task maps, by default: about a minute of work on a CPU node. A range task decodes
#: and runs the model on up to 53 frames past each edge of its range too (the shot planner's
#: view), and renders and encodes its own: measured on 2 shared cores (1080p ProRes, FastDepth
#: int8), a 20-frame task seeing 73 frames took 9.8 s in all, so a 100-frame task, seeing up to
#: 206, about half a minute with FastDepth and more with the larger MiDaS models. Smaller chunks
#: spend more of each task on that margin and on starting; larger ones lose more when a node goes.
CHUNK = 100

#: The step names, as a farm's monitor shows them.
MAP_STEP = "Map"
JOIN_STEP = "Join"

#: once's options a bundle carries as job parameters (their values this run's, from the
#: command line or the config): (option, parameter, OpenJD type, allowed values).
OPTIONS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("normalise", "Normalise", "STRING", MODES),
    ("refine", "Refine", "STRING", ("edges", "none")),
    ("near", "Near", "STRING", ()),
    ("far", "Far", "STRING", ()),
    ("gamma", "Gamma", "FLOAT", ()),
)


@dataclass(frozen=True)
class Job:
    """What the job maps, and how: read from `once`'s command line and checked (`jobbundle`)."""

    #: A clip, or the folder holding the numbered frames.
    input: Path
    clip: bool
    #: The frame numbers the range tasks cover, as an OpenJD range (`0-239`, `1001-1050,1060-1100`).
    frames: str
    #: -o as given (None: the maps beside the input, as `once` puts them).
    output: str | None
    #: A catalogue name, or the model file's absolute path.
    model: str
    #: The config file `once` read (None: the built-in defaults): every task reads it too.
    config: Path | None = None
    profile: str | None = None
    #: once's options (`OPTIONS`), each with this run's value: {"gamma": 1.0, ...}.
    options: dict[str, Any] = field(default_factory=dict)
    #: Timelines beside the joined depth clip (`--timeline`).
    timeline: bool = False
    chunk: int = CHUNK

    @property
    def model_is_path(self) -> bool:
        from depthwatch.model.catalogue import is_catalogue_name

        return not is_catalogue_name(self.model)


def frame_ranges(numbers: list[int]) -> str:
    """Frame numbers as an OpenJD range: unbroken runs joined by commas (`1001-1050,1060-1100`)."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def template(job: Job) -> dict[str, Any]:
    """The job template (`jobtemplate-2023-09`), with no path of this machine in it."""
    params: list[dict[str, Any]] = [
        {
            "name": "Input",
            "type": "PATH",
            "objectType": "FILE" if job.clip else "DIRECTORY",
            "dataFlow": "IN",
            "description": "The clip to map" if job.clip else "The folder of numbered frames to map",
        },
        {
            "name": "Frames",
            "type": "STRING",
            "minLength": 1,
            "description": "The frame numbers the tasks cover (numbered from output.first_frame for a clip), as an OpenJD range",
        },
        {
            "name": "ChunkSize",
            "type": "INT",
            "default": job.chunk,
            "minValue": 1,
            "description": f"Frames per task ({CHUNK}: about a minute of work on a CPU node)",
        },
    ]
    common: list[str] = []
    output = _output_parameters(job)
    params += [definition for definition, _value in output]
    if output:
        common += ["-o", _output_arg([definition["name"] for definition, _value in output])]
    if job.config is not None:
        params.append({"name": "Config", "type": "PATH", "objectType": "FILE", "dataFlow": "IN",
                       "description": "The depthwatch config file every task reads"})
        common += ["-c", "{{Param.Config}}"]
    kind = {"type": "PATH", "objectType": "FILE", "dataFlow": "IN"} if job.model_is_path else {"type": "STRING", "default": job.model}
    params.append({"name": "Model", **kind, "description": "The depth model: a file, or a catalogue name installed on the nodes"})
    common += ["--model", "{{Param.Model}}"]
    if job.profile is not None:
        params.append({"name": "Profile", "type": "STRING", "default": job.profile, "description": "The model's profile"})
        common += ["--profile", "{{Param.Profile}}"]
    for option, name, kind, allowed in OPTIONS:
        param: dict[str, Any] = {"name": name, "type": kind, "default": _value(job.options[option], kind),
                                 "description": f"once --{option}"}
        if allowed:
            param["allowedValues"] = list(allowed)
        params.append(param)
        common += [f"--{option}", f"{{{{Param.{name}}}}}"]
    params.append({"name": "DepthwatchCommand", "type": "STRING", "default": "depthwatch", "minLength": 1,
                   "description": "The depthwatch command on the nodes (default: depthwatch on their PATH)"})
    ranges = {
        "name": MAP_STEP,
        "parameterSpace": {
            "taskParameterDefinitions": [
                {
                    "name": "Range",
                    "type": "CHUNK[INT]",
                    "range": "{{Param.Frames}}",
                    # Fixed chunks, no target runtime: a task run again (a lost worker's) covers the frames it
                    # covered the first time, so the join finds each frame in one segment.
                    "chunks": {"defaultTaskCount": "{{Param.ChunkSize}}", "rangeConstraint": "CONTIGUOUS"},
                }
            ]
        },
        # One argument: a pre-roll's range (`-3-1`) would read as an option after a separate --frames.
        "script": _script(["once", "{{Param.Input}}", "--frames={{Task.Param.Range}}", *common, "--openjd"]),
    }
    steps = [ranges]
    if job.clip:
        joining = ["once", "{{Param.Input}}", "--join", *common, *(["--timeline"] if job.timeline else []), "--openjd"]
        steps.append({"name": JOIN_STEP, "dependencies": [{"dependsOn": MAP_STEP}], "script": _script(joining)})
    return {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["TASK_CHUNKING"],
        "name": "depthwatch depth clip" if job.clip else "depthwatch depth maps",  # a path could pass the name's 128 characters
        "description": "Depth maps by depthwatch: "
        + ("range tasks make the depth clip's segments, the join puts it together" if job.clip else "range tasks over the frame numbers"),
        "parameterDefinitions": params,
        "steps": steps,
    }


def parameter_values(job: Job) -> dict[str, Any]:
    """This shot's values, in Deadline Cloud's form; the one place with this machine's paths."""
    values: dict[str, Any] = {"Input": str(job.input), "Frames": job.frames, "ChunkSize": job.chunk}
    values.update({definition["name"]: value for definition, value in _output_parameters(job)})
    if job.config is not None:
        values["Config"] = str(job.config)
    values["Model"] = job.model
    if job.profile is not None:
        values["Profile"] = job.profile
    for option, name, kind, _allowed in OPTIONS:
        values[name] = _value(job.options[option], kind)
    return {"parameterValues": [{"name": name, "value": value} for name, value in values.items()]}


def asset_references() -> dict[str, Any]:
    """Deadline Cloud's asset references: none beyond the job's PATH parameters, which say their own dataFlow."""
    return {"assetReferences": {"inputs": {"filenames": [], "directories": []}, "outputs": {"directories": []}, "referencedPaths": []}}


def tasks(job: Job) -> int:
    """How many range tasks the frames make, cut as OpenJD cuts them (contiguous chunks of `chunk`)."""
    count = 0
    for run in job.frames.split(","):
        ends = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", run)
        assert ends is not None, run  # written by frame_ranges
        first, last = int(ends[1]), int(ends[2] or ends[1])
        count += -(-(last - first + 1) // job.chunk)
    return count


def _output_parameters(job: Job) -> list[tuple[dict[str, Any], str]]:
    """The output as job parameters (definition, value): a PATH (dataFlow OUT) for its file or folder, and
    for a name template (`{stem}_depth.png`) a STRING for the name, so path mapping sees only the path."""
    if job.output is None:
        return []
    given = os.path.expanduser(job.output)
    if "{" in given:
        folder, name = os.path.split(given)
        named = ({"name": "OutputName", "type": "STRING", "default": name,
                  "description": "The maps' names ({stem}, {frame:04d}, ...), as once -o takes them"}, name)
        if not folder:  # beside the input, as once puts a bare name
            return [named]
        return [({"name": "Output", "type": "PATH", "objectType": "DIRECTORY", "dataFlow": "OUT",
                  "description": "The folder the maps go to"}, os.path.abspath(folder)), named]
    target = Path(os.path.abspath(given))
    is_file = job.clip and bool(target.suffix) and not target.is_dir()
    return [({"name": "Output", "type": "PATH", "objectType": "FILE" if is_file else "DIRECTORY", "dataFlow": "OUT",
              "description": "The depth clip" if is_file else "The folder the maps go to"}, str(target))]


def _output_arg(names: list[str]) -> str:
    """-o's value in the tasks' command: the folder and the name template joined, or either alone."""
    return "/".join(f"{{{{Param.{name}}}}}" for name in names)


def _value(value: Any, kind: str) -> Any:
    return float(value) if kind == "FLOAT" else str(value)


def _script(args: list[str]) -> dict[str, Any]:
    return {"actions": {"onRun": {"command": "{{Param.DepthwatchCommand}}", "args": args}}}
