"""Which files are frames, where each frame's depth map goes, and the job that says so.

Pure path logic, shared by the watcher, the start-up scan, the API, `once` and
the farm. `Rules.job_for` is the one place a frame's Job is made, with the
folders its reads and writes must stay in. It also keeps depthwatch from
feeding on itself: its outputs, temporary files and sidecars are never frames,
even in the watched folder with a matching pattern.
"""

from __future__ import annotations

import fnmatch
import os
import re
import string
from collections.abc import Iterable
from pathlib import Path

from depthwatch.config import OutputConfig, WatchConfig
from depthwatch.errors import ConfigError, FrameError
from depthwatch.frames import ownership, provenance
from depthwatch.frames.folders import inside
from depthwatch.frames.job import Job, Signature
from depthwatch.imaging.formats import EXTENSIONS, map_format_problem
from depthwatch.logtext import shown
from depthwatch.media import cliprecord, cliptemplates, video

_SIDECAR_SUFFIXES = (".json",)
#: The extensions a frame can have, as written in either case.
_FRAME_EXTENSIONS = tuple(dict.fromkeys(e for ext in EXTENSIONS for e in (ext, ext.upper())))
_CLIP_EXTENSIONS = tuple(dict.fromkeys(e for ext in sorted(video.CLIP_EXTENSIONS) for e in (ext, ext.upper())))


def clips_sharing(other: Path, output: Path) -> str:
    """Why a clip is refused when `other` would get the same depth clip `output`."""
    return (
        f"{shown(other.name)} maps to {shown(output.name)} too; one depth clip would replace the other: "
        "rename one, or name depth clips with {name} in output.clip_template (e.g. '{name}_depth.mov')"
    )


def _template_regex(template: str) -> re.Pattern[str]:
    """A regex matching the file names the output template can produce."""
    name = template.replace("\\", "/").rsplit("/", 1)[-1]
    parts = []
    for literal, field, _, _ in string.Formatter().parse(name):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append("[^.]+" if field == "ext" else ".+")
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)  # a name may hold a newline: `.` must take it


class Rules:
    """Watch folders, patterns and the output template, applied to paths."""

    def __init__(self, watch: WatchConfig, output: OutputConfig) -> None:
        self.roots = tuple(Path(os.path.abspath(f)) for f in watch.folders)
        #: As written (`POST /predict` with no frame named takes the first as the file name);
        #: matched without regard to case.
        self.patterns = tuple(watch.patterns)
        self._lower_patterns = tuple(p.lower() for p in watch.patterns)
        self.recursive = watch.recursive
        self.follow_symlinks = watch.follow_symlinks
        self.template = output.template
        self.png_bits = output.png_bits
        self._output_name = _template_regex(output.template)
        # A clip's depth clip: a file, or an image sequence's frames in a folder of their own.
        self.clip_template = output.clip_template
        self._clip_name = _template_regex(output.clip_template)
        clip_folder = os.path.dirname(output.clip_template)
        sequence = cliptemplates.is_sequence(output.clip_template) and clip_folder
        self._clip_folder = _template_regex(clip_folder) if sequence else None
        # The clip template's fixed absolute folder (before any field) is allowed for its outputs.
        fixed_parts = []
        for part in Path(clip_folder).parts:
            if "{" in part:
                break
            fixed_parts.append(part)
        fixed_clip = Path(*fixed_parts) if fixed_parts else None
        self._clip_root = Path(os.path.abspath(fixed_clip)) if fixed_clip is not None and fixed_clip.is_absolute() else None
        self.error_records = output.error_sidecar
        # The template's folder part (~ and $VARS already expanded when the config was read):
        # none (beside the frame), fixed, or built from fields.
        folder = os.path.dirname(output.template)
        self._fixed_folder = Path(folder) if folder and "{" not in folder else None
        absolute = self._fixed_folder is not None and self._fixed_folder.is_absolute()
        # A fixed absolute folder is allowed for outputs besides the watch folders.
        self._extra_root = Path(os.path.abspath(self._fixed_folder)) if absolute else None

    def root_of(self, path: Path) -> Path | None:
        """The watch folder `path` belongs to (directly, or below it when recursive)."""
        for root in self.roots:
            if path.parent == root:
                return root
            if self.recursive and root in path.parents:
                return root
        return None

    def is_own_file(self, path: Path) -> bool:
        """Outputs, temporary files and sidecars: never input.

        By name, and by mark, whatever the templates say now: a file inside one
        of depthwatch's temporary folders (a sequence being written, or the last
        one swapped out) or beside a sequence marker (a finished sequence).
        Maps and sequence frames carry a record too, which the daemon reads
        before taking a frame, and depth clips their mark: what a file carries
        is `ownership`'s question, this one is asked by name.
        """
        if path.name.lower().endswith(_SIDECAR_SUFFIXES) or ownership.is_temporary(path):
            return True
        if ownership.in_depth_sequence(path):  # also a finished sequence's folder itself (pattern `*`)
            return True
        if self._is_clip_output(path):
            return True
        return self.named_as_map(path)

    def named_as_map(self, path: Path) -> bool:
        """Whether `path` is where output.template puts a map (its name, and its folder where the template fixes one).

        A user's own file may be named so too (`photo_depth.png`): never taken as a
        frame all the same, but then it is the name, not the file, that is depthwatch's.
        """
        if not self._output_name.fullmatch(path.name):
            return False
        fixed = self._fixed_folder
        if fixed is None:
            return True
        if fixed.is_absolute():
            return path.parent == Path(os.path.abspath(fixed))
        return Path(os.path.abspath(path.parent)).parts[-len(fixed.parts) :] == fixed.parts

    def _is_clip_output(self, path: Path) -> bool:
        if not self._clip_name.fullmatch(path.name):
            return False
        if self._clip_folder is None:  # a clip file, named by the template
            return True
        return bool(self._clip_folder.fullmatch(path.parent.name))

    @staticmethod
    def is_clip(path: Path) -> bool:
        """A clip (by its extension): it becomes a clip job, with output.clip_template's output."""
        return video.is_clip_name(path)

    def is_frame(self, path: Path) -> bool:
        name = path.name
        if self.root_of(path) is None or self.is_own_file(path):
            return False
        if name.startswith(".") and not any(p.startswith(".") for p in self.patterns):
            return False  # hidden files (editor temporaries, .DS_Store) unless asked for
        lower = name.lower()
        return any(fnmatch.fnmatchcase(lower, pattern) for pattern in self._lower_patterns)

    def output_for(self, source: Path) -> Path:
        """Where the depth map of `source` goes; FrameError if that leaves the allowed folders."""
        # The frame's name goes in literally: a frame called $HOME.jpg or ~x.jpg is no path to expand.
        if self.is_clip(source):  # an image sequence's output keeps its {frame} field
            text = cliptemplates.fill(self.clip_template, source)
        else:
            text = self.template.format(stem=source.stem, name=source.name, ext=source.suffix.lstrip("."))
        output = Path(os.path.abspath(source.parent / text))
        # Real paths: a symlinked subfolder must not carry an output outside either.
        if not inside(output.parent, self.output_roots(source)):
            raise FrameError(f"its output {output} would be outside the configured folders; not writing it")
        if output == source:
            raise FrameError("its output would overwrite the frame itself; change output.template")
        problem = map_format_problem(self.template, source.suffix, self.png_bits)
        if problem:  # before a byte is read, not as the map is encoded
            raise FrameError(problem)
        return output

    def clip_output_for(self, source: Path) -> Path:
        """`output_for` a clip found in a watch folder; FrameError too if a clip beside it gets the same one."""
        output = self.output_for(source)
        other = self._sharing(source)
        if other is not None:
            raise FrameError(clips_sharing(other, output))
        return output

    def output_folders(self) -> list[Path]:
        """The folders depthwatch writes into, as far as they exist now: where its temporary files can be.

        The watch folders, and the folders the two templates name from them (a
        fixed `out/`, or each subfolder a field like `{stem}_depth` matches);
        an absolute template's from its own fixed folder. A temporary file is
        written beside its final name, or beside the sequence's folder for a
        sequence's frames. With watch.recursive every folder below a watch
        folder is one too: the caller walks them.
        """
        found: dict[Path, None] = dict.fromkeys(self.roots)
        for template in (self.template, self.clip_template):
            folder = os.path.dirname(template)
            if cliptemplates.is_sequence(template):
                folder = os.path.dirname(folder)
            if not folder:
                continue
            parts = Path(folder).parts
            bases = [Path(parts[0])] if Path(folder).is_absolute() else list(self.roots)
            for part in parts[1:] if Path(folder).is_absolute() else parts:
                if "{" not in part:
                    bases = [Path(os.path.abspath(b / part)) for b in bases]
                    continue
                field = _template_regex(part)
                nxt = []
                for base in bases:
                    try:
                        nxt.extend(Path(e.path) for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and field.fullmatch(e.name))
                    except OSError:
                        continue
                bases = nxt
            found.update(dict.fromkeys(b for b in bases if b.is_dir()))
        return list(found)

    def output_roots(self, source: Path) -> tuple[Path, ...]:
        """The folders the output of `source` must really lie in when it is written."""
        extra = self._clip_root if self.is_clip(source) else self._extra_root
        return tuple(r for r in (self.root_of(source), extra) if r is not None)

    def error_record_for(self, source: Path, output: Path) -> Path | None:
        if not self.error_records:
            return None
        return output.with_name(f"{source.name}.error.json")

    def job_for(
        self, source: Path, signature: Signature | None = None, format: str | None = None
    ) -> Job:
        """The job for frame `source`: its output, error record, and the folders its read and write stay in.

        A symlinked frame is followed only to inside its watch folder (unless
        watch.follow_symlinks), and the map only lands inside the folders the
        rules allow, both checked again when the frame is read and the map
        written. FrameError if the output would leave those folders, or if
        another frame beside it would get the same map (see `_sharing`).
        `signature` and `format`: what the watcher learned of this version.
        """
        job = self._job(source, signature, format)
        other = self._sharing(source)
        if other is not None:
            raise FrameError(
                f"{shown(other.name)} maps to {shown(job.output.name)} too; one map would replace the other: "
                "rename one, or name maps with {name} in output.template (e.g. '{name}_depth.png')"
            )
        return job

    def _job(self, source: Path, signature: Signature | None = None, format: str | None = None) -> Job:
        output = self.output_for(source)
        return Job(
            source,
            output,
            self.error_record_for(source, output),
            signature,
            format,
            link_root=None if self.follow_symlinks else self.root_of(source),
            output_roots=self.output_roots(source),
        )

    def _sharing(self, source: Path) -> Path | None:
        """Another frame beside `source` whose map would be the same file (`A.jpg`, `A.tif` under `{stem}`;
        for a clip, `A.mp4` and `A.mov` under output.clip_template's `{stem}`).

        Only where the name comes from the stem alone: a fixed name (`depth.jpg`)
        is one map for every frame on purpose, the classic live preview.
        """
        clip = self.is_clip(source)
        template = self.clip_template if clip else self.template
        if "{stem}" not in template or "{ext}" in template or "{name}" in template:
            return None
        for ext in _CLIP_EXTENSIONS if clip else _FRAME_EXTENSIONS:
            other = source.with_suffix(ext)
            if other.name == source.name or not os.path.exists(other) or not self.is_frame(other):
                continue
            try:
                if os.path.samefile(other, source):  # the same file by another case (a case-blind disk)
                    continue
            except OSError:
                continue
            return other
        return None

    def jobs_for(self, sources: Iterable[Path]) -> tuple[list[Job], list[tuple[Path, str]]]:
        """Jobs for a batch of frames named at once (`once`), and the frames refused, with why.

        ConfigError, before anything is written, if two frames map to one output
        (`A.0001.jpg` and `A.0001.tif` under `{stem}_depth.jpg`): one map would
        replace the other. A frame whose output is another input is refused too.
        """
        jobs: list[Job] = []
        refused: list[tuple[Path, str]] = []
        sources = list(sources)
        inputs = {os.path.realpath(s) for s in sources}
        claims = Claims()
        for source in sources:
            try:
                job = self._job(source)  # frames named together: compared with each other below
            except FrameError as exc:
                refused.append((source, str(exc)))
                continue
            real = os.path.realpath(job.output)
            if real in inputs:  # another input's name, or this one's by another path
                refused.append((source, f"its output {shown(job.output)} is an input frame; writing it would replace that frame: give another -o"))
                continue
            if claims.claim(job.output, source, "map", ".jpg"):
                jobs.append(job)
        return jobs, refused

    def link_allowed(self, path: Path) -> bool:
        """A symlink is followed only if it stays inside its watch folder (or if allowed)."""
        if self.follow_symlinks or not path.is_symlink():
            return True
        root = self.root_of(path)
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return False
        return root is not None and inside(target, (root,), strictly=True)


class Claims:
    """Outputs claimed by inputs named together (`once`): two inputs for one output is a clash.

    Outputs and inputs are compared by real path: two names of one output
    clash, and one input named twice (by two paths) is one job.
    """

    def __init__(self) -> None:
        self._owner: dict[str, Path] = {}

    def claim(self, output: Path, source: Path, what: str, ext: str, after: str = "") -> bool:
        """Whether `source` makes `output` (False: it was named already); ConfigError if another input does.

        `what` the output is ("map", "depth clip"), `ext` its example's, `after` what the message ends with.
        """
        first = self._owner.setdefault(os.path.realpath(output), source)
        if first is source:
            return True
        if os.path.realpath(first) == os.path.realpath(source):
            return False  # the same input named twice: one job
        raise ConfigError(
            f"{shown(first)} and {shown(source)} both map to {shown(output)}; one {what} would replace the other: "
            f"name outputs with {{name}} (e.g. -o '{{name}}_depth{ext}') or leave one out{after}"
        )


#: Stems a frame pattern's `*` is tried with when looking for a clash with the output template.
_SAMPLE_STEMS = ("shot", "A001_C002_0101AB", "frame_1001")


def template_clashes(patterns: tuple[str, ...], template: str) -> list[str]:
    """The frame patterns whose every name the output template could also produce.

    With patterns `*.jpg` and `*.png` and the template `{stem}.png`, each PNG
    frame looks like the map of a JPEG frame: it is never mapped, and the
    map of shot.jpg would be named shot.png, the name of a frame. (Such a
    file is never replaced, since it carries no depthwatch record; the
    daemon says so once at start.) A pattern with a character class is not
    tried.
    """
    output = _template_regex(template)
    clashing = []
    for pattern in patterns:
        if "[" in pattern:
            continue
        samples = [pattern.replace("*", stem).replace("?", "x") for stem in _SAMPLE_STEMS]
        if all(output.fullmatch(name) for name in samples):
            clashing.append(pattern)
    return clashing


def map_is_current(source: Path, output: Path, made_with: str | None = None, model: str | None = None) -> bool:
    """Whether `output` is a map of the version of `source` now on disk: no new map is needed.

    The map's own record says which version it was made from (see `provenance`),
    so a map that landed after a newer frame (a kill between the two) is still
    stale; a map without a record (older depthwatch, EXR) counts when it is no
    older than the frame. The daemon's start-up scan and `once --farm`'s resume
    use this same rule. `made_with` (`Settings.made_with`): a map is current only
    if its record says it was made with these very settings too (`once --farm`,
    where the command line may have changed them since); `model` (a model file's
    name): and by that model (the farm's workers run their own). A depth clip
    names the clip version it was made from in its comment, an image sequence
    in its frames' records: a clip replaced by another take whose file is dated
    earlier (a card copy keeps its date) is not "up to date" by its date.
    """
    if "{frame" in output.name:  # an image sequence: its folder, renamed into place when whole
        output = output.parent
    try:
        frame = source.stat()
        if output.is_dir():  # a clip's image sequence: its frames' record, which names the clip's version
            record = _a_frames_record(output)
            if record is not None and "size" in record:
                return provenance.same_clip_version(record, frame)
            return output.stat().st_mtime_ns >= frame.st_mtime_ns
        if video.is_clip_name(output):  # a depth clip: the version its comment names; by time where it names none (an older one's)
            # Size and mtime, not the inode: a clip is hours of work to map again, and a share that
            # gives new inodes at each reconnect, a copy with `cp -a`, or a farm worker's view of the
            # file would have it mapped again with nothing changed.
            made = cliprecord.made_from(output)
            if made is not None:
                return made[:2] == (frame.st_size, frame.st_mtime_ns)
            return output.stat().st_mtime_ns >= frame.st_mtime_ns
        record = provenance.read(output)
        if record is not None:
            return (
                provenance.same_version(record, frame)
                and made_with in (None, record.get("made_with"))
                and model in (None, record.get("model"))
            )
        return made_with is None and output.stat().st_mtime_ns >= frame.st_mtime_ns
    except OSError:
        return False


def _a_frames_record(folder: Path) -> dict[str, object] | None:
    """The record of one frame of the image sequence in `folder` (they all name the same clip version)."""
    frames = cliprecord.marked_frames(folder)
    if frames is None:
        return None
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if frames.fullmatch(entry.name):
                    return provenance.read(Path(entry.path))
    except OSError:
        return None
    return None
