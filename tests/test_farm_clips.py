"""Clips on the farm: `once --farm ADDR CLIP` against a real `dask scheduler` and two real `depthwatch worker`s.

The sources are tiny (64x48, a few dozen frames) but real: H.264 with
B-frames cut by `ffmpeg -c copy` (so its edit list hides a lead-in), and
ProRes 422 HQ at 23.976 with a start timecode and a 4:3 pixel aspect. The
depth clip the farm makes is checked against the source with ffprobe (frame
count, rate, size, pixel aspect, timecode, every frame decoded), and frame
by frame against the depth clip local `once CLIP` makes: the same pixels.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the farm extra is not installed: pip install -e '.[farm]'")
av = pytest.importorskip("av", reason="clips need the video extra: pip install -e '.[video]'")

from benchmarks.clips import pan_clip_frames, write_clip  # noqa: E402
from daemon_process import wait_for  # noqa: E402
from depthwatch.clips import clipindex  # noqa: E402
from farm_process import run_once, start_once  # noqa: E402
from test_farm import Farm, module_farm  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SIZE = (64, 48)


def ffprobe(path: Path) -> dict[str, object]:
    """Frames decoded (each one: an error shows on stderr), rate, size, pixel aspect and timecode."""
    tool = shutil.which("ffprobe")
    if tool is None:
        pytest.skip("ffprobe is missing (Debian's ffmpeg package)")
    done = subprocess.run(
        [tool, "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,r_frame_rate,width,height,sample_aspect_ratio:stream_tags=timecode:format_tags=timecode",
         "-of", "json", str(path)],
        capture_output=True, text=True, check=True, timeout=60,
    )
    assert done.stderr == "", done.stderr  # every frame decodes without an error
    data = json.loads(done.stdout)
    stream = data["streams"][0]
    tags = {k.lower(): v for k, v in (stream.get("tags") or {}).items()}
    fmt = {k.lower(): v for k, v in (data.get("format", {}).get("tags") or {}).items()}
    sar = stream.get("sample_aspect_ratio")
    return {
        "frames": int(stream["nb_read_frames"]),
        "rate": stream["r_frame_rate"],
        "size": (stream["width"], stream["height"]),
        "sar": None if sar in (None, "N/A", "0:1", "1:1") else sar,
        "timecode": tags.get("timecode") or fmt.get("timecode"),
    }


def frames_of(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="gray16le") for f in container.decode(video=0)]


def assert_same_clip(source: Path, farm: Path, local: Path) -> None:
    """The farm's depth clip has the source's timing and shape, and local once's pixels."""
    a, b = ffprobe(source), ffprobe(farm)
    for key in ("frames", "rate", "size", "sar", "timecode"):
        assert a[key] == b[key], f"{key}: source {a[key]}, farm depth clip {b[key]}"
    mine, theirs = frames_of(farm), frames_of(local)
    assert len(mine) == len(theirs) == a["frames"]
    different = [k for k, (x, y) in enumerate(zip(mine, theirs)) if not np.array_equal(x, y)]
    assert not different, f"frames differing from local once's: {different}"
    assert np.std(mine[0]) > 100  # a real map, not a flat one


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory):
    yield from module_farm(tmp_path_factory.mktemp("farmclips"), frames_per_task=2)  # 16-frame ranges: three or so per clip


@pytest.fixture(scope="module")
def clips(farm: Farm) -> dict[str, Path]:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("ffmpeg is missing (Debian's ffmpeg package)")
    folder = farm.root / "clips"
    folder.mkdir()
    prores = folder / "A001_C002.mov"
    write_clip(prores, pan_clip_frames(SIZE, 40, step=3, shot=20), codec="prores", timecode="01:00:00:00", sar=Fraction(4, 3))
    coded = folder / "coded.mp4"
    write_clip(coded, pan_clip_frames(SIZE, 60, step=3, shot=25), codec="h264")
    trimmed = folder / "trimmed.mp4"  # cut without re-encoding: an edit list hides the frames before 0.5 s
    subprocess.run([ffmpeg, "-v", "error", "-ss", "0.5", "-i", str(coded), "-c", "copy", str(trimmed)], check=True, timeout=60)
    variable = folder / "variable.mp4"  # from frame 20 on, each frame lasts twice as long
    subprocess.run([ffmpeg, "-v", "error", "-i", str(coded), "-vf", "setpts='if(gt(N,20),2*PTS-20/TB/24,PTS)'",
                    "-fps_mode", "passthrough", "-frames:v", "40", "-c:v", "libx264", "-bf", "2", str(variable)], check=True, timeout=60)
    turned = folder / "IMG_0007.mov"  # a phone's: stored on its side, a display matrix to show it upright
    subprocess.run([ffmpeg, "-v", "error", "-i", str(coded), "-frames:v", "20", "-c:v", "libx264", str(folder / "short.mp4")], check=True, timeout=60)
    subprocess.run([ffmpeg, "-v", "error", "-i", str(folder / "short.mp4"), "-c", "copy", "-metadata:s:v", "rotate=90", str(turned)], check=True, timeout=60)
    for made in (coded, folder / "short.mp4"):
        made.unlink()
    return {"prores": prores, "bframes": trimmed, "variable": variable, "turned": turned}


_made_here: dict[tuple[Path, str], Path] = {}


def local(farm: Farm, source: Path, output: Path) -> Path:
    """Local `once CLIP`'s depth clip of `source` in `output`'s format (made once per module)."""
    made = _made_here.get((source, output.suffix))
    if made is not None:
        return made
    done = run_once(str(source), "-o", str(output), "-c", str(farm.config), cwd=farm.root)
    assert done.returncode == 0, done.stderr
    _made_here[(source, output.suffix)] = output
    return output


def test_the_index_lists_the_frames_the_decoder_gives(clips: dict[str, Path]) -> None:
    for source in clips.values():
        with av.open(str(source)) as container:
            decoded = [f.pts for f in container.decode(video=0)]
        assert list(clipindex.read(source).times) == decoded
    with av.open(str(clips["bframes"])) as container:
        packets = [p for p in container.demux(video=0) if p.size]
    assert any(p.is_discard for p in packets)  # the edit list's lead-in is there, and left out
    assert any(p.pts is not None and p.dts is not None and p.pts != p.dts for p in packets)  # B-frames


def test_a_prores_clip_on_the_farm_is_local_onces_depth_clip(farm: Farm, clips: dict[str, Path]) -> None:
    source = clips["prores"]
    out = farm.root / "farm-prores.mov"
    done = farm.once(str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_clip(source, out, local(farm, source, farm.root / "local-prores.mov"))
    assert ffprobe(out)["timecode"] == "01:00:00:00" and ffprobe(out)["sar"] == "4:3"
    assert not (farm.root / ".farm-prores.mov.farm").exists()  # the segments are gone with the job
    assert [p.name for p in farm.root.glob(".*dwtmp")] == []
    # Both workers had ranges of it.
    assert all("segment" in w.log() for w in farm.live()), [w.log()[-500:] for w in farm.live()]
    # ... through their one session, loaded once: no process started after it (strace), the no-fork check.
    if farm.strace_reason is None:
        for worker in farm.live():
            assert worker.processes_created_after(worker.status()["loaded_at"]) == []
            assert worker.status()["model_loads"] == 1


def test_a_b_frame_clip_with_an_edit_list_as_ffv1_and_h264(farm: Farm, clips: dict[str, Path]) -> None:
    source = clips["bframes"]
    for ext in (".mkv", ".mp4"):
        out = farm.root / f"farm-bframes{ext}"
        done = farm.once(str(source), "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert_same_clip(source, out, local(farm, source, farm.root / f"local-bframes{ext}"))
    # Each map on its own (--normalise frame): local once's too.
    out = farm.root / "farm-frame-mode.mkv"
    done = farm.once(str(source), "--normalise", "frame", "-o", str(out))
    assert done.returncode == 0, done.stderr
    here = run_once(str(source), "--normalise", "frame", "-o", str(farm.root / "local-frame-mode.mkv"), "-c", str(farm.config), cwd=farm.root)
    assert here.returncode == 0, here.stderr
    assert_same_clip(source, out, farm.root / "local-frame-mode.mkv")


def packets(path: Path) -> str:
    tool = shutil.which("ffprobe")
    assert tool is not None
    return subprocess.run([tool, "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts,dts,duration:stream=time_base",
                           "-of", "compact", str(path)], capture_output=True, text=True, check=True, timeout=60).stdout


def test_a_variable_rate_clip_keeps_each_frames_own_time_as_local_once(farm: Farm, clips: dict[str, Path]) -> None:
    source = clips["variable"]
    out = farm.root / "farm-variable.mov"
    done = farm.once(str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    here = local(farm, source, farm.root / "local-variable.mov")
    assert_same_clip(source, out, here)
    assert packets(out) == packets(here)  # every frame's time and duration, as local once writes them
    assert "is variable-rate" in done.stderr


def test_an_image_sequence_on_the_farm_is_local_onces_sequence(farm: Farm, clips: dict[str, Path]) -> None:
    from depthwatch.frames import provenance

    source = clips["prores"]
    here = farm.root / "local-seq"
    done = run_once(str(source), "-o", str(here / "{frame:04d}.png"), "-c", str(farm.config), cwd=farm.root)
    assert done.returncode == 0, done.stderr
    out = farm.root / "farm-seq"
    for run in range(2):  # the second swaps the new sequence for the first one
        done = farm.once(str(source), "-o", str(out / "{frame:04d}.png"))
        assert done.returncode == 0, done.stderr
        if run == 0:
            (out / "notes.nk").write_text("the user's own file")  # kept: the swap replaces only depthwatch's frames
    names = sorted(p.name for p in here.iterdir())
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "notes.nk"]) and len(names) == 41  # 40 frames, the marker
    assert (out / "notes.nk").read_text() == "the user's own file"
    for name in names:
        if name.endswith(".png"):
            mine, theirs = (cv2.imread(str(f / name), cv2.IMREAD_UNCHANGED) for f in (out, here))
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), name
            assert provenance.read(out / name) == provenance.read(here / name), name
        else:
            assert (out / name).read_bytes() == (here / name).read_bytes(), name
    assert list(farm.root.glob(".farm-seq*")) == []  # segments and the temporary folder gone


def test_the_join_never_deletes_the_folder_that_holds_a_users_files_it_could_not_carry_over(farm: Farm, clips: dict[str, Path]) -> None:
    """A folder of the user's in the sequence's folder that cannot be moved (append-only: `chattr +a`): the
    swap keeps it in the last sequence's folder and says so; that folder, and the files in it, are still there
    once the join is over."""
    source = clips["prores"]
    out = farm.root / "farm-kept-seq"
    done = farm.once(str(source), "-o", str(out / "{frame:04d}.png"))
    assert done.returncode == 0, done.stderr
    refs = out / "refs"
    (refs / "notes").mkdir(parents=True)
    (refs / "notes" / "grade.txt").write_text("the user's own notes")
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+a", str(refs)], capture_output=True).returncode != 0:
        pytest.skip("a folder cannot be made append-only here (chattr +a needs root on ext4 or xfs)")
    try:
        done = farm.once(str(source), "-o", str(out / "{frame:04d}.png"))
    finally:
        subprocess.run([chattr, "-a", str(refs)], capture_output=True)
    assert done.returncode == 0, done.stderr
    said = re.search(r"could not be carried over; they are in (\S+)", done.stderr)
    assert said is not None, done.stderr
    kept = Path(said.group(1))
    assert (kept / "refs" / "notes" / "grade.txt").read_text() == "the user's own notes"
    assert sorted(p.name for p in kept.rglob("*")) == ["grade.txt", "notes", "refs"]  # only the user's: the frames went


def test_a_turned_phone_clip_on_the_farm_is_local_onces_as_a_clip_and_as_a_sequence(farm: Farm, clips: dict[str, Path]) -> None:
    """The workers turn the frames upright for the model as local once does: the depth clip stores
    the maps turned back under the source's matrix, the sequence keeps them upright."""
    source = clips["turned"]
    out = farm.root / "farm-turned.mov"
    done = farm.once(str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_clip(source, out, local(farm, source, farm.root / "local-turned.mov"))
    here = farm.root / "local-turned-seq"
    done = run_once(str(source), "-o", str(here / "{frame:04d}.png"), "-c", str(farm.config), cwd=farm.root)
    assert done.returncode == 0, done.stderr
    there = farm.root / "farm-turned-seq"
    done = farm.once(str(source), "-o", str(there / "{frame:04d}.png"))
    assert done.returncode == 0, done.stderr
    for name in sorted(p.name for p in here.glob("*.png")):
        mine, theirs = (cv2.imread(str(f / name), cv2.IMREAD_UNCHANGED) for f in (there, here))
        assert mine.shape == (SIZE[0], SIZE[1]) and np.array_equal(mine, theirs), name  # upright: as tall as the clip is wide


def test_a_farm_managers_own_range_tasks_joined_are_local_onces_depth_clip(farm: Farm, clips: dict[str, Path]) -> None:
    # Deadline, OpenCue, Tractor: one `once CLIP --frames A-B` per task, then `once CLIP --join`; no Dask.
    source = clips["prores"]
    out = farm.root / "managed.mov"

    def once(*args: str) -> subprocess.CompletedProcess[str]:
        return run_once(str(source), "-o", str(out), "-c", str(farm.config), *args, cwd=farm.root)

    first = once("--frames", "0-12")  # cuts the first 20-frame shot: planned with the frames beyond its edge
    assert first.returncode == 0, first.stderr
    assert "frames 0-12: segment written" in first.stdout
    early = once("--join")
    assert early.returncode == 1 and not out.exists()
    assert "no segment of frames 13-39" in early.stderr and len(early.stderr.strip().splitlines()) == 1, early.stderr
    # Ranges that overlap: said as such (not "no segment of frames 13-39" with one covering them there).
    assert once("--frames", "10-39").returncode == 0
    told = once("--join")
    assert told.returncode == 1 and "the segments of frames 0-12 and 10-39 overlap (frames 10-12 are in both)" in told.stderr, told.stderr
    assert once("--frames", "13-39").returncode == 0
    again = once("--frames", "0-12")  # a task the manager retries finds its segment made
    assert again.returncode == 0 and "already made" in again.stdout, again.stdout + again.stderr
    done = once("--join", "--timeline")
    assert done.returncode == 0, done.stderr
    assert "(and its timelines, .otio and .fcpxml): 40 frames joined" in done.stdout
    # The join honours --timeline as local once and once --farm do (not none written, nothing said).
    assert out.with_suffix(".otio").is_file() and out.with_suffix(".fcpxml").is_file()
    assert_same_clip(source, out, local(farm, source, farm.root / "local-prores.mov"))
    assert not (farm.root / ".managed.mov.farm").exists()
    outside = once("--frames", "30-45")
    assert outside.returncode == 78 and "outside the clip's frames 0-39" in outside.stderr, outside.stderr


def test_a_worker_killed_mid_job_and_the_clip_still_comes_whole(farm: Farm, clips: dict[str, Path]) -> None:
    source = clips["prores"]
    victim = farm.live()[0]
    out = farm.root / "killed.mov"
    before = victim.log().count("first pass (model) done")
    job = start_once("--farm", farm.address, "-c", str(farm.config), str(source), "-o", str(out),
                     cwd=farm.root, log=farm.root / "killed.log")
    try:
        wait_for(lambda: victim.log().count("first pass (model) done") > before or job.poll() is not None, what="the victim's first range")
        assert job.poll() is None, "the job ended before the worker could be killed in it"
        victim.send(signal.SIGKILL)
        assert job.wait(180) == 0, (farm.root / "killed.log").read_text()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    victim.close()
    assert victim.proc.returncode is not None
    assert_same_clip(source, out, local(farm, source, farm.root / "local-killed.mov"))
    assert not (farm.root / ".killed.mov.farm").exists()
    farm.add_workers(1)  # for the tests after this one


def test_an_interrupted_job_run_again_renders_only_the_missing_ranges(farm: Farm, clips: dict[str, Path]) -> None:
    source = clips["prores"]
    out = farm.root / "resumed.mov"
    segments = farm.root / ".resumed.mov.farm"
    job = start_once("--farm", farm.address, "-c", str(farm.config), str(source), "-o", str(out),
                     cwd=farm.root, log=farm.root / "resumed.log")
    try:
        wait_for(lambda: any(p.suffix == ".mov" and not p.name.startswith(".") for p in segments.glob("*")) or job.poll() is not None,
                 what="a first segment")
        job.send_signal(signal.SIGKILL)
        job.wait(60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    made = sorted(p.name for p in segments.glob("*.mov") if not p.name.startswith("."))
    assert made and not out.exists(), (farm.root / "resumed.log").read_text()
    total = len(clipindex.ranges(len(clipindex.read(source)), 16))
    logs = {w.name: len(w.log()) for w in farm.live()}
    done = farm.once(str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    kept = re.search(r"(\d+) of (\d+) range\(s\) already made by an earlier run; (\d+) rendered", done.stderr)
    assert kept is not None, done.stderr
    assert int(kept[1]) >= len(made) and int(kept[1]) + int(kept[3]) == total and int(kept[2]) == total, done.stderr
    # The segments there before were not rendered again: no worker wrote one of them in the second run.
    written = [line for w in farm.live() for line in w.log()[logs.get(w.name, 0):].splitlines() if ": segment " in line]
    rewritten = [line for line in written if any(name in line for name in made)]
    assert rewritten == [] and len(written) >= int(kept[3]), written  # (a task of the killed run may finish late)
    assert_same_clip(source, out, local(farm, source, farm.root / "local-resumed.mov"))
    assert not segments.exists()


def test_a_clip_the_workers_cannot_read_fails_with_a_line_per_failed_range_and_exit_1(farm: Farm, clips: dict[str, Path]) -> None:
    # The workers' view of the storage (farm.path_map) leads nowhere: each range fails on its worker.
    farm.write_config(frames_per_task=2, path_map={str(clips["prores"].parent): str(farm.root / "not-mounted")})
    try:
        out = farm.root / "unreadable.mov"
        done = farm.once(str(clips["prores"]), "-o", str(out))
    finally:
        farm.write_config(frames_per_task=2)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if "cannot read the clip on this worker" in line]
    # One line per range: a failed first range does not hide (or cancel) the later ones.
    assert [re.search(r"frames (\d+-\d+): ", line)[1] for line in lines] == ["0-15", "16-31", "32-39"], done.stderr
    assert "A001_C002.mov: 3 range(s) failed" in done.stderr
    assert "0 depth clips written on the farm, 1 failed" in done.stdout
    assert not out.exists() and list(farm.root.glob(".unreadable.mov*")) == []  # no temporary file, no empty folder


def test_a_scheduler_that_dies_mid_clip_ends_the_run_with_a_line_not_a_hang(tmp_path: Path) -> None:
    """The scheduler killed mid-job: the run ends with one line and exit 1. Submitting more ranges to a client
    Dask has closed gives futures that never finish: a hang for good, no summary, no exit code, a farm manager's
    task that never ends."""
    from onnx_models import slow_model

    farm = Farm(tmp_path, model=slow_model(tmp_path / "slow.onnx", seconds=0.1, size=64, channels=16))
    try:
        farm.write_config(frames_per_task=1)  # 8-frame ranges: many of them
        farm.add_workers(1)
        source = tmp_path / "long.mov"
        write_clip(source, pan_clip_frames(SIZE, 120, step=2, shot=120), codec="prores")
        log = tmp_path / "run.log"
        job = start_once("--farm", farm.address, "-c", str(farm.config), str(source), "-o", str(tmp_path / "long_depth.mov"),
                         cwd=tmp_path, log=log)
        try:
            wait_for(lambda: "first pass (model) done" in farm.live()[0].log() or job.poll() is not None, what="a first range")
            assert job.poll() is None, log.read_text()
            assert farm.scheduler.proc is not None
            farm.scheduler.proc.kill()
            assert job.wait(120) == 1, log.read_text()
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        text = log.read_text()
        gone = [line for line in text.splitlines() if "is gone; the ranges made are kept: run the command again once it is back" in line]
        assert len(gone) == 1, text  # said once for the run, not once for each range in flight
        assert "0 depth clips written" in text or "1 failed" in text, text
    finally:
        farm.close()
