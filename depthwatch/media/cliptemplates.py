"""A depth clip's names and times: its output template filled and checked, and each frame's timecode.

A template names a clip file (`{stem}_depth.mov`) or an image sequence, one
file per frame (`{stem}_depth/{frame:04d}.png`); timecodes count SMPTE 12M's
way, drop-frame included, so frame k of a sequence carries its own.
"""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path

from depthwatch.imaging.exr import FrameMeta
from depthwatch.media.clipwrite import KINDS
from depthwatch.media.video import ClipInfo


def sequence_frame(info: ClipInfo, k: int) -> FrameMeta:
    """Frame k of a clip's image sequence as its EXR says it: its own timecode, the clip's rate and pixel aspect."""
    return FrameMeta(timecode_at(info.timecode, info.rate, k) if info.timecode else None, info.rate, info.shown_sar)


def timecode_frames(timecode: str, rate: Fraction) -> tuple[int, bool] | None:
    """(frames since 00:00:00:00, drop-frame) for a timecode at `rate`; None if it is not one."""
    fields = re.fullmatch(r"(\d\d):(\d\d):(\d\d)([:;.,])(\d\d)", timecode.strip())
    if not fields:
        return None
    h, m, s, f = (int(fields.group(i)) for i in (1, 2, 3, 5))
    fps = max(1, round(rate))
    drop = fields.group(4) in ";," and fps % 30 == 0
    skip = fps // 15 if drop else 0  # numbers skipped a minute: 2 at 29.97, 4 at 59.94
    minutes = 60 * h + m
    return (minutes * 60 + s) * fps + f - skip * (minutes - minutes // 10), drop


def timecode_at(start: str, rate: Fraction, k: int) -> str | None:
    """The timecode `k` frames after `start` (HH:MM:SS:FF; `;` before the frames for drop-frame).

    Drop-frame (29.97 and 59.94) skips frame numbers 0 and 1 (0 to 3 at 59.94)
    at the start of every minute but each tenth, as SMPTE 12M counts. None
    when `start` is not a timecode.
    """
    counted = timecode_frames(start, rate)
    if counted is None:
        return None
    n, drop = counted[0] + k, counted[1]
    fps = max(1, round(rate))
    skip = fps // 15 if drop else 0
    if drop:
        per_ten, per_minute = fps * 600 - skip * 9, fps * 60 - skip
        tens, rest = divmod(n, per_ten)
        n += skip * 9 * tens + (skip * ((rest - skip) // per_minute) if rest > skip else 0)
    f, n = n % fps, n // fps
    s, n = n % 60, n // 60
    m, h = n % 60, (n // 60) % 24
    return f"{h:02d}:{m:02d}:{s:02d}{';' if drop else ':'}{f:02d}"


#: Image formats a clip can be written out as, one file per frame (`{stem}_depth/{frame:04d}.png`).
SEQUENCE_EXTENSIONS = (".png", ".tif", ".tiff", ".exr")


class _FrameField:
    """Stands in for `{frame...}` while the rest of a template is filled, keeping it for later."""

    def __format__(self, spec: str) -> str:
        return "{frame:" + spec + "}" if spec else "{frame}"


def fill(template: str, source: Path) -> str:
    """`template` with the clip's name filled in; a `{frame...}` field is left for each frame."""
    return template.format(stem=source.stem, name=source.name, ext=source.suffix.lstrip("."), frame=_FrameField())


def is_sequence(template: str) -> bool:
    return "{frame" in template.replace("\\", "/").rsplit("/", 1)[-1]


def template_problem(template: str) -> str | None:
    """Why `template` cannot name a depth clip (None: it can)."""
    try:
        rendered = template.format(stem="clip", name="clip.mov", ext="mov", frame=1)
    except (KeyError, IndexError, ValueError) as exc:
        return f"{template!r} uses an unknown field {exc}; use {{stem}}, {{name}}, {{ext}} and, for image sequences, {{frame:04d}}"
    folder, _ = os.path.split(template)
    if "{frame" in folder:
        return f"{template!r}: {{frame}} belongs in the file name, not in a folder"
    suffix = Path(rendered).suffix.lower()
    if is_sequence(template):
        if not folder:
            return f"{template!r}: an image sequence needs a folder of its own, like '{{stem}}_depth/{{frame:04d}}.png'"
        if suffix not in SEQUENCE_EXTENSIONS:
            return f"{template!r}: an image sequence must end in .png, .tif or .exr"
        return None
    if suffix not in KINDS:
        return (
            f"{template!r} must end in .mov (ProRes 422 HQ), .mkv (FFV1 16-bit) or .mp4 (H.264 preview), "
            "or be an image sequence like '{stem}_depth/{frame:04d}.png'"
        )
    return None
