"""Maps and depth clips as editors' and compositors' own tools read them: ffprobe, ffmpeg,
ImageMagick, OpenEXR and OpenTimelineIO check what depthwatch wrote, never depthwatch itself.

The sources are real photographs (scikit-image's) panned a few pixels a frame, and
the maps come from the real FastDepth model through `depthwatch once`.
"""

from __future__ import annotations

import json
import os
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


# -- plates: 10- and 12-bit TIFF, 10-bit DPX ---------------------------------------------


def _photograph() -> np.ndarray:
    from skimage import data

    return np.ascontiguousarray(cv2.resize(data.coffee(), (320, 213), interpolation=cv2.INTER_AREA)[:, :, ::-1])


def _map(folder: Path, name: str) -> np.ndarray:
    once(str(folder / name), "-o", str(folder / f"{name}.map.png"), "--normalise", "frame")
    return cv2.imread(str(folder / f"{name}.map.png"), cv2.IMREAD_UNCHANGED).astype(np.float64)


def test_ten_and_twelve_bit_plates_from_imagemagick_and_ffmpeg_map_as_the_8_bit_png_does(tmp_path: Path) -> None:
    pytest.importorskip("OpenImageIO", reason="plates need the plates extra: pip install -e '.[plates]'")
    convert, ffmpeg = _imagemagick(), _tool("ffmpeg", "ffmpeg")
    cv2.imwrite(str(tmp_path / "plate.png"), _photograph())
    subprocess.run([convert, str(tmp_path / "plate.png"), "-depth", "10", str(tmp_path / "im10.tif")], check=True)
    subprocess.run([convert, str(tmp_path / "plate.png"), "-depth", "12", "-compress", "lzw", str(tmp_path / "im12.tif")], check=True)
    subprocess.run([convert, str(tmp_path / "plate.png"), "-depth", "10", str(tmp_path / "im10.dpx")], check=True)
    subprocess.run([ffmpeg, "-v", "error", "-i", str(tmp_path / "plate.png"), "-pix_fmt", "gbrp10le", str(tmp_path / "ff10.dpx")], check=True)
    identify = shutil.which("identify")
    if identify:  # the plates are what their names say, by ImageMagick's own reading
        for name, bits in (("im10.tif", "10"), ("im12.tif", "12"), ("ff10.dpx", "10")):
            assert subprocess.run([identify, "-format", "%z", str(tmp_path / name)], capture_output=True, text=True).stdout == bits
    reference = _map(tmp_path, "plate.png")
    for name in ("im10.tif", "im12.tif", "im10.dpx", "ff10.dpx"):
        depth = _map(tmp_path, name)
        assert depth.shape == reference.shape
        assert np.corrcoef(depth.ravel(), reference.ravel())[0, 1] >= 0.98, name


def test_plates_and_stills_turned_by_their_orientation_tag_decode_upright_at_every_depth(tmp_path: Path) -> None:
    """A camera's or scanner's picture stored on its side with a tag saying so (TIFF Orientation, PNG eXIf)
    is decoded as viewers show it, as a JPEG is: 8- and 16-bit TIFF, 10- and 12-bit TIFF (read by
    OpenImageIO) and PNG alike, none left on its side. A 16-bit CMYK TIFF, which
    OpenCV does not read, is decoded by OpenImageIO, not called "corrupt"."""
    pytest.importorskip("OpenImageIO", reason="plates need the plates extra: pip install -e '.[plates]'")
    from PIL import Image

    from depthwatch.imaging import codec

    convert = _imagemagick()
    upright = _photograph()  # 320x213, as shown
    cv2.imwrite(str(tmp_path / "upright.png"), upright)
    cv2.imwrite(str(tmp_path / "stored.png"), cv2.rotate(upright, cv2.ROTATE_90_COUNTERCLOCKWISE))  # 6: turn it clockwise to show it
    for bits in (8, 12, 16):
        subprocess.run([convert, str(tmp_path / "stored.png"), "-orient", "RightTop", "-depth", str(bits), str(tmp_path / f"o6_{bits}.tif")], check=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(tmp_path / "stored.png").save(tmp_path / "o6.png", exif=exif.tobytes())
    subprocess.run([convert, str(tmp_path / "upright.png"), "-colorspace", "CMYK", "-depth", "16", str(tmp_path / "cmyk16.tif")], check=True)

    def decoded(name: str) -> np.ndarray:
        return codec.decode((tmp_path / name).read_bytes(), max_pixels=10**8).image.astype(np.float64)

    for name in ("o6_8.tif", "o6_12.tif", "o6_16.tif", "o6.png", "cmyk16.tif"):
        image = decoded(name)
        assert image.shape == upright.shape, name
        grey = (image.mean(axis=2).ravel(), upright.astype(np.float64).mean(axis=2).ravel())
        assert np.corrcoef(*grey)[0, 1] > 0.98, name


def test_dpx_layouts_not_read_get_one_line_and_a_plate_without_openimageio_says_what_to_install(tmp_path: Path) -> None:
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    cv2.imwrite(str(tmp_path / "plate.png"), _photograph())
    subprocess.run([ffmpeg, "-v", "error", "-i", str(tmp_path / "plate.png"), "-pix_fmt", "gbrp10le", str(tmp_path / "A.dpx")], check=True)
    data = bytearray((tmp_path / "A.dpx").read_bytes())
    assert data[:4] == b"XPDS" and data[803] == 10  # little-endian, 10-bit, as ffmpeg writes it
    data[804:806] = (2).to_bytes(2, "little")  # filled by method B
    (tmp_path / "B.dpx").write_bytes(bytes(data))
    (tmp_path / "cut.dpx").write_bytes((tmp_path / "A.dpx").read_bytes()[:50_000])
    code = (
        "import sys; sys.modules['OpenImageIO'] = None; from depthwatch.cli import main; "
        f"raise SystemExit(main(['once', 'A.dpx', 'B.dpx', 'cut.dpx', '--model', {str(FASTDEPTH)!r}, '--profile', 'fastdepth-nyu']))"
    )
    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if "dpx" in line]
    assert done.returncode != 0
    assert any("A.dpx" in line and "need OpenImageIO" in line and "pip install 'depthwatch[plates]'" in line for line in lines), lines
    assert any("B.dpx" in line and "10-bit samples, filled (method B)" in line for line in lines), lines
    assert any("cut.dpx" in line and "cut short" in line for line in lines), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.dpx", "B.dpx", "cut.dpx", "plate.png"]


# -- phone clips: rotation and variable frame rate ------------------------------------------


def _phone_clip(path: Path, *, durations: list[int], time_base: Fraction, rotation: int = 0) -> None:
    """An H.264 clip as a phone writes one: frame k lasts durations[k] ticks; a display matrix if turned."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30, options={"bf": "2", "preset": "veryfast", "crf": "20"})
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.time_base = stream.codec_context.time_base = time_base
        if rotation:
            stream.set_display_rotation(rotation)
        pts, lasting = 0, {}
        for image, duration in zip(pan_clip_frames(SIZE, len(durations), step=6), durations):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.duration, frame.time_base = pts, duration, time_base
            lasting[pts] = duration
            container.mux(_timed(stream.encode(frame), lasting))
            pts += duration
        container.mux(_timed(stream.encode(None), lasting))


def _timed(packets: list[av.Packet], lasting: dict[int, int]) -> list[av.Packet]:
    """Each packet lasts as long as its frame (the encoder says 1/rate), as a phone's last frame does."""
    for packet in packets:
        packet.duration = lasting.get(packet.pts, packet.duration)
    return packets


def _frame_times(path: Path) -> list[float]:
    frames = ffprobe(path, "frame=best_effort_timestamp_time")["frames"]
    return [float(f["best_effort_timestamp_time"]) for f in frames]


@pytest.mark.parametrize("ext", [".mov", ".mkv"])
def test_a_variable_rate_clip_gets_a_depth_clip_with_its_frame_times_and_the_log_says_so(tmp_path: Path, ext: str) -> None:
    source = tmp_path / "IMG_0042.mp4"
    # 30 fps, then the phone slows to 15: the later frames last twice as long.
    _phone_clip(source, durations=[512] * 12 + [1024] * 12, time_base=Fraction(1, 15360))
    out = tmp_path / f"IMG_0042_depth{ext}"
    done = once(str(source), "-o", str(out), "--timeline")
    assert "IMG_0042.mp4 is variable-rate (frames last 33.3 to 66.7 ms)" in done.stderr
    want, got = _frame_times(source), _frame_times(out)
    assert len(got) == len(want) == 24
    start = want[0]
    assert max(abs((w - start) - g) for w, g in zip(want, got)) <= 0.001, (want, got)
    assert got[-1] - got[0] == pytest.approx(12 / 30 + 11 / 15, abs=0.001)  # at a constant 30 fps: 23 / 30
    # The last frame lasts as long as the source's (an encoder says 1/rate), so both end together,
    # and the timeline is as long as the clip: 36 frames of its 30 fps, not its 24 frames.
    lengths = [float(ffprobe(p, "format=duration")["format"]["duration"]) for p in (source, out)]
    assert lengths[1] == pytest.approx(lengths[0], abs=0.002) and lengths[0] == pytest.approx(1.2, abs=0.002), lengths
    otio = pytest.importorskip("opentimelineio", reason="timelines need the timeline extra: pip install -e '.[timeline]'")
    timeline = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    assert [t[0].source_range.duration.to_frames() for t in timeline.video_tracks()] == [36, 36]
    assert 'duration="6/5s"' in out.with_suffix(".fcpxml").read_text()


def _video_end(path: Path) -> float:
    """Where the video stream ends, as ffprobe reads the track (its edit list and media duration)."""
    stream = ffprobe(path, "stream=start_time,duration")["streams"][0]
    return float(stream["start_time"]) + float(stream["duration"])


@pytest.mark.parametrize("encoder", ["libx264", "libx265"])
def test_a_variable_rate_clip_with_b_frames_ends_where_its_source_ends(tmp_path: Path, encoder: str) -> None:
    """A phone clip with B-frames: the packet with the highest time is not the last decoded, and its duration
    is not how long the last frame is shown; the depth clip's last frame lasts to the source's end."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    if encoder not in subprocess.run([ffmpeg, "-v", "error", "-encoders"], capture_output=True, text=True).stdout:
        pytest.skip(f"this ffmpeg has no {encoder}")
    source = tmp_path / "IMG_0043.mp4"
    codec = ["-c:v", "libx264", "-bf", "3", "-g", "12"] if encoder == "libx264" else [
        "-c:v", "libx265", "-x265-params", "bframes=3:log-level=error", "-tag:v", "hvc1"]
    # 30 fps, then 25: 20 frames of 3000 ticks, 20 of 3600, in 1/90000.
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=160x96:rate=30,trim=end_frame=40",
                    "-vf", "settb=1/90000,setpts='if(lt(N,20),N*3000,60000+(N-20)*3600)'", "-fps_mode", "vfr",
                    "-enc_time_base", "1/90000", *codec, "-video_track_timescale", "90000", "-pix_fmt", "yuv420p", str(source)],
                   check=True, timeout=60)
    assert ffprobe(source, "stream=has_b_frames")["streams"][0]["has_b_frames"] > 0
    out = tmp_path / "IMG_0043_depth.mov"
    done = once(str(source), "-o", str(out))
    assert "IMG_0043.mp4 is variable-rate (frames last 33.3 to 40.0 ms)" in done.stderr
    want, got = _frame_times(source), _frame_times(out)
    assert len(got) == len(want) == 40 and max(abs(w - g) for w, g in zip(want, got)) <= 0.001, (want, got)
    assert _video_end(out) == pytest.approx(_video_end(source), abs=0.0005), (_video_end(source), _video_end(out))


@pytest.mark.parametrize("ext", [".mov", ".mkv"])
def test_an_interlaced_clip_with_sound_keeps_its_field_order_and_its_timeline_declares_the_sound(tmp_path: Path, ext: str) -> None:
    """A top-field-first shot with stereo sound: the depth clip is marked top field first, not progressive
    (ffprobe), the log says what is done with the fields, and the .fcpxml's source asset declares its
    sound (hasAudio, audioSources, audioChannels, audioRate) so Final Cut Pro opens the shot with it."""
    import xml.etree.ElementTree as ET

    pytest.importorskip("opentimelineio", reason="timelines need the timeline extra: pip install -e '.[timeline]'")
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    source = tmp_path / "C003.mov"
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=160x96:rate=25,trim=end_frame=12",
                    "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000,atrim=end=0.48", "-ac", "2",
                    "-vf", "tinterlace=interleave_top,setfield=tff", "-c:v", "libx264", "-flags", "+ildct+ilme",
                    "-x264-params", "tff=1", "-pix_fmt", "yuv420p", "-c:a", "aac", str(source)], check=True, timeout=60)
    assert ffprobe(source, "stream=field_order")["streams"][0]["field_order"] == "tt"
    out = tmp_path / f"C003_depth{ext}"
    done = once(str(source), "-o", str(out), "--timeline")
    assert ffprobe(out, "stream=field_order")["streams"][0]["field_order"] == "tt"
    assert (
        "clip C003.mov is interlaced (top field first): each map is made from the whole frame, both fields at once; "
        "the depth clip is marked with the same field order"
    ) in done.stderr
    assets = {a.get("id"): a.attrib for a in ET.parse(out.with_suffix(".fcpxml")).getroot().iter("asset")}
    sound = {k: assets["r2"].get(k) for k in ("hasAudio", "audioSources", "audioChannels", "audioRate")}
    assert sound == {"hasAudio": "1", "audioSources": "1", "audioChannels": "2", "audioRate": "48000"}, assets
    assert "hasAudio" not in assets["r3"]  # the depth clip has no sound


def test_two_frames_at_one_time_keep_every_later_map_on_its_own_frame(tmp_path: Path) -> None:
    """Concatenating and slideshow tools write two frames at one time: the second is kept a tick later
    and the log says so, so every map stays on its own frame and the depth clip is as long as its source.
    Keyed by time alone, the pair would collapse to one and every later map would show over the frame
    after its own."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    source = tmp_path / "dup.mov"
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=160x96:r=30:d=1", "-vf", "setpts='N-eq(N,5)'",
                    "-fps_mode", "passthrough", "-c:v", "libx264", "-bf", "2", "-pix_fmt", "yuv420p", str(source)], check=True)
    stamps = [f["pts_time"] for f in ffprobe(source, "frame=pts_time")["frames"]]
    assert len(stamps) == 30 and stamps[4] == stamps[5]  # the source as the tools write it
    want = _frame_times(source)  # as FFmpeg shows it: the second of the two a tick later
    out = tmp_path / "dup_depth.mov"
    done = once(str(source), "-o", str(out))
    assert "clip dup.mov: 1 frame(s) share their time with the frame before; each is kept one tick later" in done.stderr
    got = _frame_times(out)
    assert len(got) == 30
    assert max(abs(w - g) for w, g in zip(want, got)) <= 0.001, (want, got)  # the one moved a tick (1/15360 s) later
    lengths = [float(ffprobe(p, "format=duration")["format"]["duration"]) for p in (source, out)]
    assert lengths[1] == pytest.approx(lengths[0], abs=0.002), lengths


def test_a_stream_joined_midway_is_timed_by_the_frames_that_decode(tmp_path: Path) -> None:
    """A transport stream recorded or split midway: its first packets never decode. The depth clip is
    timed by the frames that do: a steady 25 fps clip stays steady (not "variable-rate"), and every
    map shows with its picture, not before it (taken for frames, those packets would put it a second early)."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    whole, source = tmp_path / "whole.ts", tmp_path / "half.mts"
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=160x96:r=25:d=4", "-c:v", "libx264",
                    "-pix_fmt", "yuv420p", "-bf", "3", "-x264-params", "open-gop=1:keyint=25:min-keyint=25:scenecut=0",
                    "-f", "mpegts", str(whole)], check=True)
    data = whole.read_bytes()
    source.write_bytes(data[len(data) // 2 // 188 * 188 :])  # cut at a transport packet, as a split does
    out = tmp_path / "half_depth.mov"
    done = once(str(source), "-o", str(out))
    assert "variable-rate" not in done.stderr, done.stderr
    assert "after packets that do not decode (recorded or split midway); its depth clip starts there too" in done.stderr
    start = float(ffprobe(source, "format=start_time")["format"]["start_time"])
    want, got = [t - start for t in _frame_times(source)], _frame_times(out)
    assert len(got) == len(want) >= 20
    assert max(abs(w - g) for w, g in zip(want, got)) <= 0.001, (want, got)


def test_streams_joined_end_to_end_are_timed_at_their_rate_not_paired_a_tick_apart(tmp_path: Path) -> None:
    """`cat a.ts b.ts`: each part's times start again, so half the frames share a time with another.
    The run says its times are not one timeline and times the frames at their rate; sorted by time,
    the two parts' frames would pair a tick apart in a depth clip half as long as its frames."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    part, joined = tmp_path / "part.ts", tmp_path / "joined.mts"
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=160x96:r=25:d=2", "-c:v", "libx264",
                    "-pix_fmt", "yuv420p", "-f", "mpegts", str(part)], check=True)
    joined.write_bytes(part.read_bytes() * 2)
    out = tmp_path / "joined_depth.mov"
    done = once(str(joined), "-o", str(out))
    assert "its times are not one timeline (streams joined end to end?)" in done.stderr, done.stderr
    got = _frame_times(out)
    assert len(got) == 100 and max(abs(g - k / 25) for k, g in enumerate(got)) <= 0.001


def test_a_constant_rate_clip_says_nothing_of_its_rate(tmp_path: Path) -> None:
    source = tmp_path / "steady.mp4"
    _phone_clip(source, durations=[512] * 12, time_base=Fraction(1, 15360))
    done = once(str(source), "-o", str(tmp_path / "steady_depth.mov"))
    assert "variable-rate" not in done.stderr
    assert ffprobe(tmp_path / "steady_depth.mov", "stream=r_frame_rate")["streams"][0]["r_frame_rate"] == "30/1"


def test_a_clip_whose_picture_starts_after_its_sound_gets_a_depth_clip_that_starts_there_too(tmp_path: Path) -> None:
    """A camera's sound from 0 and its picture from 0.5 s (an edit list's empty edit, as FFmpeg and
    cameras write it): the depth clip's first map is shown with the first frame, not 0.5 s early,
    so a tool that honours timestamps (FFmpeg, a QuickTime-based editor) pairs each map with its frame."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    picture, sound, source = tmp_path / "v.mp4", tmp_path / "a.m4a", tmp_path / "A003_late.mp4"
    _phone_clip(picture, durations=[512] * 10, time_base=Fraction(1, 15360))
    run = [ffmpeg, "-v", "error", "-y"]
    subprocess.run([*run, "-f", "lavfi", "-i", "sine=duration=1", "-c:a", "aac", str(sound)], check=True)
    subprocess.run([*run, "-itsoffset", "0.5", "-i", str(picture), "-i", str(sound), "-map", "0", "-map", "1", "-c", "copy", str(source)], check=True)
    want = _frame_times(source)
    assert want[0] == pytest.approx(0.5, abs=0.001)  # as the tools see the source
    ext = ".mov"  # an empty edit in the edit list, as the source has (Matroska keeps the time itself)
    out = tmp_path / f"A003_late_depth{ext}"
    done = once(str(source), "-o", str(out))
    assert "its picture starts 0.500 s into the file, after its sound; its depth clip starts there too" in done.stderr
    got = _frame_times(out)
    assert len(got) == len(want) == 10
    assert max(abs(w - g) for w, g in zip(want, got)) <= 0.001, (want, got)
    # A variable-rate one's timeline is as long as its picture plays, the late start not added to it.
    otio = pytest.importorskip("opentimelineio", reason="timelines need the timeline extra: pip install -e '.[timeline]'")
    _phone_clip(picture, durations=[512] * 5 + [1024] * 5, time_base=Fraction(1, 15360))
    lengths = []
    for offset in ("0", "0.5"):
        name = f"vfr_{offset.replace('.', '')}"
        subprocess.run([*run, "-itsoffset", offset, "-i", str(picture), "-i", str(sound), "-map", "0", "-map", "1", "-c", "copy", str(tmp_path / f"{name}.mp4")], check=True)
        once(str(tmp_path / f"{name}.mp4"), "-o", str(tmp_path / f"{name}_depth.mov"), "--timeline")
        timeline = otio.adapters.read_from_file(str(tmp_path / f"{name}_depth.otio"))
        lengths.append([t[0].source_range.duration.to_frames() for t in timeline.video_tracks()])
    assert lengths[0] == lengths[1] and lengths[0][0] > 10, lengths  # as its frames play (not its count of 10), late start or not
    # The timeline is the picture's span: it starts where the picture does (0.5 s = 15 frames of 30 fps into
    # the file), or the shot's last frames, and its map's, fall outside it (as from the file's start).
    late = otio.adapters.read_from_file(str(tmp_path / "vfr_05_depth.otio"))
    for track in late.video_tracks():
        assert track[0].source_range.start_time.to_frames() == 15
        assert track[0].media_reference.available_range.duration.to_frames() == 15 + lengths[1][0]
    assert late.global_start_time.to_frames() == 15
    # A clip whose picture and sound start together says nothing and starts at 0.
    subprocess.run([*run, "-i", str(picture), "-i", str(sound), "-map", "0", "-map", "1", "-c", "copy", str(tmp_path / "together.mp4")], check=True)
    done = once(str(tmp_path / "together.mp4"), "-o", str(tmp_path / f"together_depth{ext}"))
    assert "after its sound" not in done.stderr
    assert _frame_times(tmp_path / f"together_depth{ext}")[0] == pytest.approx(0, abs=0.001)


def test_a_cover_image_stored_as_a_video_stream_is_not_taken_for_the_clips_picture(tmp_path: Path) -> None:
    """A still beside the picture (Matroska lists a cover PNG first; MP4 marks it an attached picture):
    taken for it, the Matroska clip's "depth clip" would be one frame of the cover, said written."""
    ffmpeg = _tool("ffmpeg", "ffmpeg")
    picture, cover = tmp_path / "v.mp4", tmp_path / "cover.png"
    _phone_clip(picture, durations=[512] * 10, time_base=Fraction(1, 15360))
    cv2.imwrite(str(cover), np.full((320, 320, 3), 200, np.uint8))  # larger than the picture
    run = [ffmpeg, "-v", "error", "-y"]
    once(str(picture), "-o", str(tmp_path / "alone_depth.mkv"))
    alone = _frame_digests(tmp_path / "alone_depth.mkv")
    assert len(alone) == 10
    for ext in (".mkv",):  # MP4 lists an attached picture after the picture; Matroska may list it first
        source = tmp_path / f"covered{ext}"
        subprocess.run([*run, "-i", str(cover), "-i", str(picture), "-map", "0", "-map", "1", "-c", "copy",
                        "-disposition:v:0", "attached_pic", str(source)], check=True)
        out = tmp_path / f"covered{ext}_depth.mkv"
        done = once(str(source), "-o", str(out))
        assert done.stdout.startswith("1 depth clip written (10 frames)"), done.stdout
        assert _frame_digests(out) == alone  # the picture's maps, frame for frame
    # A proxy track, a frame longer, neither marked default (MPEG-TS, Matroska as some tools write it):
    # the picture is the larger one, not the longest.
    proxy = tmp_path / "proxy.mkv"
    subprocess.run([*run, "-i", str(picture), "-vf", "scale=80:48,tpad=stop=1:stop_mode=clone", "-c:v", "libx264", str(tmp_path / "small.mkv")], check=True)
    subprocess.run([*run, "-i", str(picture), "-i", str(tmp_path / "small.mkv"), "-map", "1", "-map", "0", "-c", "copy",
                    "-disposition:v:0", "0", "-disposition:v:1", "0", str(proxy)], check=True)
    done = once(str(proxy), "-o", str(tmp_path / "proxy_depth.mkv"))
    assert done.stdout.startswith("1 depth clip written (10 frames)"), done.stdout
    assert _frame_digests(tmp_path / "proxy_depth.mkv") == alone


def _frame_digests(path: Path) -> list[str]:
    lines = subprocess.run([_tool("ffmpeg", "ffmpeg"), "-v", "error", "-i", str(path), "-map", "0:v", "-f", "framemd5", "-"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return [line.rsplit(",", 1)[1].strip() for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("ext", [".mov", ".mp4"])
def test_a_turned_phone_clip_gives_a_depth_clip_with_its_display_matrix(tmp_path: Path, ext: str) -> None:
    source = tmp_path / f"turned{ext}"
    _phone_clip(source, durations=[512] * 8, time_base=Fraction(1, 15360), rotation=90)
    out = tmp_path / f"turned_depth{ext}"
    once(str(source), "-o", str(out), "--normalise", "frame")

    def side(path: Path) -> tuple[object, object]:
        data = ffprobe(path, "stream_side_data=rotation,displaymatrix")["streams"][0].get("side_data_list", [])
        matrix = [d for d in data if "rotation" in d]
        return (matrix[0]["rotation"], matrix[0]["displaymatrix"]) if matrix else (None, None)

    rotation, matrix = side(source)
    assert rotation in (90, -90)  # what the phone said, as ffprobe reads it
    assert side(out) == (rotation, matrix)
    if ext != ".mov":
        return
    # An image sequence has no matrix to carry: its frames are turned as players turn the clip (FFmpeg's
    # own autorotate of the depth clip shows the same picture), not left lying on their side.
    once(str(source), "-o", str(tmp_path / "turned_seq/{frame:04d}.png"), "--normalise", "frame")
    frame = cv2.imread(str(tmp_path / "turned_seq" / "0003.png"), cv2.IMREAD_UNCHANGED).astype(np.float64)
    assert frame.shape == (SIZE[0], SIZE[1])  # 90 wide, 160 high, as the clip is seen
    ffmpeg = _tool("ffmpeg", "ffmpeg")

    def third(clip: Path, into: Path, *pix_fmt: str) -> Path:  # frame 3 as FFmpeg shows it (autorotated)
        subprocess.run([ffmpeg, "-v", "error", "-i", str(clip), "-vf", "select=eq(n\\,3)", "-frames:v", "1", *pix_fmt, str(into)], check=True)
        return into

    seen = cv2.imread(str(third(out, tmp_path / "seen.png", "-pix_fmt", "gray16le")), cv2.IMREAD_UNCHANGED).astype(np.float64)
    assert seen.shape == frame.shape
    assert np.corrcoef(seen.ravel(), frame.ravel())[0, 1] > 0.99
    # And the model saw the picture upright, as it was trained (on its side FastDepth's map of a
    # photograph turned back correlates 0.1-0.3 with its upright one): the sequence's map is the
    # map of that frame as shown, mapped as a still.
    once(str(third(source, tmp_path / "shown.png")), "-o", str(tmp_path / "shown_depth.png"), "--normalise", "frame")
    still = cv2.imread(str(tmp_path / "shown_depth.png"), cv2.IMREAD_UNCHANGED).astype(np.float64)
    assert still.shape == frame.shape
    assert np.corrcoef(still.ravel(), frame.ravel())[0, 1] > 0.95


# -- image sequences: the clip's metadata in every EXR, frame numbers --------------------------


def test_an_exr_sequence_carries_each_frames_timecode_rate_and_pixel_aspect_and_starts_at_first_frame(tmp_path: Path) -> None:
    import OpenEXR

    source = tmp_path / "C003.mov"
    write_clip(source, pan_clip_frames(SIZE, 6, step=8), codec="prores", rate=Fraction(30000, 1001), timecode="01:00:59;28", sar=Fraction(128, 117))
    (tmp_path / "vfx.yaml").write_text("output:\n  first_frame: 1001\n")
    once(str(source), "-o", str(tmp_path / "{stem}_depth/{stem}.{frame:04d}.exr"), "-c", str(tmp_path / "vfx.yaml"))
    folder = tmp_path / "C003_depth"
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names == [f"C003.{n}.exr" for n in range(1001, 1007)]
    codes = []
    for name in names:
        header = OpenEXR.File(str(folder / name)).header()
        assert header["framesPerSecond"] == Fraction(30000, 1001)
        assert header["pixelAspectRatio"] == pytest.approx(128 / 117)
        code = header["timeCode"]
        assert code.dropFrame
        codes.append(f"{code.hours:02d}:{code.minutes:02d}:{code.seconds:02d};{code.frame:02d}")
    # Drop-frame: 01:01:00;00 and ;01 do not exist.
    assert codes == ["01:00:59;28", "01:00:59;29", "01:01:00;02", "01:01:00;03", "01:01:00;04", "01:01:00;05"]
    exrheader = shutil.which("exrheader")
    if exrheader:  # OpenEXR's own tool reads the same
        text = subprocess.run([exrheader, str(folder / names[2])], capture_output=True, text=True, check=True).stdout
        assert "time 01:01:00:02" in text and "drop frame 1" in text and "24000/1001" not in text and "30000/1001" in text


def test_a_turned_anamorphic_clips_exr_sequence_says_the_upright_pixel_aspect(tmp_path: Path) -> None:
    """A phone's anamorphic shot filmed on its side: the sequence is stored upright, and its pixels'
    aspect turns with them (4:3 stored is 3:4 upright): a header saying 4:3 would show it squashed in Nuke."""
    import OpenEXR

    ffmpeg = _tool("ffmpeg", "ffmpeg")
    turned, source = tmp_path / "turned.mp4", tmp_path / "side.mp4"
    _phone_clip(turned, durations=[512] * 4, time_base=Fraction(1, 15360), rotation=90)
    subprocess.run([ffmpeg, "-v", "error", "-y", "-i", str(turned), "-c", "copy", "-bsf:v", "h264_metadata=sample_aspect_ratio=4/3",
                    str(source)], check=True)
    shown = ffprobe(source, "stream=sample_aspect_ratio:stream_side_data=rotation")["streams"][0]
    assert shown["sample_aspect_ratio"] == "4:3" and shown["side_data_list"][0]["rotation"] in (90, -90), shown
    once(str(source), "-o", str(tmp_path / "{stem}_depth/{stem}.{frame:04d}.exr"))
    header = OpenEXR.File(str(tmp_path / "side_depth" / "side.0000.exr")).header()
    (x0, y0), (x1, y1) = header["dataWindow"]
    assert (x1 - x0 + 1, y1 - y0 + 1) == (SIZE[1], SIZE[0])  # upright: the stored picture turned
    assert header["pixelAspectRatio"] == pytest.approx(3 / 4)


def test_a_clips_sequence_is_numbered_from_0_by_default(tmp_path: Path) -> None:
    """And a sequence folder a killed `once` left half written goes at the next run beside it."""
    from depthwatch.media import cliprecord

    source = tmp_path / "short.mov"
    write_clip(source, pan_clip_frames(SIZE, 3, step=8), codec="prores")
    dead = tmp_path / ".short_depth.999999999-0123abcd.dwtmp"  # pid 999999999: no such process
    dead.mkdir()
    (dead / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    (dead / "0000.png").write_bytes(b"cut off")
    once(str(source), "-o", str(tmp_path / "{stem}_depth/{frame:04d}.png"))
    assert sorted(p.name for p in (tmp_path / "short_depth").iterdir() if not p.name.startswith(".")) == ["0000.png", "0001.png", "0002.png"]
    assert not dead.exists()


# -- a timeline to open ----------------------------------------------------------------------


def test_a_timeline_holds_any_name_a_matroska_clips_timecode_and_a_turned_clips_upright_frame(tmp_path: Path) -> None:
    """A name that is not UTF-8 (a card reader's, an old share's) with a control character in it: both clips'
    timelines are written, the .fcpxml well-formed XML (as Final Cut Pro needs), each name as the log shows it
    and each URL the name's own bytes. A Matroska clip's timecode (its tag is TIMECODE) reaches the timelines
    and the depth clip; a phone clip on its side gets an upright (portrait) project."""
    import xml.etree.ElementTree as ET

    otio = pytest.importorskip("opentimelineio", reason="timelines need the timeline extra: pip install -e '.[timeline]'")
    odd = tmp_path / os.fsdecode(b"caf\xe9 \x1b1.mkv")  # undecodable byte, then ESC
    write_clip(odd, pan_clip_frames(SIZE, 6, step=8), codec="prores", rate=Fraction(25), timecode="01:00:00:00")
    turned = tmp_path / "turned.mp4"
    _phone_clip(turned, durations=[512] * 6, time_base=Fraction(1, 15360), rotation=90)
    done = once(str(odd), str(turned), "--timeline", "-o", "{stem}_depth.mov")
    assert done.stdout.startswith("2 depth clips written"), done.stdout
    depth = tmp_path / os.fsdecode(b"caf\xe9 \x1b1_depth.mov")
    assert ffprobe(depth, "stream_tags=timecode")["streams"][0]["tags"]["timecode"] == "01:00:00:00"
    root = ET.parse(depth.with_suffix(".fcpxml")).getroot()  # well-formed XML
    assert [a.get("name") for a in root.iter("asset")] == ["caf\\udce9 \\x1b1", "caf\\udce9 \\x1b1_depth"]  # as the log shows them
    assert [m.get("src") for m in root.iter("media-rep")] == [odd.resolve().as_uri(), depth.resolve().as_uri()]
    assert odd.resolve().as_uri().endswith("/caf%E9%20%1B1.mkv")  # the name's own bytes: the URL finds the file
    assert root.find("library/event/project/sequence").get("tcStart") == "3600s"
    timeline = otio.adapters.read_from_string(depth.with_suffix(".otio").read_text(), "otio_json")
    assert timeline.global_start_time.to_frames() == 25 * 3600
    assert [t[0].media_reference.target_url for t in timeline.video_tracks()] == [odd.resolve().as_uri(), depth.resolve().as_uri()]
    shape = ET.parse(tmp_path / "turned_depth.fcpxml").getroot().find("resources/format")
    assert (shape.get("width"), shape.get("height")) == (str(SIZE[1]), str(SIZE[0]))  # upright: 90 wide, 160 high


def test_once_timeline_writes_an_otio_and_an_fcpxml_with_the_clip_on_v1_and_its_depth_clip_on_v2(prores: Path, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    otio = pytest.importorskip("opentimelineio", reason="timelines need the timeline extra: pip install -e '.[timeline]'")
    pytest.importorskip("otio_fcpx_xml_adapter", reason="the .fcpxml is read back with OpenTimelineIO's FCP X adapter (the test extra)")
    source = tmp_path / prores.name
    shutil.copy(prores, source)
    once(str(source), "--timeline")
    depth = tmp_path / "B002_C007_depth.mov"
    assert depth.is_file()
    start = otio.opentime.from_timecode("01:00:10:00", 24000 / 1001)

    timeline = otio.adapters.read_from_file(str(tmp_path / "B002_C007_depth.otio"))
    tracks = list(timeline.video_tracks())
    assert [len(t) for t in tracks] == [1, 1]
    clips = [t[0] for t in tracks]
    assert [c.media_reference.target_url for c in clips] == [source.resolve().as_uri(), depth.resolve().as_uri()]
    for clip in clips:
        assert clip.source_range.start_time.to_frames() == start.to_frames()
        assert clip.source_range.duration.to_frames() == 12
        assert clip.range_in_parent().start_time.to_frames() == 0
    assert timeline.global_start_time.to_frames() == start.to_frames()

    fcpxml = tmp_path / "B002_C007_depth.fcpxml"
    root = ET.parse(fcpxml).getroot()
    assert root.get("version") == "1.9"
    # The source's 128:117 pixels, as ffprobe reads them, in the project's format (not square).
    shape = root.find("resources/format")
    assert shape is not None and (shape.get("paspH"), shape.get("paspV")) == ("128", "117")
    assert ffprobe(source, "stream=sample_aspect_ratio")["streams"][0]["sample_aspect_ratio"] == "128:117"
    sources = [m.get("src") for m in root.iter("media-rep")]
    assert sources == [source.resolve().as_uri(), depth.resolve().as_uri()]
    read = otio.adapters.read_from_file(str(fcpxml), adapter_name="fcpx_xml")  # the FCP X adapter's own reading
    project = next(iter(read.find_children(descended_from_type=otio.schema.Timeline)))
    tracks = list(project.video_tracks())
    assert len(tracks) == 2
    placed = [[c for c in t if isinstance(c, otio.schema.Clip)] for t in tracks]
    assert [[c.name for c in p] for p in placed] == [["B002_C007"], ["B002_C007_depth"]]
    (a,), (b,) = placed
    assert a.range_in_parent() == b.range_in_parent() and a.source_range == b.source_range

    # A second run replaces its own timeline; a file of that name someone else made stays, and the run
    # is refused before any work (exit 78, the depth clip untouched), not failed after writing the clip.
    once(str(source), "--timeline")
    # One the editor opened and saved with a marker of theirs (OpenTimelineIO keeps the mark through the
    # round trip) is theirs now: a rerun must not replace it and lose the marker.
    edited = otio.adapters.read_from_file(str(tmp_path / "B002_C007_depth.otio"))
    edited.tracks[0].markers.append(otio.schema.Marker(name="FIX SKY HERE", marked_range=otio.opentime.TimeRange(start, otio.opentime.RationalTime(1, 24000 / 1001))))
    otio.adapters.write_to_file(edited, str(tmp_path / "B002_C007_depth.otio"))
    theirs = (tmp_path / "B002_C007_depth.otio").read_bytes()
    refused = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(source), "--timeline", "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=180,
    )
    assert refused.returncode == 78 and "B002_C007_depth.otio in" in refused.stderr and "edited since" in refused.stderr, refused.stderr
    assert (tmp_path / "B002_C007_depth.otio").read_bytes() == theirs
    (tmp_path / "B002_C007_depth.otio").unlink()
    once(str(source), "--timeline")  # the editor moved theirs away: made again
    fcpxml.write_text("<fcpxml version='1.10'><!-- the editor's own --></fcpxml>")
    made = depth.stat()
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(source), "--timeline", "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 78, done.stderr
    assert done.stderr == (
        f"depthwatch: {source}: its timeline B002_C007_depth.fcpxml in {tmp_path} is not a timeline depthwatch made; "
        "not replacing it; give another -o or leave out --timeline (nothing was written)\n"
    )
    assert done.stdout == ""
    assert "the editor's own" in fcpxml.read_text()
    assert (depth.stat().st_mtime_ns, depth.stat().st_ino) == (made.st_mtime_ns, made.st_ino)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
