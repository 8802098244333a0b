"""EXR as compositors expect it: float depth in channel Z out, scene-linear RGB(A) frames in.

Read back with the OpenEXR package itself (what Nuke and Resolve build on),
with the real FastDepth model on a real photograph, through `depthwatch once`
and the real daemon.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import OpenEXR
import pytest
import yaml
from conftest import write_by_rename
from daemon_process import DaemonProcess, wait_for

from depthwatch import config as configuration
from depthwatch.errors import ConfigError, FrameError
from depthwatch.frames import provenance
from depthwatch.frames.rules import map_is_current
from depthwatch.imaging import codec, exrlayout, formats, view


def exr_bytes(channels: dict[str, np.ndarray], *, tiled: bool = False, compression: object = None) -> bytes:
    header: dict[str, object] = {
        "compression": OpenEXR.ZIP_COMPRESSION if compression is None else compression,
        "type": OpenEXR.tiledimage if tiled else OpenEXR.scanlineimage,
    }
    if tiled:
        tiles = OpenEXR.TileDescription()
        tiles.xSize, tiles.ySize, tiles.mode = 16, 16, OpenEXR.ONE_LEVEL
        header["tiles"] = tiles
    out = io.BytesIO()
    with OpenEXR.File(header, channels) as image:
        image.write(out)
    return out.getvalue()


def read_exr(data: bytes) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    with OpenEXR.File(io.BytesIO(data), separate_channels=True) as image:
        return dict(image.header()), {name: np.array(c.pixels) for name, c in image.channels().items()}


def photograph(size: tuple[int, int] = (320, 240)) -> np.ndarray:
    """A real photograph (BGR uint8), small enough to be cheap."""
    from skimage import data

    return cv2.resize(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), size, interpolation=cv2.INTER_AREA)


def scene_linear(bgr: np.ndarray) -> np.ndarray:
    """The photograph as a renderer would store it: linear light, float32 RGB."""
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB).astype(np.float64) / 255.0
    return view.srgb_decode(rgb).astype(np.float32)


def once(cwd: Path, *args: str, model: Path, profile: str = "fastdepth-nyu") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args, "--model", str(model), "--profile", profile],
        capture_output=True, text=True, cwd=cwd, timeout=180, check=False,
    )


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64).ravel(), b.astype(np.float64).ravel())[0, 1])


# -- out: channel Z, float or half, with the record ------------------------------------------------


def test_an_exr_map_from_once_is_float_z_with_its_record_and_matches_the_png_map(tmp_path, fastdepth):
    cv2.imwrite(str(tmp_path / "shot.png"), photograph())

    as_exr = once(tmp_path, "shot.png", "-o", "map.exr", "--normalise", "frame", model=fastdepth)
    as_png = once(tmp_path, "shot.png", "-o", "map.png", "--normalise", "frame", model=fastdepth)

    assert as_exr.returncode == 0 and as_png.returncode == 0, as_exr.stderr + as_png.stderr
    data = (tmp_path / "map.exr").read_bytes()
    header, channels = read_exr(data)
    assert sorted(channels) == ["B", "G", "R", "Z"] and all(np.array_equal(channels[c], channels["Z"]) for c in "RGB")  # what viewers show
    z = channels["Z"]
    assert z.dtype == np.float32 and z.shape == (240, 320)
    assert header["compression"] == OpenEXR.ZIP_COMPRESSION
    png = cv2.imread(str(tmp_path / "map.png"), cv2.IMREAD_UNCHANGED)
    assert png.dtype == np.uint16
    assert correlation(z, png) >= 0.999
    # Not quantised to 16 bits: the float map has values between the PNG's levels.
    assert np.mean(np.abs(z * 65535 - np.round(z * 65535)) > 1e-2) > 0.5
    # The record, as a string attribute: recognised as depthwatch's map, current for this frame.
    assert str(header["depthwatch"]).startswith('depthwatch {"source":"shot.png"')
    assert provenance.read(tmp_path / "map.exr")["source"] == "shot.png"
    assert map_is_current(tmp_path / "shot.png", tmp_path / "map.exr")
    os.utime(tmp_path / "shot.png", ns=(1, 1))  # another version of the frame: the map is stale
    assert not map_is_current(tmp_path / "shot.png", tmp_path / "map.exr")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_the_default_exr_map_is_a_grey_picture_to_ffmpeg_and_imagemagick_and_z_alone_on_request(tmp_path, fastdepth):
    """Not depthwatch's reading: ffmpeg (which refuses a Z-only EXR) and ImageMagick decode the map."""
    ffmpeg, convert = shutil.which("ffmpeg"), shutil.which("convert")
    if ffmpeg is None:
        pytest.skip("ffmpeg is missing (Debian's ffmpeg package; .ci/run installs it)")
    cv2.imwrite(str(tmp_path / "shot.png"), photograph())
    done = once(tmp_path, "shot.png", "-o", "map.exr", "--normalise", "frame", model=fastdepth)
    assert done.returncode == 0, done.stderr
    z = read_exr((tmp_path / "map.exr").read_bytes())[1]["Z"]
    seen = subprocess.run(
        [ffmpeg, "-v", "error", "-i", str(tmp_path / "map.exr"), "-f", "rawvideo", "-pix_fmt", "grayf32le", "-"],
        capture_output=True, check=True,
    )
    grey = np.frombuffer(seen.stdout, np.float32).reshape(z.shape)
    assert correlation(grey, z) >= 0.999 and grey.std() > 0.05  # a picture, the map's own
    if convert is not None and "ImageMagick" in subprocess.run([convert, "-version"], capture_output=True, text=True).stdout:
        subprocess.run([convert, str(tmp_path / "map.exr"), "-depth", "16", str(tmp_path / "magick.png")], check=True)
        magick = cv2.imread(str(tmp_path / "magick.png"), cv2.IMREAD_ANYDEPTH)
        assert magick.shape == z.shape and magick.std() > 1000  # not black
        assert correlation(magick.astype(np.float32), z) >= 0.98  # sRGB-encoded by ImageMagick, so not linear
    (tmp_path / "z.yaml").write_text("output:\n  exr_channels: z\n")
    done = once(tmp_path, "shot.png", "-o", "z.exr", "--normalise", "frame", "-c", "z.yaml", model=fastdepth)
    assert done.returncode == 0, done.stderr
    header, channels = read_exr((tmp_path / "z.exr").read_bytes())
    assert list(channels) == ["Z"] and np.array_equal(channels["Z"], z)
    refused = subprocess.run([ffmpeg, "-v", "error", "-i", str(tmp_path / "z.exr"), "-f", "null", "-"], capture_output=True, text=True)
    assert refused.returncode != 0 or refused.stderr  # ffmpeg cannot show Z alone: what R, G, B are for


def test_the_map_of_a_cropped_exr_render_keeps_its_data_and_display_windows(tmp_path, tiny_model):
    """A render cropped to its bounding box (Nuke's autocrop) or with overscan stores fewer pixels
    than it displays: its map carries the same windows, so it lands on the plate."""
    rgb = np.random.default_rng(6).random((60, 80, 3)).astype(np.float32)
    header = {
        "compression": OpenEXR.ZIP_COMPRESSION,
        "type": OpenEXR.scanlineimage,
        "dataWindow": (np.array([5, 7], np.int32), np.array([84, 66], np.int32)),
        "displayWindow": (np.array([0, 0], np.int32), np.array([127, 95], np.int32)),
    }
    out = io.BytesIO()
    with OpenEXR.File(header, {"RGB": rgb}) as image:
        image.write(out)
    (tmp_path / "crop.exr").write_bytes(out.getvalue())

    done = once(tmp_path, "crop.exr", "-o", "crop_depth.exr", model=tiny_model, profile="midas-v21-small")

    assert done.returncode == 0, done.stderr
    got, channels = read_exr((tmp_path / "crop_depth.exr").read_bytes())
    assert [list(a) for a in got["dataWindow"]] == [[5, 7], [84, 66]]
    assert [list(a) for a in got["displayWindow"]] == [[0, 0], [127, 95]]
    assert channels["Z"].shape == (60, 80)


def test_a_png_map_of_a_cropped_or_overscanned_exr_is_its_display_window_with_the_data_at_its_offset(tmp_path, fastdepth):
    """A PNG has no windows: its map is the picture the plate shows, so it sits on the plate as the EXR map does."""
    rgb = scene_linear(photograph((80, 60)))
    for name, data, display in (("crop", ([5, 7], [84, 66]), ([0, 0], [127, 95])), ("over", ([-4, -2], [75, 57]), ([0, 0], [63, 47]))):
        header = {
            "compression": OpenEXR.ZIP_COMPRESSION,
            "type": OpenEXR.scanlineimage,
            "dataWindow": tuple(np.array(v, np.int32) for v in data),
            "displayWindow": tuple(np.array(v, np.int32) for v in display),
        }
        out = io.BytesIO()
        with OpenEXR.File(header, {"RGB": rgb}) as image:
            image.write(out)
        (tmp_path / f"{name}.exr").write_bytes(out.getvalue())
        for ext in ("exr", "png"):
            done = once(tmp_path, f"{name}.exr", "-o", f"{name}_depth.{ext}", "--normalise", "frame", model=fastdepth)
            assert done.returncode == 0, done.stderr
        z = read_exr((tmp_path / f"{name}_depth.exr").read_bytes())[1]["Z"]
        png = cv2.imread(str(tmp_path / f"{name}_depth.png"), cv2.IMREAD_UNCHANGED).astype(np.float64) / 65535
        (x0, y0), (d0, e0), (d1, e1) = data[0], display[0], display[1]
        assert png.shape == (e1 - e0 + 1, d1 - d0 + 1)  # the display window's size
        left, top = max(x0, d0), max(y0, e0)
        inside = png[top - e0 : top - e0 + min(z.shape[0], png.shape[0]), left - d0 : left - d0 + min(z.shape[1], png.shape[1])]
        own = z[top - y0 : top - y0 + inside.shape[0], left - x0 : left - x0 + inside.shape[1]]
        assert np.abs(inside - own).max() <= 1 / 65535 + 1e-6  # the data window's map, at its offset
        assert png.sum() == pytest.approx(inside.sum())  # nothing outside it


def test_the_exr_map_of_an_exr_plate_says_the_plates_timecode_rate_and_pixel_aspect(tmp_path, tiny_model):
    """A plate sequence's frames each carry their own timeCode: their maps line up on the timeline too."""
    code = OpenEXR.TimeCode()
    code.hours, code.minutes, code.seconds, code.frame, code.dropFrame = 10, 0, 41, 7, False
    header = {
        "compression": OpenEXR.ZIP_COMPRESSION,
        "type": OpenEXR.scanlineimage,
        "timeCode": code,
        "framesPerSecond": Fraction(25),
        "pixelAspectRatio": 2.0,
    }
    out = io.BytesIO()
    with OpenEXR.File(header, {"RGB": scene_linear(photograph((64, 48)))}) as image:
        image.write(out)
    (tmp_path / "plate.1001.exr").write_bytes(out.getvalue())
    done = once(tmp_path, "plate.1001.exr", "-o", "{stem}_depth.exr", model=tiny_model, profile="midas-v21-small")
    assert done.returncode == 0, done.stderr
    got = OpenEXR.File(str(tmp_path / "plate.1001_depth.exr")).header()
    assert (got["timeCode"].hours, got["timeCode"].minutes, got["timeCode"].seconds, got["timeCode"].frame) == (10, 0, 41, 7)
    assert not got["timeCode"].dropFrame
    assert got["framesPerSecond"] == Fraction(25) and got["pixelAspectRatio"] == 2.0


@pytest.mark.parametrize("compression", ["zip", "piz", "dwaa", "none"])
def test_exr_maps_are_half_or_float_in_each_compression(compression):
    depth = cv2.GaussianBlur(np.random.default_rng(1).random((48, 64)).astype(np.float32), (0, 0), 2)
    for half in (False, True):
        options = codec.ExrOptions(half=half, compression=compression)
        header, channels = read_exr(codec.encode(depth, ".exr", exr_options=options))
        z = channels["Z"]
        assert z.dtype == (np.float16 if half else np.float32)
        assert header["compression"].name.lower().startswith(compression if compression != "none" else "no_")
        exact = depth.astype(np.float16) if half else depth
        if compression == "dwaa":  # lossy
            assert correlation(z, depth) > 0.99
        else:
            np.testing.assert_array_equal(z, exact)


def test_exr_settings_are_checked_and_exr_templates_accepted(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("input:\n  exr_colour: display\noutput:\n  template: '{stem}_depth.exr'\n  exr_half: true\n  exr_compression: piz\n")
    config = configuration.load(path)
    assert (config.input.exr_colour, config.output.exr_half, config.output.exr_compression) == ("display", True, "piz")
    path.write_text("output:\n  exr_compression: b44\n")
    with pytest.raises(ConfigError, match=r":2:20: output.exr_compression must be one of zip, piz, dwaa, none, not 'b44'"):
        configuration.load(path)
    path.write_text("input:\n  exr_colour: srgb\n")
    with pytest.raises(ConfigError, match=r"input.exr_colour must be one of linear, display"):
        configuration.load(path)


def test_importing_depthwatch_leaves_opencvs_exr_codec_off():
    """OpenCV keeps its EXR decoder off for safety; depthwatch reads EXR with OpenEXR, not by switching it on."""
    code = "import os, depthwatch, depthwatch.frames.pipeline; print(os.environ.get('OPENCV_IO_ENABLE_OPENEXR'))"
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_ENABLE_OPENEXR"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "None", done.stderr


# -- in: scene-linear frames through the view transform --------------------------------------------


def test_a_scene_linear_exr_of_a_photograph_gets_the_photographs_map(tmp_path, fastdepth):
    photo = photograph()
    cv2.imwrite(str(tmp_path / "photo.png"), photo)
    linear = scene_linear(photo)
    (tmp_path / "linear.exr").write_bytes(exr_bytes({"RGB": linear}))
    (tmp_path / "linear_half.exr").write_bytes(exr_bytes({"RGB": linear.astype(np.float16)}, tiled=True))
    rgba = np.concatenate([linear, np.ones_like(linear[..., :1])], axis=-1)
    (tmp_path / "linear_rgba.exr").write_bytes(exr_bytes({"RGBA": rgba}, compression=OpenEXR.PIZ_COMPRESSION))

    done = once(tmp_path, ".", "-o", "{stem}_depth.png", "--normalise", "frame", model=fastdepth)

    assert done.returncode == 0, done.stderr
    maps = {name: cv2.imread(str(tmp_path / f"{name}_depth.png"), cv2.IMREAD_UNCHANGED) for name in ("photo", "linear", "linear_half", "linear_rgba")}
    for name in ("linear", "linear_half", "linear_rgba"):
        assert maps[name].shape == maps["photo"].shape
        assert correlation(maps[name], maps["photo"]) >= 0.97, name

    # Taken as display-referred instead (no view transform), the same EXR looks dark and flat
    # to the model: its map is further from the photograph's. This is what the transform fixes.
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"input": {"exr_colour": "display"}}))
    raw = once(tmp_path, "linear.exr", "-o", "raw.png", "--normalise", "frame", "-c", "config.yaml", model=fastdepth)
    assert raw.returncode == 0, raw.stderr
    raw_map = cv2.imread(str(tmp_path / "raw.png"), cv2.IMREAD_UNCHANGED)
    assert correlation(raw_map, maps["photo"]) < correlation(maps["linear"], maps["photo"])


def test_the_view_transform_rolls_highlights_off_and_keeps_every_pixel_finite():
    x = np.array([0.0, 0.18, 0.5, view.KNEE, 1.0, 2.0, 10.0, 1e6], np.float32)
    shown = view.srgb_encode(view.rolled_off(x))
    assert np.all(np.diff(shown) > 0) and shown[-1] < 1.0  # monotonic, never clipped flat at 1
    assert shown[1] == pytest.approx(0.461, abs=0.002)  # mid grey, as the sRGB curve has it
    # Smooth at the knee: the slope just above equals the slope just below.
    slopes = np.diff(view.rolled_off(np.array([view.KNEE - 1e-4, view.KNEE, view.KNEE + 1e-4])))
    assert slopes[0] == pytest.approx(slopes[1], rel=1e-3)
    # Highlights stay apart in 8 bits instead of wrapping or clipping to one white.
    eight = view.to_display(np.array([1.0, 2.0, 10.0, np.nan, np.inf, -np.inf, -0.5, 70000.0], np.float32), view.LINEAR)
    assert eight[0] < eight[1] < eight[2] <= 255
    assert list(eight[3:]) == [0, 255, 0, 0, 255]
    assert list(view.to_display(np.array([0.5, 1.0, 3.0], np.float32), view.DISPLAY)) == [128, 255, 255]


def test_sixteen_bit_png_and_tiff_frames_still_decode_as_before():
    frame = (np.random.default_rng(2).random((40, 60, 3)) * 65535).astype(np.uint16)
    for ext in (".png", ".tif"):
        decoded = codec.decode(cv2.imencode(ext, frame)[1].tobytes(), max_pixels=10**6)
        assert decoded.image.dtype == np.uint8 and decoded.size == (60, 40) and decoded.not_finite == 0
        np.testing.assert_allclose(decoded.image, frame / 257, atol=1)


# -- structure: sniffing, sizes before decoding, complete files ------------------------------------


def test_an_exr_is_sniffed_sized_and_complete_only_once_every_chunk_is_there():
    rgb = np.random.default_rng(3).random((70, 90, 3)).astype(np.float32)
    for tiled in (False, True):
        data = exr_bytes({"RGB": rgb}, tiled=tiled)
        assert data[:4] == struct.pack("<I", 0x01312F76) and formats.sniff(data) == formats.EXR
        assert formats.read_header(data) == formats.Header(formats.EXR, 90, 70)
        read = lambda o, n: data[o : o + n]  # noqa: E731
        assert formats.is_complete_at(formats.EXR, read, len(data)) is True
        for size in range(0, len(data), max(1, len(data) // 97)):  # every stage of a write cut short
            assert formats.is_complete_at(formats.EXR, read, size) is False, size
        # A writer fills the offset table when it closes the file: until then its entries are 0.
        layout = exrlayout.read_layout(read, len(data))
        unfilled = data[: layout.table] + bytes(8 * layout.chunks) + data[layout.table_end :]
        assert formats.is_complete_at(formats.EXR, lambda o, n: unfilled[o : o + n], len(unfilled)) is False


def bad_exrs() -> dict[str, tuple[bytes, str]]:
    """Broken and hostile EXRs, each with the reason its line must give."""
    rgb = np.random.default_rng(5).random((64, 80, 3)).astype(np.float32)
    good = exr_bytes({"RGB": rgb})
    tiled = exr_bytes({"RGB": rgb}, tiled=True)
    layout = exrlayout.read_layout(lambda o, n: tiled[o : o + n], len(tiled))
    at = layout.table + 8 * 7  # tile 8 was never written: its offset is 0
    missing_tile = tiled[:at] + bytes(8) + tiled[at + 8 :]
    many = exr_bytes({f"AOV{i}.R": np.zeros((8, 8), np.float16) for i in range(3000)} | {"R": np.zeros((8, 8), np.float16)})
    huge = huge_data_window()
    poisoned = rgb.copy()
    poisoned[:8, :8] = np.nan
    poisoned[-4:, -4:] = np.inf
    z_only = exr_bytes({"Z": rgb[..., 0]})
    return {
        "truncated.exr": (good[: len(good) * 2 // 3], "the EXR is incomplete: chunk "),
        "missing_tile.exr": (missing_tile, "the EXR is incomplete: tile 8 of 20 was never written (its offset is 0)"),
        "channels.exr": (many, "the EXR has 3001 channels, more than the 64 depthwatch decodes for a frame"),
        "huge.exr": (huge, "100000x100000 is 10000 megapixels, over the limit of 100"),
        "zonly.exr": (z_only, "the EXR has no R, G, B (or Y) channels, only Z: not a picture depthwatch reads"),
        "poisoned.exr": (exr_bytes({"RGB": poisoned}), ""),
    }


def huge_data_window() -> bytes:
    """A decompression bomb: a tiny file whose header declares 100000x100000 pixels, every chunk listed."""
    small = exr_bytes({"RGB": np.zeros((1, 1, 3), np.float16)}, compression=OpenEXR.NO_COMPRESSION)
    layout = exrlayout.read_layout(lambda o, n: small[o : o + n], len(small))
    window = layout.attributes["dataWindow"]
    head = bytearray(small[: layout.table])
    head[window.offset : window.offset + 16] = struct.pack("<iiii", 0, 0, 99_999, 99_999)
    chunk = small[layout.table_end :]
    table_end = len(head) + 8 * 100_000
    return bytes(head) + struct.pack("<Q", table_end) * 100_000 + chunk


def test_bad_exrs_are_refused_with_their_reason_before_decoding():
    for name, (data, reason) in bad_exrs().items():
        if not reason:
            continue
        with pytest.raises(FrameError) as caught:
            codec.decode(data, max_pixels=100_000_000)
        assert str(caught.value).startswith(reason), (name, str(caught.value))


def test_nan_and_inf_pixels_are_made_finite_and_counted():
    data, _ = bad_exrs()["poisoned.exr"]
    decoded = codec.decode(data, max_pixels=10**6)
    assert decoded.not_finite == 8 * 8 * 3 + 4 * 4 * 3
    assert (decoded.image[:8, :8] == 0).all() and (decoded.image[-4:, -4:] == 255).all()


# -- the daemon ------------------------------------------------------------------------------------


def test_a_daemon_watching_exr_frames_never_takes_its_own_maps_and_survives_bad_ones(tmp_path, fastdepth):
    d = DaemonProcess(
        tmp_path,
        fastdepth,
        watch={"patterns": ["*.exr"], "incomplete_timeout_s": 1},
        output={"template": "{stem}_depth.exr", "exr_half": True},
    )
    config = yaml.safe_load(d.config_path.read_text())
    config["model"]["profile"] = "fastdepth-nyu"
    d.config_path.write_text(yaml.safe_dump(config))
    d.start()
    try:
        linear = scene_linear(photograph((160, 120)))
        write_by_rename(d.watch / "shot.exr", exr_bytes({"RGB": linear}))
        out = d.watch / "shot_depth.exr"
        wait_for(lambda: out.exists(), what="the first EXR map")
        header, channels = read_exr(out.read_bytes())
        assert sorted(channels) == ["B", "G", "R", "Z"] and channels["Z"].dtype == np.float16 and channels["Z"].shape == (120, 160)

        # A map copied under a name the template does not make is still known by its record
        # (and quietly left alone, as every one of depthwatch's own maps is).
        write_by_rename(d.watch / "copied.exr", out.read_bytes())
        bad = bad_exrs()
        for name, (data, _) in bad.items():
            write_by_rename(d.watch / name, data)
        wait_for(lambda: (d.watch / "poisoned_depth.exr").exists(), what="the map of the frame with NaN pixels")
        lines = {
            "truncated.exr": "still incomplete after 1 s (not every chunk its offset table lists is there)",
            "missing_tile.exr": "still incomplete after 1 s (not every chunk its offset table lists is there)",
            "channels.exr": bad["channels.exr"][1],
            "huge.exr": bad["huge.exr"][1],
            "zonly.exr": bad["zonly.exr"][1],
            "poisoned.exr": "NaN or infinite values in the EXR were made finite before the model",
        }
        for name, reason in lines.items():
            wait_for(
                lambda: [line for line in d.log().splitlines() if name in line and reason in line],
                what=f"the line for {name} ({reason!r})",
            )

        # Still running: a good frame after all that gets its map.
        write_by_rename(d.watch / "after.exr", exr_bytes({"RGB": linear}))
        wait_for(lambda: (d.watch / "after_depth.exr").exists(), what="a map after the bad frames")
        assert d.proc.poll() is None
        frames = [line for line in d.frame_lines() if "_depth.exr ->" in line or "_depth_depth" in line]
        assert frames == [], frames
        assert not list(d.watch.glob("*_depth_depth.exr")) and not (d.watch / "copied_depth.exr").exists()
        assert not [p.name for p in d.watch.iterdir() if p.name.startswith(".")]
    finally:
        d.close()
