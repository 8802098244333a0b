"""Numbered frames: which files form a sequence, in what order, and frame ranges.

Editors and render farms name the frames of a shot with a number at the end
of the stem: `shot_1001.jpg`, `frame_000123.png`, `A001_C002.0001.exr`. Files
that share a folder, the text before the number and the extension belong to
one sequence and are ordered by that number (not by name: `f_99` comes before
`f_100`). A file with no number, or the only one of its kind, is a still.

Belonging to one sequence says nothing about belonging to one shot: a folder of
camera stills (`IMG_1234.jpg`, `IMG_1240.jpg`) is a "sequence" here too, and the
shot-cut detection downstream is what gives each unrelated still its own map.

`frame_range` reads the VFX range syntax through fileseq, the library that
pipelines (and farm managers: Deadline, OpenCue, Tractor) share it through:
`1001-1100`, `1001-1100x2`, `1100-1001`, `1001-1100y2`, `1001`, and
comma-separated lists of those.

Finding the sequences is not fileseq's (2.x), because its grouping is not
this one: `FileSequence` reads a frame number only after a dot
(`shot.1001.jpg`), so `shot_1001.jpg` and `frame_000123.png` would be stills; `findSequencesInList` splits `f_1.jpg` from `f_01.jpg` by
padding and `.jpg` from `.JPG` by case (one sequence here: a camera's and a
renderer's names mix both); and it takes `.tar.gz` as one extension where
the rest of depthwatch names formats by the last suffix. The grouping below
is one regular expression and a dict, and the tests pin its behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import fileseq

# The stem ends in digits; the prefix is everything before them (it may be empty). A minus
# right after a dot or an underscore is the number's sign, as VFX pipelines (and fileseq)
# write pre-roll: `shot.-003.exr` is frame -3 (read as 3, the pre-roll would be mapped under
# `--frames 1-3`); after anything else it is part of the name (`shot-003` is frame 3).
_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<digits>(?:(?<=[._])-)?\d+)$", re.DOTALL)


@dataclass(frozen=True, order=True)
class FrameName:
    """A file name read as `<prefix><number><suffix>`."""

    prefix: str
    number: int
    suffix: str
    #: The digits as written (`0001`), so padding is kept when names are rebuilt.
    digits: str
    path: Path

    @property
    def key(self) -> tuple[str, str, str]:
        """Files with the same key (folder, prefix, extension) are frames of one sequence."""
        return (str(self.path.parent), self.prefix, self.suffix.lower())


@dataclass(frozen=True)
class Sequence:
    """The frames of one sequence, in frame-number order."""

    frames: tuple[FrameName, ...]

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.frames]

    @property
    def numbers(self) -> list[int]:
        return [f.number for f in self.frames]

    def describe(self) -> str:
        first = self.frames[0]
        return f"{first.prefix}#{first.suffix} {self.frames[0].number}-{self.frames[-1].number} ({len(self.frames)} frames)"


def parse(path: Path) -> FrameName | None:
    """The frame number in `path`'s name, or None for a name without one.

    The suffix is the file's extension (`.jpg`); the number is the run of digits
    that ends the rest of the name. `A001_C002.0001.exr` -> prefix `A001_C002.`,
    number 1.
    """
    suffix = path.suffix
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    match = _NUMBERED.match(stem)
    if match is None:
        return None
    digits = match.group("digits")
    return FrameName(match.group("prefix"), int(digits), suffix, digits, path)


def sequences(paths: Iterable[Path]) -> tuple[list[Sequence], list[Path]]:
    """Split `paths` into numbered sequences (two frames or more) and stills.

    Sequences come in the order of their first appearance in `paths`; a
    sequence's frames in number order; stills in their given order. A number
    that appears twice in one sequence (`f_1.jpg`, `f_01.jpg`) keeps both,
    ordered by name.
    """
    groups: dict[tuple[str, str, str], list[FrameName]] = {}
    stills: list[Path] = []
    order: list[tuple[str, str, str] | Path] = []
    for path in paths:
        name = parse(path)
        if name is None:
            stills.append(path)
            continue
        if name.key not in groups:
            groups[name.key] = []
            order.append(name.key)
        groups[name.key].append(name)
    found: list[Sequence] = []
    for key in order:
        assert isinstance(key, tuple)
        members = groups[key]
        if len(members) == 1:
            stills.append(members[0].path)
        else:
            found.append(Sequence(tuple(sorted(members, key=lambda f: (f.number, f.path.name)))))
    return found, stills


def frame_range(text: str) -> set[int]:
    """The frame numbers in a range spec; ValueError with a readable reason if it is malformed.

    fileseq's reading, the VFX convention: `1001-1100` (both ends included),
    `1001-1100x2` (every second frame from 1001), `1100-1001` (the same frames,
    counted down), `1001-1100y2` (the frames `x2` leaves out), `1001-1100:2`
    (all of them, in a staggered order), `1001`, and comma-separated lists.
    Sub-frames (`1-10x0.5`) are refused: frames on disk have whole numbers.
    """
    if not text.strip():
        raise ValueError("an empty frame range; write FIRST-LAST, FIRST-LASTxSTEP or a number")
    try:
        frames = fileseq.FrameSet(text)
    except fileseq.MaxSizeException:
        raise ValueError(f"{text.strip()!r} holds more than {fileseq.constants.MAX_FRAME_SIZE:,} frames") from None
    except fileseq.ParseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        why = first.rpartition(": ")[2].strip() if ": " in first else ""
        said = f" ({why})" if why and why != "did not match" else ""
        raise ValueError(
            f"{text.strip()!r} is not a frame range{said}; write FIRST-LAST, FIRST-LASTxSTEP or a number"
        ) from None
    numbers = set(frames)
    if any(n != int(n) for n in numbers):
        raise ValueError(f"{text.strip()!r}: sub-frames are not frames on disk; use whole frame numbers")
    return {int(n) for n in numbers}
