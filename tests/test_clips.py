"""Clips in, depth clips out (`once CLIP` and `frames.clips`), checked with ffprobe and the real model.

The sources are real photographs panned a few pixels a frame, with cuts, in an
editor's codecs (ProRes 422 HQ at 23.976 with a start timecode; H.264 with
B-frames, so presentation order and the mp4 edit list matter). Frame-exact
means: ffprobe counts the same frames at the same rate and timecode, size and
pixel aspect in both; and each depth frame is the map of its own source frame,
by correlation: it matches its own frame's map better than the previous one's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av", reason="clips need the video extra: pip install -e '.[video]'")

from benchmarks.clips import pan_clip_frames, write_clip  # noqa: E402
from conftest import FASTDEPTH  # noqa: E402
from depthwatch.config import ModelConfig  # noqa: E402
from depthwatch.frames import provenance  # noqa: E402
from depthwatch.clips.job import ClipJob  # noqa: E402
from depthwatch.clips.make import make_clip  # noqa: E402
from depthwatch.frames.rules import map_is_current  # noqa: E402
from depthwatch.frames.settings import Settings  # noqa: E402
from depthwatch.imaging import codec, normalise, tensor  # noqa: E402
from depthwatch.model import catalogue  # noqa: E402
from depthwatch.model.engine import Engine  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SIZE = (160, 90)
#: Correlation is measured on maps shrunk to this (the model's own detail, not the upscale's).
COMPARE = (48, 27)


def _ffprobe() -> str:
    path = shutil.which("ffprobe")
    if path is None:
        pytest.skip("ffprobe is missing (Debian's ffmpeg package; .ci/run installs it)")
    return path


def probe(path: Path) -> dict[str, object]:
    """What ffprobe says of the first video stream: decoded frames, rate, timecode, size, pixel aspect."""
    out = subprocess.run(
        [_ffprobe(), "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,r_frame_rate,width,height,sample_aspect_ratio,has_b_frames,codec_name,pix_fmt:"
         "stream_tags=timecode:format_tags=timecode", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout
    data = json.loads(out)
    stream = data["streams"][0]
    tags = {k.lower(): v for k, v in (stream.get("tags") or {}).items()}
    fmt_tags = {k.lower(): v for k, v in (data.get("format", {}).get("tags") or {}).items()}
    sar = stream.get("sample_aspect_ratio")
    return {
        "frames": int(stream["nb_read_frames"]),
        "rate": stream["r_frame_rate"],
        "timecode": tags.get("timecode") or fmt_tags.get("timecode"),
        "size": (stream["width"], stream["height"]),
        "sar": None if sar in (None, "N/A", "0:1", "1:1") else sar,
        "codec": stream["codec_name"],
        "pix_fmt": stream["pix_fmt"],
        "b_frames": int(stream.get("has_b_frames") or 0),
    }


def same_timing(source: Path, depth: Path) -> dict[str, object]:
    a, b = probe(source), probe(depth)
    for key in ("frames", "rate", "timecode", "size", "sar"):
        assert a[key] == b[key], f"{key}: source {a[key]} but depth clip {b[key]}"
    return b


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    prores = folder / "A001_C002.mov"
    write_clip(prores, pan_clip_frames(SIZE, 30, step=10), codec="prores", timecode="01:00:00:00", sar=Fraction(4, 3))
    cuts = folder / "cuts.mp4"
    write_clip(cuts, pan_clip_frames(SIZE, 36, step=10, shot=12), codec="h264")
    return {"prores": prores, "cuts": cuts}


@pytest.fixture(scope="module")
def engine():
    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    spec = catalogue.resolve(ModelConfig(path=str(FASTDEPTH), profile="fastdepth-nyu"), Path.cwd())
    with Engine(spec) as e:
        e.wait_ready()
        yield e


def reference_maps(source: Path, engine: Engine) -> list[np.ndarray]:
    """Each source frame's own map (frame mode), as `once` on that frame as a still would make it."""
    info = engine.wait_ready()
    maps = []
    with av.open(str(source)) as container:
        for frame in container.decode(video=0):
            image = frame.to_ndarray(format="bgr24")
            model_input = tensor.prepare(codec.Decoded(image, (image.shape[1], image.shape[0]), "clip"), info.contract, info.profile)
            prediction = engine.infer(model_input, info.generation).result().prediction
            nearness = normalise.frame(prediction, info.profile.predicts)
            maps.append(cv2.resize(cv2.resize(nearness, SIZE, interpolation=cv2.INTER_LINEAR), COMPARE, interpolation=cv2.INTER_AREA))
    return maps


def depth_frames(path: Path) -> list[np.ndarray]:
    """The depth clip's frames as grey (luma), shrunk like the references; or a folder of images."""
    if path.is_dir():
        images = [_read_image(p) for p in sorted(path.iterdir()) if not p.name.startswith(".")]
    else:
        with av.open(str(path)) as container:
            images = [f.to_ndarray(format="gray16le") for f in container.decode(video=0)]
    return [cv2.resize(i.astype(np.float32), COMPARE, interpolation=cv2.INTER_AREA) for i in images]


def _read_image(path: Path) -> np.ndarray:
    if path.suffix == ".exr":
        import OpenEXR

        return OpenEXR.File(str(path)).channels()["Z"].pixels
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def assert_frame_exact(depth: list[np.ndarray], refs: list[np.ndarray]) -> None:
    assert len(depth) == len(refs)
    own = [_corr(d, r) for d, r in zip(depth, refs)]
    previous = [_corr(d, r) for d, r in zip(depth[1:], refs)]
    assert np.median(own) >= 0.95, f"median correlation with its own frame's map {np.median(own):.3f}"
    # Frame k is the map of frame k: better than of frame k-1, frame by frame.
    late = [k + 1 for k, (o, p) in enumerate(zip(own[1:], previous)) if not o > p]
    assert not late, f"frames matching the previous source frame better than their own: {late}"


def once(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args, "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_once_prores_clip_keeps_frames_rate_timecode_and_pixel_aspect(sources: dict[str, Path], engine: Engine) -> None:
    source = sources["prores"]
    done = once(str(source))
    depth = source.with_name("A001_C002_depth.mov")
    assert "1 depth clip written (30 frames), 0 failed" in done.stdout
    info = same_timing(source, depth)
    assert info["rate"] == "24000/1001" and info["timecode"] == "01:00:00:00" and info["sar"] == "4:3"
    assert (info["codec"], info["pix_fmt"]) == ("prores", "yuv422p10le")
    assert_frame_exact(depth_frames(depth), reference_maps(source, engine))
    assert [p.name for p in source.parent.iterdir() if p.name.startswith(".")] == []


def test_once_h264_with_b_frames_and_cuts(sources: dict[str, Path], engine: Engine, tmp_path: Path) -> None:
    source = sources["cuts"]
    assert probe(source)["b_frames"] > 0  # reordering to undo, so frame order can go wrong
    out = tmp_path / "cuts_depth.mkv"
    once(str(source), "-o", str(out))
    info = same_timing(source, out)
    assert (info["codec"], info["pix_fmt"]) == ("ffv1", "gray16le")
    assert_frame_exact(depth_frames(out), reference_maps(source, engine))


@pytest.mark.parametrize(
    "name", ["preview.mp4", "{stem}_depth/{frame:04d}.png", "{stem}_depth/{frame:04d}.tif", "{stem}_depth/{frame:04d}.exr"]
)
def test_other_outputs(sources: dict[str, Path], engine: Engine, tmp_path: Path, name: str) -> None:
    source = sources["cuts"]
    job = ClipJob(source, tmp_path / (name.replace("{stem}", source.stem)))
    result = make_clip(job, engine, Settings())
    assert result.ok, result.error
    refs = reference_maps(source, engine)
    if job.sequence:
        files = sorted(p for p in job.final.iterdir() if not p.name.startswith("."))
        assert (job.final / ".depthwatch").is_file()  # the folder is depthwatch's to replace
        assert [f.name for f in files][:2] == ["0000" + job.output.suffix, "0001" + job.output.suffix]
        assert len(files) == len(refs)
        assert _read_image(files[0]).dtype == (np.float32 if job.output.suffix == ".exr" else np.uint16)
    else:
        info = same_timing(source, job.output)
        assert info["codec"] == "h264"
    assert_frame_exact(depth_frames(job.final), refs)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("name", ["{stem}_depth.mkv", "{stem}_depth/{frame:04d}.png"])
def test_a_clip_replaced_by_another_take_dated_earlier_is_not_up_to_date(sources: dict[str, Path], engine: Engine, tmp_path: Path, name: str) -> None:
    """The depth clip names its clip's version, so a date alone does not make it up to date: a clip replaced
    by another take whose file is dated earlier (a card copy keeps its date, as Finder's and cp -p's do; a
    restore) is mapped again at the daemon's next start and at the farm's resume, its old depth clip newer or not."""
    source = tmp_path / "A001.mov"
    shutil.copy2(sources["prores"], source)
    # Dated ten hours ahead, as a UTC+10 camera's card reads on a machine that takes its dates for UTC:
    # by date it would never be up to date, and would be mapped again at every start of the daemon.
    ahead = time.time_ns() + 10 * 3_600_000_000_000
    os.utime(source, ns=(ahead, ahead))
    job = ClipJob(source, tmp_path / name.replace("{stem}", source.stem))
    result = make_clip(job, engine, Settings())
    assert result.ok, result.error
    assert map_is_current(source, job.output)
    earlier = time.time_ns() - 3_600_000_000_000
    other = tmp_path / ".take2.mov"
    shutil.copy(sources["cuts"], other)  # another take, as a card copy brings it: dated an hour earlier
    os.utime(other, ns=(earlier, earlier))
    os.replace(other, source)
    assert (job.final.stat().st_mtime_ns if job.final.exists() else 0) > source.stat().st_mtime_ns
    assert not map_is_current(source, job.output)
    # A depth clip that names no version (an older depthwatch's) is still judged by date.
    if not job.sequence:
        legacy = tmp_path / "legacy_depth.mkv"
        ffmpeg = shutil.which("ffmpeg") or pytest.skip("ffmpeg is missing (.ci/run installs it)")
        subprocess.run([ffmpeg, "-v", "error", "-i", str(job.final), "-c", "copy", "-metadata", "comment=depthwatch depth clip",
                        str(legacy)], check=True)
        assert map_is_current(source, legacy)


def test_a_second_run_replaces_its_own_sequence_folder_and_never_someone_elses(
    sources: dict[str, Path], engine: Engine, tmp_path: Path
) -> None:
    """Re-running over depthwatch's own image-sequence folder swaps in the new frames and drops its stale ones;
    a user's files saved in that folder stay (the same files); a folder it did not make stays."""
    source = sources["cuts"]
    folder = tmp_path / "cuts_depth"
    assert make_clip(ClipJob(source, folder / "{frame:04d}.png"), engine, Settings()).ok
    assert all(provenance.read(p)["source"] == "cuts.mp4" for p in folder.glob("*.png"))  # each frame says it is ours
    shutil.copy(folder / "0000.png", folder / "9999.png")  # a frame of an earlier, longer run
    (folder / "my_comp.nk").write_text("Root {}\n")
    (folder / "renders").mkdir()
    (folder / "renders" / "v1.exr").write_bytes(b"mine")
    comp = (folder / "my_comp.nk").stat().st_ino
    result = make_clip(ClipJob(source, folder / "{frame:04d}.png"), engine, Settings())
    assert result.ok, result.error
    assert "9999.png" not in {p.name for p in folder.iterdir()} and len(list(folder.glob("*.png"))) == 36
    assert (folder / "my_comp.nk").read_text() == "Root {}\n" and (folder / "my_comp.nk").stat().st_ino == comp
    assert (folder / "renders" / "v1.exr").read_bytes() == b"mine"
    theirs = tmp_path / "theirs_depth"
    theirs.mkdir()
    (theirs / "0000.png").write_bytes(b"an editor's own frame")
    refused = make_clip(ClipJob(source, theirs / "{frame:04d}.png"), engine, Settings())
    assert refused.error is not None and "is not a depth clip depthwatch made; not replacing it" in refused.error
    assert (theirs / "0000.png").read_bytes() == b"an editor's own frame"
    # A user's file under a frame's name, in depthwatch's own folder: the run is refused, both stay.
    (folder / "0005.png").unlink()
    (folder / "0005.png").write_bytes(b"a frame fixed by hand")
    before = sorted(p.name for p in folder.iterdir())
    clash = make_clip(ClipJob(source, folder / "{frame:04d}.png"), engine, Settings())
    assert clash.error is not None and "0005.png" in clash.error and "not a frame depthwatch made" in clash.error
    assert (folder / "0005.png").read_bytes() == b"a frame fixed by hand" and sorted(p.name for p in folder.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuts_depth", "theirs_depth"]


def _bad(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "bad"
    folder.mkdir()
    good = folder / "good.mp4"
    write_clip(good, pan_clip_frames(SIZE, 24, step=5), codec="h264")
    data = good.read_bytes()
    truncated = folder / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])  # its index (moov, at the end) is missing
    fast = folder / "good_faststart.mp4"
    with av.open(str(fast), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        for image in pan_clip_frames(SIZE, 24, step=5):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))
    cut = folder / "cut.mp4"
    cut.write_bytes(fast.read_bytes()[: fast.stat().st_size * 2 // 3])  # index first, frames cut off
    fast.unlink()
    empty = folder / "empty.mov"
    empty.write_bytes(b"")
    audio = folder / "audio.mov"
    with av.open(str(audio), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return {"truncated": truncated, "cut": cut, "empty": empty, "audio": audio}


def test_bad_clips_get_one_clear_line_each_and_no_output(tmp_path: Path) -> None:
    if not FASTDEPTH.is_file():
        pytest.skip("no real model")
    bad = _bad(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *map(str, bad.values()), "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("depthwatch: ")]
    assert len(lines) == 4, done.stderr
    said = dict(zip(bad, lines))
    assert said["truncated"].endswith("truncated.mp4: the clip is cut short: its data ends before its boxes do, or its index is missing (an unfinished copy?)")
    assert said["cut"].endswith("cut.mp4: the clip is cut short: its data ends before its boxes do, or its index is missing (an unfinished copy?)")
    assert said["empty"].endswith("empty.mov: the file is empty (0 bytes)")
    assert "audio.mov: has no video stream" in said["audio"]
    assert "0 depth clips written (0 frames), 4 failed" in done.stdout
    assert sorted(p.name for p in bad["empty"].parent.iterdir()) == ["audio.mov", "cut.mp4", "empty.mov", "good.mp4", "truncated.mp4"]


def test_frame_mode_maps_each_frame_on_its_own(sources: dict[str, Path], engine: Engine, tmp_path: Path) -> None:
    from dataclasses import replace

    source = sources["cuts"]
    steps = []
    job = ClipJob(source, tmp_path / "cuts_depth.mkv")
    result = make_clip(job, engine, replace(Settings(), normalise="frame"), on_progress=lambda p: steps.append((p.phase, p.done)))
    assert result.ok, result.error
    assert {phase for phase, _ in steps} == {"mapping"} and steps[-1][1] == 36
    same_timing(source, job.output)
    assert_frame_exact(depth_frames(job.output), reference_maps(source, engine))


def test_without_pyav_a_clip_gets_one_line_saying_what_to_install(sources: dict[str, Path]) -> None:
    code = (
        "import sys; sys.modules['av'] = None; from depthwatch.cli import main; "
        f"raise SystemExit(main(['once', {str(sources['prores'])!r}, '--model', {str(FASTDEPTH)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 78
    assert done.stderr.strip() == (
        "depthwatch: clips need PyAV (FFmpeg in-process), which is not installed; run: pip install 'depthwatch[video]'"
    )


def test_an_edit_list_that_hides_frames_is_followed(sources: dict[str, Path], engine: Engine, tmp_path: Path) -> None:
    """A trim copied without re-encoding: the container lists 36 frames, its edit list shows 24."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("ffmpeg is missing (Debian's ffmpeg package)")
    trimmed = tmp_path / "trimmed.mp4"
    subprocess.run([ffmpeg, "-v", "error", "-ss", "0.5", "-i", str(sources["cuts"]), "-c", "copy", str(trimmed)], check=True, timeout=60)
    with av.open(str(trimmed)) as container:
        listed = container.streams.video[0].frames
    shown = probe(trimmed)["frames"]
    assert listed > shown > 0  # the edit list hides the frames before the cut point
    out = tmp_path / "trimmed_depth.mkv"
    result = make_clip(ClipJob(trimmed, out), engine, Settings())
    assert result.ok, result.error
    assert same_timing(trimmed, out)["frames"] == shown
    assert_frame_exact(depth_frames(out), reference_maps(trimmed, engine))


def test_a_dead_writers_temporary_sequence_folder_is_swept(tmp_path: Path) -> None:
    """An image sequence is written into a hidden folder; one a killed writer left goes at the next start,
    all but a user's file in it (one carried over when the kill came mid-swap): that file stays, with its folder."""
    import os

    from depthwatch.files import temp_name_for
    from depthwatch.frames.writer import sweep_temp_files
    from depthwatch.media import cliprecord

    dead = tmp_path / ".shot_depth.999999999-0123abcd.dwtmp"
    dead.mkdir()
    (dead / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    (dead / "0000.png").write_bytes(b"half")  # cut off before its record
    live = temp_name_for(tmp_path / "other_depth")  # this process's: still being written
    live.mkdir()
    assert str(os.getpid()) in live.name
    swapped = tmp_path / ".cuts_depth.999999999-4567abcd.dwtmp"  # the last sequence, swapped out
    swapped.mkdir()
    (swapped / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    (swapped / "0000.png").write_bytes(b"old frame")
    (swapped / "my_comp.nk").write_text("Root {}\n")
    (tmp_path / ".notes.dwtmp").write_text("a user's, not depthwatch's naming")
    assert sweep_temp_files(tmp_path) == (1, 1)
    assert not dead.exists() and live.is_dir()
    assert sorted(p.name for p in swapped.iterdir()) == ["my_comp.nk"]
    assert (tmp_path / ".notes.dwtmp").exists()


@pytest.mark.parametrize("kind", [("mov", "no_such_encoder"), ("no_such_container", "prores_aw")], ids=["encoder", "container"])
def test_a_clip_writer_that_cannot_start_leaves_no_file(tmp_path: Path, kind: tuple[str, str]) -> None:
    """The writer creates its file first; one that cannot start (an encoder or a container FFmpeg refuses,
    or a farm manager's SIGTERM arriving meanwhile) has no caller to remove it yet: under load a range task
    can be cancelled that way, and must not leave its partial segment."""
    from depthwatch.media import clipwrite
    from depthwatch.media.video import ClipInfo

    container, encoder = kind
    info = ClipInfo(96, 64, Fraction(24), 10, None, None, "prores")
    target = tmp_path / ".segment.part"
    with pytest.raises(ValueError, match="no_such"):  # FFmpeg's refusal, as PyAV raises it
        clipwrite.ClipWriter(target, clipwrite.Kind(container, encoder, "yuv422p10le"), info)
    assert list(tmp_path.iterdir()) == []
    # Its name is free again: a writer made next there starts.
    writer = clipwrite.ClipWriter(target, clipwrite.KINDS[".mov"], info)
    writer.abort()
    assert target.exists()


def test_the_farm_clients_sweep_takes_a_killed_joins_temporary_sequence_folder_and_only_depthwatchs_files(
    tmp_path: Path,
) -> None:
    """`once --farm` sweeps its targets' leftovers after a job: a sequence folder a killed client left too."""
    from depthwatch.frames.writer import sweep_temp_files_for
    from depthwatch.media import cliprecord

    target = tmp_path / "shot_depth"
    killed = tmp_path / ".shot_depth.4242-0123abcd.dwtmp"  # a worker's pid, on another machine
    killed.mkdir()
    (killed / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    (killed / "0000.png").write_bytes(b"half")
    kept = tmp_path / ".shot_depth.4242-4567abcd.dwtmp"  # one a user's file was carried into
    kept.mkdir()
    (kept / cliprecord.SEQUENCE_MARKER).write_text(cliprecord.marker_text("{frame:04d}.png"))
    (kept / "my_comp.nk").write_text("Root {}\n")
    (tmp_path / ".shot_depth.mov.4242-89abcdef.dwtmp").write_bytes(b"another target's")
    assert sweep_temp_files_for([target]) == 1
    assert not killed.exists()
    assert sorted(p.name for p in kept.iterdir()) == ["my_comp.nk"]
    assert (tmp_path / ".shot_depth.mov.4242-89abcdef.dwtmp").exists()


def test_once_swaps_a_sequence_in_one_exchange_of_fsynced_frames_and_keeps_a_users_file(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    """`once shot.mp4 -o 'seq/{frame:04d}.png'` twice, with a user's file saved in seq/ between: the second run
    swaps the folders in one renameat2(RENAME_EXCHANGE) (the first took the free name with RENAME_NOREPLACE),
    every frame is fsynced before, and the user's file is there after."""
    from daemon_process import strace_works

    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    why = strace_works()
    if why:
        pytest.skip(why)
    source = tmp_path / "shot.mp4"
    shutil.copy(sources["cuts"], source)
    traces = []
    for run in range(2):
        trace = tmp_path / f"trace{run}.txt"
        traces.append(trace)
        done = subprocess.run(
            ["strace", "-f", "-qq", "--seccomp-bpf", "-y", "-e", "trace=renameat2,rename,renameat,fsync", "-e", "signal=none",
             "-o", str(trace), sys.executable, "-m", "depthwatch", "once", str(source), "-o", "seq/{frame:04d}.png",
             "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
            capture_output=True, text=True, timeout=170, cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        if run == 0:
            (tmp_path / "seq" / "my_comp.nk").write_text("Root {}\n")
    seq = str(tmp_path / "seq")
    first, second = (t.read_text() for t in traces)
    cwd = r"AT_FDCWD(?:<[^>]*>)?"  # strace -y names the folder
    into_seq = rf'renameat2\({cwd}, "[^"]*\.seq\.\d+(?:t\d+)?(?:h[0-9a-f]{{6}})?-[0-9a-f]{{8}}\.dwtmp", {cwd}, "{re.escape(seq)}", '
    assert re.search(into_seq + r"RENAME_NOREPLACE\) = 0", first), first[-3000:]
    swaps = re.findall(into_seq + r"RENAME_EXCHANGE\) = 0", second)
    assert len(swaps) == 1, second[-3000:]
    assert not re.search(rf'\brename(at)?\([^)]*"{re.escape(seq)}"', second), "the old folder stepped aside by a plain rename"
    synced = set(re.findall(r"fsync\(\d+<[^>]*\.seq\.\d+(?:t\d+)?(?:h[0-9a-f]{6})?-[0-9a-f]{8}\.dwtmp/(\d{4}\.png)>\) = 0", second))
    assert len(synced) == 36, sorted(synced)
    assert (tmp_path / "seq" / "my_comp.nk").read_text() == "Root {}\n"
    assert len(list((tmp_path / "seq").glob("*.png"))) == 36
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_kill_between_the_renames_of_a_swap_costs_no_sequence(tmp_path: Path) -> None:
    """Where the folders cannot be exchanged (under a recursive watch) a sequence is replaced by three renames; a kill
    after the first leaves its name empty, the last good sequence and the new one aside: the next start puts the
    newer whole one back and clears the other. A sequence cut off mid-mapping is never put back."""
    import os

    from depthwatch.frames.writer import sweep_temp_files
    from depthwatch.media import cliprecord

    def sequence(name: str, frames: bytes, whole: bool, age_s: int) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "0000.png").write_bytes(frames)
        marker = folder / cliprecord.SEQUENCE_MARKER
        marker.write_text(cliprecord.marker_text("{frame:04d}.png", whole=whole))
        os.utime(marker, ns=(marker.stat().st_mtime_ns - age_s * 10**9,) * 2)
        return folder

    sequence(".cuts_depth.999999999-0000aaaa.dwtmp", b"last good", whole=True, age_s=60)
    sequence(".cuts_depth.999999999-0000bbbb.dwtmp", b"new", whole=True, age_s=1)
    sequence(".shot_depth.999999999-0000cccc.dwtmp", b"cut off", whole=False, age_s=0)
    assert sweep_temp_files(tmp_path) == (2, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuts_depth"]
    assert (tmp_path / "cuts_depth" / "0000.png").read_bytes() == b"new"
    assert sweep_temp_files(tmp_path) == (0, 0)


def _once_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", *args, "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=120, check=False,
    )


def _errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("depthwatch: ")]


def test_two_clips_for_one_depth_clip_are_refused_before_any_work(tmp_path: Path) -> None:
    """`once a.mp4 a.mov` under `{stem}_depth.mov`: one line, exit 78, nothing written (as for frames)."""
    if not FASTDEPTH.is_file():
        pytest.skip("no real model")
    write_clip(tmp_path / "a.mp4", pan_clip_frames(SIZE, 6, step=5), codec="h264")
    write_clip(tmp_path / "a.mov", pan_clip_frames(SIZE, 6, step=5), codec="prores")
    done = _once_run(str(tmp_path / "a.mp4"), str(tmp_path / "a.mov"))
    assert done.returncode == 78, done.stderr
    assert _errors(done) == [
        (
            f"depthwatch: {tmp_path / 'a.mp4'} and {tmp_path / 'a.mov'} both map to {tmp_path / 'a_depth.mov'}; one depth clip "
            "would replace the other: name outputs with {name} (e.g. -o '{name}_depth.mov') or leave one out (nothing was written)"
        )
    ]
    assert "loaded" not in done.stderr  # refused before the model loads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mov", "a.mp4"]
    # With {name} each gets its own, and the summary counts the clips written.
    done = once(str(tmp_path / "a.mp4"), str(tmp_path / "a.mov"), "-o", "{name}_depth.mov")
    assert "2 depth clips written (12 frames), 0 failed" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mov", "a.mov_depth.mov", "a.mp4", "a.mp4_depth.mov"]


def test_a_depth_clip_is_known_by_its_mark_not_its_name(tmp_path: Path) -> None:
    """A copy of a depth clip, or one named by an old template, is never taken as a clip."""
    if not FASTDEPTH.is_file():
        pytest.skip("no real model")
    write_clip(tmp_path / "shot.mov", pan_clip_frames(SIZE, 6, step=5), codec="prores")
    once(str(tmp_path / "shot.mov"))
    shutil.copy(tmp_path / "shot_depth.mov", tmp_path / "copy.mov")
    done = _once_run(str(tmp_path / "copy.mov"))
    assert done.returncode == 1
    assert _errors(done) == [f"depthwatch: {tmp_path / 'copy.mov'}: is a depth clip depthwatch made; not taken as a clip"]
    assert "loaded" not in done.stderr
    # The folder under another template: shot.mov is mapped again, the depth clips are not.
    done = once(str(tmp_path), "-o", "{stem}_matte.mov")
    assert "1 depth clip written (6 frames), 0 failed" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.mov", "shot.mov", "shot_depth.mov", "shot_matte.mov"]

    # A matte an editor graded from the depth clip with FFmpeg carries its comment (FFmpeg copies a
    # file's metadata into what it makes of it), but its first frame is its own: it is the editor's,
    # neither replaced at an output's name nor refused as a clip.
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("ffmpeg is missing (Debian's ffmpeg package; .ci/run installs it)")
    graded = tmp_path / "graded.mov"
    subprocess.run([ffmpeg, "-v", "error", "-i", str(tmp_path / "shot_depth.mov"), "-vf", "boxblur=2", "-c:v", "prores_ks", str(graded)], check=True)
    with av.open(str(graded)) as container:
        assert container.metadata["comment"].startswith("depthwatch depth clip")
    before = graded.read_bytes()
    done = _once_run(str(tmp_path / "shot.mov"), "-o", str(graded))
    assert done.returncode == 78, done.stderr
    assert "graded.mov is not a depth clip depthwatch made; not replacing it" in done.stderr
    assert graded.read_bytes() == before
    done = once(str(graded))
    assert "1 depth clip written (6 frames), 0 failed" in done.stdout
    assert (tmp_path / "graded_depth.mov").is_file()


def test_a_users_clip_at_the_output_is_refused_before_the_model_loads(sources: dict[str, Path], engine: Engine, tmp_path: Path) -> None:
    """An editor's own shot_depth.mov: exit 78 and one line at once, not after the whole clip was mapped."""
    source = tmp_path / "shot.mov"
    shutil.copy(sources["prores"], source)
    theirs = tmp_path / "shot_depth.mov"
    shutil.copy(sources["cuts"], theirs)  # a real clip, not depthwatch's
    before = theirs.read_bytes()
    done = _once_run(str(source))
    assert done.returncode == 78, done.stderr
    assert _errors(done) == [
        (
            f"depthwatch: {source}: its output {theirs} is not a depth clip depthwatch made; not replacing it: "
            "give another -o (nothing was written)"
        )
    ]
    assert "loaded" not in done.stderr
    assert theirs.read_bytes() == before
    # The daemon's path (make_clip) refuses it before decoding a frame, too.
    steps: list[int] = []
    result = make_clip(ClipJob(source, theirs), engine, Settings(), on_progress=lambda p: steps.append(p.done))
    assert result.error == f"{theirs} is not a depth clip depthwatch made; not replacing it: move it away or change output.clip_template"
    assert steps == [] and not result.retryable
    assert theirs.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot.mov", "shot_depth.mov"]


def _write_plain(path: Path, codec: str, pix_fmt: str, count: int) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], pix_fmt
        for image in pan_clip_frames(SIZE, count, step=5):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))


def test_a_clip_cut_short_without_an_end_structure_is_an_error(engine: Engine, tmp_path: Path) -> None:
    """AVI and MXF have no end structure to check: the frames decoded must be the frames the header declares."""
    if not FASTDEPTH.is_file():
        pytest.skip("no real model")
    whole, cut = tmp_path / "whole.avi", tmp_path / "cut.avi"
    _write_plain(whole, "mjpeg", "yuvj420p", 24)
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])  # a copy that stopped: its header still says 24 frames
    done = _once_run(str(cut))
    assert done.returncode == 1
    [line] = _errors(done)
    assert re.fullmatch(
        rf"depthwatch: {re.escape(str(cut))}: the clip is cut short: it holds \d+ of the 24 frames its header declares \(an unfinished copy\?\)",
        line,
    ), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.avi", "whole.avi"]  # no depth clip, no temporary file
    mxf = tmp_path / "whole.mxf"
    _write_plain(mxf, "mpeg2video", "yuv422p", 24)
    data = mxf.read_bytes()
    (tmp_path / "cut.mxf").write_bytes(data[: len(data) * 2 // 3])
    result = make_clip(ClipJob(tmp_path / "cut.mxf", tmp_path / "cut_depth.mkv"), engine, Settings())
    assert result.error is not None and "of the 24 frames its header declares" in result.error, result.error
    # One that changes while it is mapped (still being copied) is no bad clip: its next version comes.
    changing = tmp_path / "changing.avi"
    _write_plain(changing, "mjpeg", "yuvj420p", 96)
    data = changing.read_bytes()

    def cut_it(progress: object) -> None:
        if getattr(progress, "done", 0) == 2 and changing.stat().st_size == len(data):
            os.truncate(changing, len(data) // 3)

    result = make_clip(ClipJob(changing, tmp_path / "changing_depth.mkv"), engine, Settings(), on_progress=cut_it)
    assert result.superseded and result.error == "the clip changed while it was being mapped (still being copied?); it starts over with the new version"
    changing.unlink()
    # The whole ones are mapped, every frame.
    for path in (whole, mxf):
        result = make_clip(ClipJob(path, tmp_path / f"{path.stem}_{path.suffix[1:]}_depth.mkv"), engine, Settings())
        assert result.ok and result.frames == 24, result.error
    assert not (tmp_path / "cut_depth.mkv").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _faststart(path: Path, count: int = 24) -> bytes:
    """An mp4 with its index first (moov before mdat), as editors' exports often are."""
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        for image in pan_clip_frames(SIZE, count, step=5):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))
    return path.read_bytes()


def _state(path: Path) -> tuple[bool | None, bool]:
    from depthwatch.media import wholeness

    with open(path, "rb") as f:
        return wholeness.state_at(lambda offset, n: os.pread(f.fileno(), n, offset), os.stat(path).st_size)


def test_a_preallocated_copy_still_being_filled_in_is_told_apart(sources: dict[str, Path], tmp_path: Path) -> None:
    """A copier that sets the full size first: the boxes add up long before the data is in; the zeros say so."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("ffmpeg is missing (Debian's ffmpeg package)")
    mp4 = _faststart(tmp_path / "fast.mp4")
    mkv = tmp_path / "clip.mkv"
    subprocess.run([ffmpeg, "-v", "error", "-i", str(sources["cuts"]), "-c", "copy", str(mkv)], check=True, timeout=60)
    for name, data in (("fast.mp4", mp4), ("clip.mkv", mkv.read_bytes()), ("prores.mov", sources["prores"].read_bytes())):
        copy = tmp_path / f"copy_{name}"
        with open(copy, "wb") as f:
            f.truncate(len(data))  # preallocated: the full size, zeros
            for filled in (len(data) // 3, len(data) * 2 // 3, len(data) - 64):
                f.seek(0)
                f.write(data[:filled])
                f.flush()
                whole, filling = _state(copy)
                assert (whole, filling) in ((True, True), (False, False)), (name, filled, whole, filling)
            f.seek(0)
            f.write(data)
        assert _state(copy) == (True, False), name
    # The faststart mp4 and the Matroska file are whole in structure long before their data is in.
    copy = tmp_path / "copy_fast.mp4"
    with open(copy, "r+b") as f:
        f.seek(len(mp4) - 100)
        f.write(bytes(100))
    assert _state(copy) == (True, True)


def test_a_depth_clip_names_its_clip_which_keeps_it_but_a_copied_folder_is_its_own(sources: dict[str, Path], tmp_path: Path) -> None:
    """`/out/{stem}_depth.mov` from day1/A001.mov: day2/A001.mov is refused in one line while day1's is there (the
    depth clip names its clip), and maps once it is gone; a folder copied with its depth clip (dates not kept)
    is mapped again in its new place, not refused for the clip it was copied from."""
    from depthwatch.media import cliprecord

    out = tmp_path / "out"
    for day in ("day1", "day2"):
        (tmp_path / day).mkdir()
        shutil.copy(sources["prores"], tmp_path / day / "A001.mov")
    template = str(out / "{stem}_depth.mov")
    once(str(tmp_path / "day1" / "A001.mov"), "-o", template)
    output = out / "A001_depth.mov"
    assert cliprecord.made_for(output) == tmp_path / "day1" / "A001.mov"
    made = output.stat().st_mtime_ns
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(tmp_path / "day2" / "A001.mov"), "-o", template,
         "--model", str(FASTDEPTH), "--profile", "fastdepth-nyu"], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0 and "A001.mov maps to A001_depth.mov too; one depth clip would replace the other" in done.stderr
    assert output.stat().st_mtime_ns == made
    (tmp_path / "day1" / "A001.mov").unlink()
    once(str(tmp_path / "day2" / "A001.mov"), "-o", template)
    assert cliprecord.made_for(output) == tmp_path / "day2" / "A001.mov"
    # Beside its clip: a folder copied elsewhere (dates not kept) gets its depth clip made again there.
    copied = tmp_path / "copied"
    copied.mkdir()
    once(str(tmp_path / "day2" / "A001.mov"), "-o", str(tmp_path / "day2" / "{stem}_depth.mov"))
    for name in ("A001.mov", "A001_depth.mov"):
        shutil.copy(tmp_path / "day2" / name, copied / name)
    once(str(copied / "A001.mov"))
    assert cliprecord.made_for(copied / "A001_depth.mov") == copied / "A001.mov"


def test_a_copy_filled_in_out_of_order_is_told_apart_by_its_index(sources: dict[str, Path], tmp_path: Path) -> None:
    """Head and tail written, a piece of the middle still zeros (a parallel copier): the index says a video
    sample there is not written yet; whole again, it is whole."""
    mp4 = _faststart(tmp_path / "fast.mp4", 48)
    for name, data in (("fast.mp4", mp4), ("prores.mov", sources["prores"].read_bytes())):
        copy = tmp_path / f"holed_{name}"
        middle = len(data) // 2
        copy.write_bytes(data[:middle] + bytes(len(data) // 10) + data[middle + len(data) // 10 :])
        assert _state(copy) == (True, True), name
        copy.write_bytes(data)
        assert _state(copy) == (True, False), name


def test_a_crafted_index_gives_no_verdict_and_no_error(tmp_path: Path) -> None:
    """Counts of four billion, and bytes flipped at random in the index: the look at the samples is bounded,
    and never raises (the settle thread must go on)."""
    import random

    from depthwatch.media import mp4index, wholeness

    data = bytearray(_faststart(tmp_path / "fast.mp4", 24))
    _whole, _last, (start, end) = wholeness._boxes_complete(lambda o, n: bytes(data[o : o + n]), len(data))
    stsz = data.index(b"stsz", start)
    crafted = bytes(data[: stsz + 12]) + b"\xff\xff\xff\xff" + bytes(data[stsz + 16 :])  # its sample count
    assert mp4index.unwritten(lambda o, n: crafted[o : o + n], start, end, len(crafted)) is False
    rng = random.Random(7)
    for _ in range(300):
        flipped = bytearray(data)
        for _ in range(4):
            flipped[rng.randrange(start, end)] = rng.randrange(256)
        assert mp4index.unwritten(lambda o, n: bytes(flipped[o : o + n]), start, end, len(flipped)) in (True, False)


def test_the_box_walk_is_bounded(tmp_path: Path) -> None:
    """8 MiB of 8-byte boxes: the walk stops at MOST_TOP_BOXES and leaves it to settling (no verdict)."""
    from depthwatch.media import wholeness

    crafted = tmp_path / "crafted.mp4"
    crafted.write_bytes(b"\x00\x00\x00\x10ftypisom\x00\x00\x02\x00" + b"\x00\x00\x00\x08free" * (1 << 20))
    size = crafted.stat().st_size
    reads = 0
    with open(crafted, "rb") as f:

        def read(offset: int, n: int) -> bytes:
            nonlocal reads
            reads += 1
            f.seek(offset)
            return f.read(n)

        assert wholeness.is_complete_at(read, size) is None
    assert reads <= wholeness.MOST_TOP_BOXES + 2
