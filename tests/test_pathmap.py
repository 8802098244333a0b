"""farm.path_map: prefix rewrites between the client's and the workers' view of shared storage."""

from __future__ import annotations

import pytest

from depthwatch import config as configuration
from depthwatch.errors import ConfigError
from depthwatch.pathmap import PathMap


def test_prefixes_match_whole_components_and_the_longest_wins() -> None:
    paths = PathMap.from_mapping({"/Volumes/Shots": "/mnt/shots", "/Volumes/Shots/grade": "/srv/grade/", "/": "/data"})
    assert paths.to_worker("/Volumes/Shots/A001/frame_1001.jpg") == "/mnt/shots/A001/frame_1001.jpg"
    assert paths.to_worker("/Volumes/Shots") == "/mnt/shots"
    assert paths.to_worker("/Volumes/Shots/grade/x.jpg") == "/srv/grade/x.jpg"
    assert paths.to_worker("/Volumes/ShotsOld/x.jpg") == "/data/Volumes/ShotsOld/x.jpg"  # not /mnt/shotsOld
    assert PathMap().to_worker("/Volumes/Shots/x.jpg") == "/Volumes/Shots/x.jpg"


def test_the_config_reads_a_mapping_and_refuses_relative_prefixes(tmp_path) -> None:
    parsed = configuration.parse("farm:\n  path_map: {/Volumes/Shots/: /mnt/shots}\n  frames_per_task: 8\n", tmp_path / "c.yaml")
    assert parsed.farm.path_map.to_worker("/Volumes/Shots/a.jpg") == "/mnt/shots/a.jpg"
    assert parsed.farm.frames_per_task == 8
    with pytest.raises(ConfigError, match=r"c.yaml:2:13: farm.path_map maps absolute path prefixes.*'shots'"):
        configuration.parse("farm:\n  path_map: {/Volumes/Shots: shots}\n", tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="farm.path_map must be a mapping"):
        configuration.parse("farm:\n  path_map: [/a, /b]\n", tmp_path / "c.yaml")
