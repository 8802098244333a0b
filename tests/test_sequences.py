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


@pytest.mark.parametrize("text", ["", "a-b", "10-1", "1-10x0", "1-10y2"])
def test_malformed_frame_ranges_say_why(text: str) -> None:
    with pytest.raises(ValueError, match="frame range|step|ends before"):
        frame_range(text)
