"""What `once` was given: the files named (folders expanded, its own outputs left out), the range, where outputs go.

A name that is not there is refused here, before the model loads: it is a
typing mistake, not a frame that vanished. The farm's job bundles check
their input with these same functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from depthwatch.config import OutputConfig, WatchConfig
from depthwatch.errors import ConfigError, FrameError, InputError
from depthwatch.frames import ownership
from depthwatch.frames.rules import Rules
from depthwatch.imaging.formats import EXTENSIONS
from depthwatch.logtext import shown
from depthwatch.media.video import CLIP_EXTENSIONS, is_clip_name

#: Beside each input unless -o says otherwise; a fixed name would collide across inputs.
DEFAULT_TEMPLATE = "{stem}_depth.jpg"

#: A clip's depth clip, beside it unless -o says otherwise.
DEFAULT_CLIP_TEMPLATE = "{stem}_depth.mov"


def frame_range(spec: str) -> set[int]:
    """The frame numbers `--frames` names (1001-1100, 1001-1100x2, 1001,1005); ConfigError for one it cannot read."""
    from depthwatch.frames import sequences

    try:
        return sequences.frame_range(spec)
    except ValueError as exc:
        raise ConfigError(f"--frames: {exc}") from None


def in_range(sources: list[Path], spec: str) -> list[Path]:
    """The numbered frames among `sources` whose number is in the range `spec`."""
    from depthwatch.frames import sequences

    wanted = frame_range(spec)
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


def names_clip_output(output: str) -> bool:
    """Whether -o names a depth clip (.mov, .mkv, .mp4) or an image-sequence template."""
    from depthwatch.media import cliptemplates, clipwrite

    return clipwrite.kind_for(Path(output).suffix) is not None or cliptemplates.is_sequence(output)


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
    rules, not by a word in the name) are left out, and `left_out` gets a line
    for the files named as -o names maps. A name that is not there is refused.
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
                if ownership.is_depth_map(p) or is_depth_clip(p):  # a map or depth clip made under another -o
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


def is_depth_clip(path: Path) -> bool:
    """Whether the input `path` is a depth clip depthwatch made (`ownership.is_depth_clip`), whatever its name.

    Asked of every file `once` is given: only of clips by name, and where PyAV
    is missing no clip is taken as one (it is refused for that, in its own line).
    """
    if not is_clip_name(path):
        return False
    try:
        return ownership.is_depth_clip(path)
    except FrameError:  # no PyAV: the clip is refused for that, with its own line
        return False
