"""Numbered frames: grouping into sequences, ordering, frame ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from depthwatch.frames.sequences import frame_range, parse, sequences


@pytest.mark.parametrize(
    ("name", "prefix", "number", "suffix"),
    [
        ("shot_1001.jpg", "shot_", 1001, ".jpg"),
        ("frame_000123.png", "frame_", 123, ".png"),
        ("A001_C002.0001.exr", "A001_C002.", 1, ".exr"),
        ("0042.tif", "", 42, ".tif"),
        ("take7", "take", 7, ""),
    ],
)
def test_parse_reads_the_number_that_ends_the_stem(name: str, prefix: str, number: int, suffix: str) -> None:
    parsed = parse(Path("/shots") / name)
    assert parsed is not None
    assert (parsed.prefix, parsed.number, parsed.suffix) == (prefix, number, suffix)


@pytest.mark.parametrize("name", ["frame.jpg", "shot_a.png", "1001_final.jpg"])
def test_names_without_a_trailing_number_are_not_frames(name: str) -> None:
    assert parse(Path(name)) is None


def test_sequences_order_by_number_not_by_name_and_keep_stills_apart(tmp_path: Path) -> None:
    names = ["f_100.jpg", "f_99.jpg", "f_101.jpg", "other_1.png", "still.jpg", "g_5.jpg", "g_6.jpg", "alone_3.jpg"]
    found, stills = sequences(tmp_path / n for n in names)
    assert [[p.name for p in s.paths] for s in found] == [["f_99.jpg", "f_100.jpg", "f_101.jpg"], ["g_5.jpg", "g_6.jpg"]]
    assert [p.name for p in stills] == ["still.jpg", "other_1.png", "alone_3.jpg"]


def test_same_prefix_in_different_folders_or_formats_are_different_sequences(tmp_path: Path) -> None:
    paths = [tmp_path / "a" / "s_1.jpg", tmp_path / "b" / "s_2.jpg", tmp_path / "a" / "s_2.jpg", tmp_path / "a" / "s_3.png"]
    found, stills = sequences(paths)
    assert [s.paths for s in found] == [[tmp_path / "a" / "s_1.jpg", tmp_path / "a" / "s_2.jpg"]]
    assert stills == [tmp_path / "b" / "s_2.jpg", tmp_path / "a" / "s_3.png"]


def test_frame_ranges() -> None:
    assert frame_range("1001-1005") == {1001, 1002, 1003, 1004, 1005}
    assert frame_range("1001-1007x2") == {1001, 1003, 1005, 1007}
    assert frame_range("7, 10-11") == {7, 10, 11}


#: The VFX convention as fileseq reads it, written out: a change in fileseq's reading fails here.
CONVENTION = {
    "1-10": set(range(1, 11)),
    "1-10x2": {1, 3, 5, 7, 9},
    "1-10x3": {1, 4, 7, 10},
    "1,3,5": {1, 3, 5},
    "10-1": set(range(1, 11)),  # counted down: the same frames
    "10-1x2": {10, 8, 6, 4, 2},  # the step counts from the first frame written
    "1-10y3": {2, 3, 5, 6, 8, 9},  # the frames x3 leaves out
    "1-10:2": set(range(1, 11)),  # staggered: x2, then the rest; every frame once
    "1-10:3": set(range(1, 11)),
    "1001": {1001},
    "-5--1": {-5, -4, -3, -2, -1},
    "-2-2": {-2, -1, 0, 1, 2},
    "1--3": {1, 0, -1, -2, -3},
    "1 - 10": set(range(1, 11)),
    "7, 10-11": {7, 10, 11},
    "1-1": {1},
    "0-0": {0},
    "01-05": {1, 2, 3, 4, 5},
    "1-10x3,2-4": {1, 4, 7, 10, 2, 3},
    "1001-1100x25,1050": {1001, 1026, 1051, 1076, 1050},
}


@pytest.mark.parametrize("text", sorted(CONVENTION))
def test_frame_ranges_follow_fileseq_the_vfx_convention(text: str) -> None:
    """Checked against fileseq itself too, so the table cannot drift from the library."""
    fileseq = pytest.importorskip("fileseq")
    assert frame_range(text) == CONVENTION[text]
    assert {int(f) for f in fileseq.FrameSet(text)} == CONVENTION[text]


@pytest.mark.parametrize("text", ["", " ", "a-b", "1-10x0", "1-10x-2", "1x", "1-10X2", "1-10x1.5", "1.5", "1-100000000"])
def test_malformed_frame_ranges_say_why(text: str) -> None:
    with pytest.raises(ValueError, match="frame range|sub-frames|more than") as caught:
        frame_range(text)
    assert "\n" not in str(caught.value)


def test_pre_roll_frames_numbered_below_zero_are_negative_frames(tmp_path):
    """`shot.-003.exr`, as pipelines write pre-roll (fileseq reads it so): read as frame 3,
    `--frames 1-3` would take the pre-roll too and the sequence split in two at frame 0."""
    from depthwatch.frames.sequences import frame_range, parse, sequences

    names = [tmp_path / f"shot.{n:04d}.exr" for n in range(-3, 4)]
    assert [parse(p).number for p in names] == [-3, -2, -1, 0, 1, 2, 3]
    found, stills = sequences(reversed(names))
    assert len(found) == 1 and found[0].numbers == [-3, -2, -1, 0, 1, 2, 3] and stills == []
    assert [p.name for p in names if parse(p).number in frame_range("1-3")] == ["shot.0001.exr", "shot.0002.exr", "shot.0003.exr"]
    assert [p.name for p in names if parse(p).number in frame_range("-3--1")] == ["shot.-003.exr", "shot.-002.exr", "shot.-001.exr"]
    assert parse(tmp_path / "shot-003.exr").number == 3  # a hyphen after a letter is the name's
