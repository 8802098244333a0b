"""An image sequence of a depth clip's maps: its hidden folder begun, each frame's record, each frame written.

Local `once CLIP` (`make`) and the farm's workers (`clips.rangepass`) write a
clip's image sequence with these same steps, so the two give the same names,
the same pixels and the same per-frame records; `placing.rename_into_place`
then marks the folder whole and swaps it in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch.errors import OutputError
from depthwatch.files import write_new
from depthwatch.frames import provenance
from depthwatch.frames.settings import Settings
from depthwatch.imaging import codec
from depthwatch.logtext import shown
from depthwatch.media import cliprecord, cliptemplates, video


def begin(folder: Path, frame_name: str) -> None:
    """Make the sequence's hidden folder with its marker (not whole yet): known as depthwatch's from the start."""
    try:
        os.mkdir(folder)
        write_new(folder / cliprecord.SEQUENCE_MARKER, cliprecord.marker_text(frame_name).encode())
    except OSError as exc:
        raise OutputError(f"cannot write in {shown(folder.parent)}: {exc.strerror or exc}") from None


def record(source: Path, settings: Settings, model: str) -> dict[str, Any]:
    """The record each frame carries (the source's version, the model's file name): never taken for a frame,
    and known as depthwatch's when replaced."""
    try:
        st = os.stat(source)
    except OSError as exc:
        raise OutputError(f"cannot read {shown(source)}: {exc.strerror or exc}") from None
    return provenance.record_for(source.name, st, model=model, normalise=settings.normalise, invert=settings.render.levels.invert)


def bits(output: Path, settings: Settings) -> int:
    """The bit depth a sequence's maps are rendered at (16 for a depth clip's)."""
    return codec.bits_for(output.suffix, settings.png_bits)


def write_frame(
    folder: Path, output: Path, k: int, depth: np.ndarray, settings: Settings, record: dict[str, Any], meta: video.ClipInfo
) -> None:
    """Frame k of an image sequence (numbered from output.first_frame), into the sequence's temporary folder,
    on disk before the folder is swapped in."""
    data = codec.encode(
        depth, output.suffix, jpeg_quality=settings.jpeg_quality, png_compression=settings.png_compression, exr_options=settings.exr,
        exr_frame=cliptemplates.sequence_frame(meta, k),
    )
    number = settings.first_frame + k
    data = provenance.embed(data, {**record, "frame": number})
    try:
        write_new(folder / output.name.format(frame=number), data)  # fsynced: the swap never brings in frames still in the page cache
    except OSError as exc:
        raise OutputError(f"cannot write frame {number} of {output.parent.name} in {output.parent.parent}: {exc.strerror or exc}") from None
