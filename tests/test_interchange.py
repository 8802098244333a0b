"""Maps and depth clips as editors' and compositors' own tools read them: ffprobe, ffmpeg,
ImageMagick, OpenEXR and OpenTimelineIO check what depthwatch wrote, never depthwatch itself.

The sources are real photographs (scikit-image's) panned a few pixels a frame, and
the maps come from the real FastDepth model through `depthwatch once`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av", reason="clips need the video extra: pip install -e '.[video]'")

from benchmarks.clips import pan_clip_frames, write_clip  # noqa: E402
from conftest import FASTDEPTH  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SIZE = (160, 90)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is missing (Debian's {package} package; .ci/run installs it)")
    return path


def _imagemagick() -> str:
    """ImageMagick's convert, not a stand-in that only prints PNGs."""
    path = _tool("convert", "imagemagick")
    done = subprocess.run([path, "-version"], capture_output=True, text=True)
    if done.returncode != 0 or "ImageMagick" not in done.stdout:
        pytest.skip("ImageMagick's convert is not installed (Debian's imagemagick package; .ci/run installs it)")
    return path


def ffprobe(path: Path, entries: str, *extra: str) -> dict[str, object]:
    out = subprocess.run(
        [_tool("ffprobe", "ffmpeg"), "-v", "error", "-select_streams", "v:0", "-show_entries", entries, *extra, "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def once(*args: str) -> subprocess.CompletedProcess[str]:
    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args, "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def prores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ProRes source with a timecode and 128:117 pixels (NTSC DV's aspect)."""
    source = tmp_path_factory.mktemp("interchange") / "B002_C007.mov"
    write_clip(source, pan_clip_frames(SIZE, 12, step=8), codec="prores", timecode="01:00:10:00", sar=Fraction(128, 117))
    return source


# -- colour tags and aspect -------------------------------------------------------------


@pytest.mark.parametrize("ext, codec, frame_range", [(".mov", "prores", "tv"), (".mkv", "ffv1", "pc")])
def test_colour_tags_agree_in_container_and_frames_and_the_pixel_aspect_is_kept(
    prores: Path, tmp_path: Path, ext: str, codec: str, frame_range: str
) -> None:
    out = tmp_path / f"depth{ext}"
    once(str(prores), "-o", str(out))
    colour = ("color_range", "color_space", "color_transfer", "color_primaries")
    stream = ffprobe(out, "stream=codec_name," + ",".join(colour))["streams"][0]
    frames = ffprobe(out, "frame=sample_aspect_ratio," + ",".join(colour), "-read_intervals", "%+#3")["frames"]
    assert stream["codec_name"] == codec
    want = {"color_range": frame_range, "color_space": "bt709", "color_transfer": "bt709", "color_primaries": "bt709"}
    assert {k: stream.get(k) for k in colour} == want  # the colr atom / Matroska Colour
    assert len(frames) == 3
    for frame in frames:  # each frame's own header, which FFmpeg-based readers believe
        assert {k: frame.get(k) for k in colour} == want
        assert frame["sample_aspect_ratio"] == "128:117"
