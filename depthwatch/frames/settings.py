"""The parts of the config one frame needs, frozen per job so a reload applies cleanly to the next."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from depthwatch.config import Config
from depthwatch.frames import reading
from depthwatch.imaging import normalise
from depthwatch.imaging.codec import ExrOptions
from depthwatch.imaging.levels import Levels, parse_level
from depthwatch.imaging.render import Encoding, RenderOptions


@dataclass(frozen=True)
class Settings:
    """How a job reads its frame and makes and writes its map."""

    render: RenderOptions = RenderOptions()
    jpeg_quality: int = 95
    png_bits: int = 16
    png_compression: int = 1
    max_pixels: int = 100_000_000
    sidecar: bool = False
    #: Files larger than this are refused before a byte is read (`daemon.max_file_mb`).
    max_file_bytes: int = reading.DEFAULT_MAX_BYTES
    #: output.normalise: stable (per-output shot state) or frame (each map on its own).
    normalise: str = normalise.STABLE
    #: input.exr_colour and output.exr_half / exr_compression.
    exr: ExrOptions = ExrOptions()
    #: A sequence folder replaces the last one in one exchange (see `files.exchange`). Not under a
    #: recursive watch: the file watcher (watchdog's inotify) cannot follow two folders trading
    #: names and stops; there three renames do it, and a start puts back a whole one a kill left.
    swap_folders: bool = True
    #: output.first_frame: the number of a clip's first frame in an image sequence.
    first_frame: int = 0
    #: output.timeline: an .otio and an .fcpxml beside each depth clip.
    timeline: bool = False

    @property
    def encoding(self) -> Encoding:
        return Encoding(self.jpeg_quality, self.png_bits, self.png_compression, self.exr)

    @functools.cached_property  # once per settings, not once per frame's record
    def made_with(self) -> str:
        """A digest of what shapes a map's pixels (normalise, render, encoding), for its record.

        So a map made under other settings is known as such (`rules.map_is_current`):
        by its frame's version alone, `once --farm` run again with `--gamma 2.2` would
        find every map "up to date", keep them all and say they were written.
        """
        shape = repr((self.normalise, self.render, self.encoding))
        return hashlib.sha256(shape.encode()).hexdigest()[:12]

    @functools.cached_property
    def made_live(self) -> str:
        """`made_with` of a shot-stable map made live (the daemon, the API: each output's shot so far).

        Not the shot planner's map (`once`, the farm: each whole shot seen first), so
        `once --farm` does not keep a daemon's preview of a sequence as its own map
        (saying "8 up to date", with maps that differ from a local `once`'s).
        """
        shape = repr(("live", self.normalise, self.render, self.encoding))
        return hashlib.sha256(shape.encode()).hexdigest()[:12]

    @classmethod
    def from_config(cls, config: Config, watching: bool = False) -> Settings:
        """`watching`: for the daemon, whose watcher sees the folders it writes."""
        out = config.output
        return cls(
            render=RenderOptions(
                clip_percent=out.range_percentile,
                refine=out.refine,
                levels=Levels(parse_level(out.near), parse_level(out.far), out.gamma, out.invert),
            ),
            jpeg_quality=out.jpeg_quality,
            png_bits=out.png_bits,
            png_compression=out.png_compression,
            max_pixels=int(config.daemon.max_megapixels * 1_000_000),
            sidecar=out.sidecar,
            max_file_bytes=int(config.daemon.max_file_mb * 2**20),
            normalise=out.normalise,
            swap_folders=not (watching and config.watch.recursive),
            exr=ExrOptions(config.input.exr_colour, out.exr_half, out.exr_compression, out.exr_channels),
            first_frame=out.first_frame,
            timeline=out.timeline,
        )
