"""The path rules alone: which files are frames, where their maps go, what stays inside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from depthwatch import config as configuration
from depthwatch.config import OutputConfig, WatchConfig
from depthwatch.errors import FrameError
from depthwatch.frames.rules import Rules


def rules(tmp_path: Path, template: str = "{stem}_depth.jpg", patterns: tuple[str, ...] = ("*.jpg",), **watch) -> Rules:
    return Rules(WatchConfig(folders=(tmp_path,), patterns=patterns, **watch), OutputConfig(template=template))


def test_a_frame_name_goes_into_the_template_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USER", "editor")
    r = rules(tmp_path, "{name}.png")
    assert r.output_for(tmp_path / "$HOME.jpg") == tmp_path / "$HOME.jpg.png"
    assert r.output_for(tmp_path / "$USER.jpg") == tmp_path / "$USER.jpg.png"
    assert rules(tmp_path, "{stem}").output_for(tmp_path / "~.jpg") == tmp_path / "~"


def test_the_templates_own_folder_is_expanded_once_when_the_config_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = tmp_path / "maps"
    maps.mkdir()
    monkeypatch.setenv("MAPS", str(maps))
    (tmp_path / "config.yaml").write_text(f"watch:\n  folders: [{tmp_path}]\noutput:\n  template: $MAPS/{{stem}}.png\n")
    config = configuration.load(tmp_path / "config.yaml")
    assert config.output.template == f"{maps}/{{stem}}.png"
    r = Rules(config.watch, config.output)
    assert r.output_for(tmp_path / "$MAPS.jpg") == maps / "$MAPS.png"


@pytest.mark.parametrize(
    ("template", "expected"),
    [("depth.jpg", "depth.jpg"), ("{stem}_depth.png", "shot_depth.png"), ("{name}.tif", "shot.jpg.tif"), ("d/{stem}.{ext}", "d/shot.jpg")],
)
def test_templates(tmp_path: Path, template: str, expected: str) -> None:
    assert rules(tmp_path, template).output_for(tmp_path / "shot.jpg") == tmp_path / expected


def test_outputs_never_leave_the_watch_folder(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "linked").symlink_to(outside)
    with pytest.raises(FrameError, match="outside the configured folders"):
        rules(tmp_path, "linked/{stem}.png").output_for(tmp_path / "a.jpg")
    with pytest.raises(FrameError, match="overwrite the frame itself"):
        rules(tmp_path, "{name}").output_for(tmp_path / "a.jpg")


def test_a_fixed_absolute_output_folder_is_allowed(tmp_path: Path) -> None:
    maps = tmp_path.parent / f"{tmp_path.name}-maps"
    maps.mkdir()
    assert rules(tmp_path, f"{maps}/{{stem}}.png").output_for(tmp_path / "a.jpg") == maps / "a.png"


def test_what_is_a_frame(tmp_path: Path) -> None:
    r = rules(tmp_path)
    assert r.is_frame(tmp_path / "shot.jpg")
    assert r.is_frame(tmp_path / "SHOT.JPG")  # patterns are case-insensitive
    assert r.is_frame(tmp_path / "shot_depth_of_field.jpg")  # a real frame, not an output
    assert not r.is_frame(tmp_path / "shot_depth.jpg")  # the template's own output
    assert r.is_frame(tmp_path / "x\ny.jpg") and not r.is_frame(tmp_path / "x\ny_depth.jpg")  # a newline in a name too
    assert not r.is_frame(tmp_path / ".shot.jpg")  # hidden: an editor's temporary
    assert not r.is_frame(tmp_path / ".depth.jpg.0a1b2c3d.dwtmp")
    assert not r.is_frame(tmp_path / "shot.png")
    assert not r.is_frame(tmp_path / "sub" / "shot.jpg")  # not recursive
    assert rules(tmp_path, recursive=True).is_frame(tmp_path / "sub" / "shot.jpg")
    assert not r.is_frame(tmp_path.parent / "shot.jpg")


def test_a_sequence_is_never_a_frame_while_written_or_once_in_place_whatever_its_name(tmp_path: Path) -> None:
    """By mark, not by name: inside depthwatch's temporary folder, or beside a sequence marker, with any template."""
    from depthwatch.media import cliprecord

    r = Rules(
        WatchConfig(folders=(tmp_path,), patterns=("*.png",), recursive=True),
        OutputConfig(template="{stem}_depth.png", clip_template="{stem}_depth/{frame:04d}.png"),
    )
    writing = tmp_path / ".shot_depth.4242-0123abcd.dwtmp"
    assert not r.is_frame(writing / "0000.png")
    renamed = tmp_path / "graded"  # a finished sequence an editor renamed: no template names it
    renamed.mkdir()
    assert r.is_frame(renamed / "0000.png")
    (renamed / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    assert not r.is_frame(renamed / "0000.png")
    assert r.is_frame(tmp_path / "plates" / "0000.png")


def test_the_output_folders_are_where_the_templates_write(tmp_path: Path) -> None:
    """Where a start looks for temporary files: the watch folder, a fixed out/, each folder a field matches,
    a sequence's parent folder, an absolute folder; only those that exist."""
    maps = tmp_path.parent / f"{tmp_path.name}-maps"
    for folder in (tmp_path / "out", tmp_path / "A001_clips", tmp_path / "B002_clips", tmp_path / "notes", maps / "seq"):
        folder.mkdir(parents=True)
    r = Rules(WatchConfig(folders=(tmp_path,)), OutputConfig(template="out/{stem}.png", clip_template="{stem}_clips/{stem}.mov"))
    assert sorted(r.output_folders()) == sorted([tmp_path, tmp_path / "out", tmp_path / "A001_clips", tmp_path / "B002_clips"])
    r = Rules(WatchConfig(folders=(tmp_path,)), OutputConfig(template=f"{maps}/{{stem}}.png", clip_template=f"{maps}/seq/{{stem}}/{{frame:04d}}.png"))
    assert sorted(r.output_folders()) == sorted([tmp_path, maps, maps / "seq"])


def test_links_are_followed_only_inside_the_watch_folder(tmp_path: Path) -> None:
    watch = tmp_path / "watch"
    watch.mkdir()
    (tmp_path / "outside.jpg").write_bytes(b"x")
    (watch / "inside.jpg").write_bytes(b"x")
    (watch / "to_outside.jpg").symlink_to(tmp_path / "outside.jpg")
    (watch / "to_inside.jpg").symlink_to(watch / "inside.jpg")
    r = rules(watch)
    assert r.link_allowed(watch / "inside.jpg") and r.link_allowed(watch / "to_inside.jpg")
    assert not r.link_allowed(watch / "to_outside.jpg")
    assert rules(watch, follow_symlinks=True).link_allowed(watch / "to_outside.jpg")


def test_error_records_sit_beside_the_output(tmp_path: Path) -> None:
    r = Rules(WatchConfig(folders=(tmp_path,)), OutputConfig(template="maps/{stem}.png", error_sidecar=True))
    output = r.output_for(tmp_path / "a.jpg")
    assert r.error_record_for(tmp_path / "a.jpg", output) == tmp_path / "maps" / "a.jpg.error.json"
    assert os.path.basename(str(output)) == "a.png"


def test_every_job_gets_its_roots_from_the_one_factory(tmp_path: Path) -> None:
    """The watcher's, the API's, `once`'s and the farm's jobs all come from `Rules.job_for`."""
    maps = tmp_path / "maps"
    r = rules(tmp_path, f"{maps}/{{stem}}.png")
    job = r.job_for(tmp_path / "a.jpg", (1, 2, 3), "jpeg")
    assert (job.output, job.signature, job.format) == (maps / "a.png", (1, 2, 3), "jpeg")
    assert job.link_root == tmp_path and job.output_roots == (tmp_path, maps)
    assert rules(tmp_path, follow_symlinks=True).job_for(tmp_path / "a.jpg").link_root is None
    with pytest.raises(FrameError, match="outside the configured folders"):
        rules(tmp_path, "../{stem}.png").job_for(tmp_path / "a.jpg")


def test_an_ext_template_refuses_a_frame_whose_format_no_map_can_have(tmp_path: Path) -> None:
    """Patterns that do not name an extension ('*') leave it to each frame: refused when its job is made."""
    r = rules(tmp_path, "{stem}_depth.{ext}", patterns=("*",))
    assert r.output_for(tmp_path / "a.jpg") == tmp_path / "a_depth.jpg"
    with pytest.raises(FrameError, match=r"depth maps cannot be written as \.webp"):
        r.job_for(tmp_path / "a.webp")
    floats = Rules(WatchConfig(folders=(tmp_path,), patterns=("*",)), OutputConfig(template="{stem}_depth.{ext}", png_bits=32))
    assert floats.output_for(tmp_path / "a.tif") == tmp_path / "a_depth.tif"  # a 32-bit float TIFF
    with pytest.raises(FrameError, match="png_bits 32"):
        floats.job_for(tmp_path / "a.png")


def test_a_batch_refuses_two_frames_with_one_output_and_takes_a_frame_named_twice_once(tmp_path: Path) -> None:
    from depthwatch.errors import ConfigError

    r = rules(tmp_path, patterns=("*",))
    jobs, refused = r.jobs_for([tmp_path / "a.jpg", tmp_path / "b.jpg", tmp_path / "a.jpg"])
    assert [job.source.name for job in jobs] == ["a.jpg", "b.jpg"] and refused == []
    with pytest.raises(ConfigError, match="a.jpg and .*a.tif both map to .*a_depth.jpg"):
        r.jobs_for([tmp_path / "a.jpg", tmp_path / "a.tif"])
