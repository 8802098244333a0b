"""Clips: the clip family in one place, from a clip's file to its depth clip in place.

Two layers in one package (pyproject.toml's contract names both):

- The way, above `frames` (a clip's frames go the way a frame's settings,
  records and writes say): `job` (what a clip job is, where it stands, how it
  ended), `make` (a whole clip in one streamed pass, `make_clip`: what the
  daemon's clip thread and `once` call), `stream` (decode -> infer -> shot
  planner, the maps written behind), `placing` (the temporary name and the
  rename or folder swap that puts a whole depth clip in place), `sequence`
  (an image sequence's frames and their record), `timeline` (the timeline
  beside a depth clip), and a clip in ranges, which the farm's client and
  workers and a farm manager's own tasks call: `clipindex` (the frames in
  presentation order, cut into ranges), `rangepass` (a range's two passes on
  the caller's engine), `segments` (the ranges' segments and their join).
- Its files, below `config` (`frames` and `config` ask what a clip is, where
  its depth clip goes, whether it is depthwatch's): `media`.

This file imports nothing: reading `clips.media` from the layers below the
way must not load the way.
"""
