"""The render farm: a real `dask scheduler` and real `depthwatch worker` processes on 127.0.0.1.

One scheduler and two workers serve the whole module (each worker under strace
where it can be, to show it never starts a process after loading its model);
the tests that kill or stop workers start fresh ones for the tests after them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

pytest.importorskip("distributed", reason="the farm extra is not installed: pip install -e '.[farm]'")

from conftest import owned_by_the_module  # noqa: E402
from daemon_process import strace_works, wait_for  # noqa: E402
from farm_process import (  # noqa: E402
    FarmWorker,
    Scheduler,
    run_once,
    start_once,
)
from onnx_models import busy_brightness_model  # noqa: E402

FRAMES = 120
FIRST = 1001


def make_frames(folder: Path, count: int = FRAMES, first: int = FIRST) -> list[Path]:
    """A slow pan across a real photograph: `shot_1001.jpg`, ... (96x64 JPEGs)."""
    from skimage import data

    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        crop = photo[100 + i % 40 : 100 + i % 40 + 192, 50 + 2 * i : 50 + 2 * i + 288]
        frame = cv2.resize(crop, (96, 64), interpolation=cv2.INTER_AREA)
        path = folder / f"shot_{first + i}.jpg"
        assert cv2.imwrite(str(path), frame, [cv2.IMWRITE_JPEG_QUALITY, 95])
        paths.append(path)
    return paths


def read_map(path: Path) -> np.ndarray | None:
    return cv2.imdecode(np.frombuffer(path.read_bytes(), np.uint8), cv2.IMREAD_GRAYSCALE)


def maps_in(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.glob("*_depth.jpg")}


def temp_files(*folders: Path) -> list[str]:
    return sorted(p.name for folder in folders for p in folder.glob(".*.dwtmp"))


def assert_whole(folder: Path, count: int) -> None:
    """`count` maps, each a complete 96x64 image, and no temporary file left beside them."""
    maps = maps_in(folder)
    assert len(maps) == count, sorted(maps)
    for path in maps.values():
        image = read_map(path)
        assert image is not None and image.shape == (64, 96), f"{path.name} is torn or wrong"
    assert temp_files(folder) == []


class Farm:
    def __init__(self, root: Path, model: Path | None = None) -> None:
        self.root = root
        self.model = model or busy_brightness_model(root / "busy.onnx")
        self.config = root / "config.yaml"
        self.write_config()
        self.scheduler = Scheduler(root).start()
        self.address = self.scheduler.address
        self.strace_reason = strace_works()
        self.workers: list[FarmWorker] = []
        self._names = iter(f"w{i}" for i in range(1, 100))
        #: True for the module's farm: workers added in a test are the fixture's to stop.
        self.module_fixture = False

    def write_config(self, **farm: object) -> None:
        config = {
            # One engine everywhere, so local once and every worker compute the same maps
            # (`auto` may measure OpenVINO faster in one process and CPU in another).
            "model": {"path": str(self.model), "profile": "midas-v21-small", "providers": ["cpu"], "precision": "fp32"},
            "daemon": {"workers": 2},
            "farm": {"frames_per_task": 4, **farm},
        }
        self.config.write_text(yaml.safe_dump(config))

    def add_workers(self, count: int) -> list[FarmWorker]:
        fresh = [
            FarmWorker(self.root, next(self._names), self.address, self.config, strace=self.strace_reason is None).start()
            for _ in range(count)
        ]
        for worker in fresh:
            worker.wait_ready()
            if self.module_fixture and worker.proc is not None:
                owned_by_the_module(worker.proc.pid)  # the module's farm stops it, with the farm
        self.workers.extend(fresh)
        return fresh

    def live(self) -> list[FarmWorker]:
        return [w for w in self.workers if w.proc is not None and w.proc.poll() is None]

    def once(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_once("--farm", self.address, "-c", str(self.config), *args, cwd=self.root)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.scheduler.stop()


def module_farm(root: Path, **config: Any) -> Iterator[Farm]:
    """A scheduler and two workers for a whole module's tests (`config`: the farm section), always closed."""
    farm = Farm(root)
    if config:
        farm.write_config(**config)
    farm.module_fixture = True  # the workers tests add for the tests after them are this fixture's
    try:
        farm.add_workers(2)
        yield farm
    finally:
        farm.close()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory):
    yield from module_farm(tmp_path_factory.mktemp("farm"))


@pytest.fixture(scope="module")
def frames(farm: Farm) -> list[Path]:
    return make_frames(farm.root / "frames")


def test_farm_maps_every_frame_like_local_once_across_both_workers(farm: Farm, frames: list[Path]) -> None:
    a, b = farm.live()
    out = farm.root / "farm-maps"
    done = farm.once(str(frames[0].parent), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"{FRAMES} frame(s): 0 up to date, {FRAMES} to map" in done.stderr
    assert_whole(out, FRAMES)

    # output.normalise: stable (the default): the shot is planned on the client from every
    # frame's first pass, wherever each ran, so the maps are local once's, shot-stable ones.
    local = farm.root / "local-maps"
    here = run_once(str(frames[0].parent), "-o", str(local), "-c", str(farm.config), cwd=farm.root)
    assert here.returncode == 0, here.stderr
    assert_whole(local, FRAMES)
    for name, path in maps_in(local).items():
        mine, theirs = read_map(path).astype(int), read_map(out / name).astype(int)
        assert np.abs(mine - theirs).max() <= 3, name  # the same computation; JPEG noise at most
    assert np.std(read_map(out / f"shot_{FIRST}_depth.jpg")) > 10  # a real map, not a flat one

    # Both workers did part of the work, each with its one model load.
    shares = [wait_for(lambda w=w: w.counts().get("done"), what=f"{w.name}'s count") for w in (a, b)]
    assert all(share > 0 for share in shares) and sum(shares) == FRAMES, shares
    assert sum(len(w.frame_lines()) for w in (a, b)) == FRAMES
    for worker in (a, b):
        status = worker.status()
        assert status["model_loads"] == 1
        assert status["precision"] == "fp32" and status["counts"]["last_frame"].startswith(str(frames[0].parent)), status
        assert worker.log().count("loaded busy.onnx") == 1, worker.log()
    # ... and reported it to the scheduler, whose view the client prints per worker.
    reported = [line for line in done.stderr.splitlines() if line.startswith("depthwatch: worker ")]
    assert len(reported) == 2, done.stderr
    assert all("model busy.onnx on CPUExecutionProvider, 1 load(s)" in line for line in reported), reported


def test_per_frame_maps_on_the_farm_are_local_onces_too(farm: Farm, frames: list[Path]) -> None:
    out, local = farm.root / "frame-farm", farm.root / "frame-local"
    done = farm.once(str(frames[0].parent), "--frames", "1001-1024", "--normalise", "frame", "-o", str(out))
    assert done.returncode == 0, done.stderr
    here = run_once(str(frames[0].parent), "--frames", "1001-1024", "--normalise", "frame", "-o", str(local),
                    "-c", str(farm.config), cwd=farm.root)
    assert here.returncode == 0, here.stderr
    assert_whole(out, 24)
    for name, path in maps_in(local).items():
        assert np.abs(read_map(path).astype(int) - read_map(out / name).astype(int)).max() <= 3, name


def test_a_sequence_cut_into_range_tasks_on_the_farm_gets_the_maps_one_run_gives(farm: Farm, frames: list[Path]) -> None:
    """`once --farm --frames A-B` plans its range with the frames about it, as local `once --frames`
    does: the grey levels hold across every task's edge, a one-frame task gets its place in the shot
    (not a frame's own map), and a later whole run finds the tasks' maps up to date."""
    for folder in ("whole", "tasks"):
        (farm.root / folder).mkdir()
        for frame in frames[:21]:
            shutil.copy2(frame, farm.root / folder / frame.name)
    assert farm.once(str(farm.root / "whole")).returncode == 0
    for task in ("1001-1007", "1008", "1009-1021"):  # the shot split three ways, one task a single frame
        done = farm.once(str(farm.root / "tasks"), "--frames", task)
        assert done.returncode == 0, done.stderr
        count = 1 if task == "1008" else 7 if task == "1001-1007" else 13
        assert f"depthwatch: {count} frame(s): 0 up to date, {count} to map" in done.stderr, done.stderr
    assert_whole(farm.root / "tasks", 21)
    for name, path in maps_in(farm.root / "whole").items():
        whole, task = read_map(path).astype(int), read_map(farm.root / "tasks" / name).astype(int)
        assert np.abs(whole - task).max() <= 3, name
    again = farm.once(str(farm.root / "tasks"))
    assert "21 frame(s): 21 up to date, 0 to map" in again.stderr, again.stderr


def test_a_daemons_live_maps_of_a_sequence_are_not_taken_for_the_farms_shot_planned_ones(farm: Farm, frames: list[Path]) -> None:
    """The daemon maps each frame of a sequence live (each output's own shot state), and its records
    say so: they are not the shot planner's settings, so `once --farm` maps the frames again."""
    from daemon_process import DaemonProcess

    root = farm.root / "previewed"
    d = DaemonProcess(root, farm.model, providers=["cpu"], watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    for frame in frames[:6]:
        shutil.copy2(frame, d.watch / frame.name)
    d.start()
    try:
        wait_for(lambda: len(maps_in(d.watch)) == 6, what="the daemon's six maps")
    finally:
        assert d.stop() == 0
    done = farm.once(str(d.watch))
    assert done.returncode == 0 and "6 frame(s): 0 up to date, 6 to map" in done.stderr, done.stderr
    again = farm.once(str(d.watch))
    assert "6 frame(s): 6 up to date, 0 to map" in again.stderr, again.stderr


def test_maps_made_with_another_model_are_not_up_to_date_on_the_farm(farm: Farm, frames: list[Path]) -> None:
    """A preview made with a small model, then the farm (whose workers run another): its maps are not
    up to date there (the farm compares the model as well as the settings), so the farm maps them again."""
    folder = farm.root / "previewed-elsewhere"
    folder.mkdir()
    for frame in frames[:3]:
        shutil.copy2(frame, folder / frame.name)
    other = busy_brightness_model(farm.root / "preview.onnx")
    local = run_once(str(folder), "--model", str(other), "--profile", "midas-v21-small", "-c", str(farm.config), cwd=farm.root)
    assert local.returncode == 0, local.stderr
    done = farm.once(str(folder))
    assert done.returncode == 0 and "3 frame(s): 0 up to date, 3 to map" in done.stderr, done.stderr
    assert "3 frame(s): 3 up to date, 0 to map" in farm.once(str(folder)).stderr


def test_a_worker_never_starts_a_process_after_its_model_is_loaded(farm: Farm, frames: list[Path]) -> None:
    if farm.strace_reason is not None:
        pytest.skip(farm.strace_reason)
    worker = farm.live()[0]
    out = farm.root / "fork-check"
    assert farm.once(str(frames[0].parent), "--frames", "1001-1040", "-o", str(out)).returncode == 0
    loaded_at = worker.status()["loaded_at"]
    assert worker.processes_created_after(loaded_at) == []
    assert worker.threads_created() > 0  # the trace does see the threads it starts


def test_a_bad_frame_fails_alone_with_its_line(farm: Farm, frames: list[Path]) -> None:
    folder = farm.root / "with-bad"
    folder.mkdir()
    for frame in frames[:6]:
        shutil.copy(frame, folder / frame.name)
    (folder / "shot_2001.jpg").write_bytes(frames[6].read_bytes()[:300])  # truncated
    (folder / "shot_2002.jpg").write_text("not an image at all\n")
    # What a worker killed mid-write leaves: the client removes its job's, and only those.
    (folder / ".shot_1001_depth.jpg.0badf00d.dwtmp").write_bytes(b"half a map")
    (folder / ".other.jpg.0badf00d.dwtmp").write_bytes(b"someone else's")
    done = farm.once(str(folder))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "shot_200" in line]
    assert len(errors) == 2, done.stderr
    assert any(str(folder / "shot_2001.jpg") in line for line in errors)
    assert any(str(folder / "shot_2002.jpg") in line for line in errors)
    assert temp_files(folder) == [".other.jpg.0badf00d.dwtmp"]
    (folder / ".other.jpg.0badf00d.dwtmp").unlink()
    assert_whole(folder, 6)


def test_path_map_sends_the_workers_their_own_view_of_the_storage(farm: Farm, frames: list[Path]) -> None:
    """The client sees /…/client-view/shots, the workers /…/worker-view/shots (two folders, same frames)."""
    client_view, worker_view = farm.root / "client-view", farm.root / "worker-view"
    for view in (client_view, worker_view):
        (view / "shots").mkdir(parents=True)
        for frame in frames[:8]:
            shutil.copy2(frame, view / "shots" / frame.name)
    farm.write_config(path_map={str(client_view): str(worker_view)})
    try:
        done = farm.once(str(client_view / "shots"))
    finally:
        farm.write_config()
    assert done.returncode == 0, done.stderr
    assert maps_in(client_view / "shots") == {}
    assert_whole(worker_view / "shots", 8)
    # A worker prefix that is not there on the workers: said as such, naming the worker's path
    # (not "its folder vanished before the frame could be read", of the client's path).
    nowhere = farm.root / "not-mounted"
    farm.write_config(path_map={str(client_view): str(nowhere)})
    try:
        lost = farm.once(str(client_view / "shots"), "--normalise", "frame")
    finally:
        farm.write_config()
    assert lost.returncode == 1, lost.stderr
    lines = [line for line in lost.stderr.splitlines() if "not found on this worker as" in line]
    assert len(lines) == 8 and all(f"{nowhere / 'shots'}/" in line and "check farm.path_map" in line for line in lines), lost.stderr


def test_frame_ranges_pick_numbered_frames_locally_and_on_the_farm(farm: Farm, frames: list[Path]) -> None:
    local, remote = farm.root / "range-local", farm.root / "range-farm"
    here = run_once(str(frames[0].parent), "--frames", "1001-1010x2", "-o", str(local), "-c", str(farm.config), cwd=farm.root)
    assert here.returncode == 0, here.stderr
    assert sorted(maps_in(local)) == [f"shot_{n}_depth.jpg" for n in (1001, 1003, 1005, 1007, 1009)]
    there = farm.once(str(frames[0].parent), "--frames", "1100-1102,1120", "-o", str(remote))
    assert there.returncode == 0, there.stderr
    assert sorted(maps_in(remote)) == [f"shot_{n}_depth.jpg" for n in (1100, 1101, 1102, 1120)]
    # 1010-1001 is a range too (counted down, as fileseq reads it); a zero step is not.
    bad = run_once(str(frames[0].parent), "--frames", "1001-1010x0", "-c", str(farm.config), cwd=farm.root)
    assert bad.returncode == 78 and "--frames" in bad.stderr and "not a frame range" in bad.stderr
    none = run_once(str(frames[0].parent), "--frames", "1-10", "-c", str(farm.config), cwd=farm.root)
    assert none.returncode == 78 and "no frames numbered 1-10" in none.stderr


def test_the_job_completes_when_a_worker_is_killed_in_the_middle(farm: Farm, frames: list[Path]) -> None:
    victim, survivor = farm.live()
    before = victim.counts().get("tasks", 0)
    out = farm.root / "killed-worker"
    client = start_once("--farm", farm.address, "-c", str(farm.config), str(frames[0].parent), "-o", str(out),
                        cwd=farm.root, log=farm.root / "killed-worker.log")
    try:
        # Killed in the first pass (the shot-stable plan needs every frame's): the results it
        # held are lost with it, and Dask computes them again on the survivor.
        wait_for(lambda: victim.counts().get("tasks", 0) >= before + 2, what="the victim to take a few tasks")
        assert client.poll() is None, "the job ended before the worker could be killed"
        victim.send(signal.SIGKILL)
        assert client.wait(120) == 0, (farm.root / "killed-worker.log").read_text()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    victim.close()
    assert_whole(out, FRAMES)
    assert survivor.proc.poll() is None
    farm.add_workers(1)  # two again, for the tests after this one


def test_an_interrupted_job_resumes_with_only_the_missing_maps(farm: Farm, frames: list[Path]) -> None:
    out = farm.root / "resumed"
    log = farm.root / "interrupted.log"
    client = start_once("--farm", farm.address, "-c", str(farm.config), str(frames[0].parent), "-o", str(out),
                        cwd=farm.root, log=log)
    wait_for(lambda: len(maps_in(out)) >= 20 if out.is_dir() else False, what="some maps")
    client.send_signal(signal.SIGINT)  # Ctrl-C: said, with what it leaves (not a silent exit 130)
    try:
        assert client.wait(60) == 130
    finally:
        client.kill()
        client.wait()
    assert log.read_text().strip().splitlines()[-1] == (
        "depthwatch: interrupted (Ctrl-C): the maps written so far stay; the same command again maps only the frames still missing"
    )
    # SIGTERM: each worker finishes the frames it holds and exits 0.
    for worker in farm.live():
        assert worker.stop(signal.SIGTERM) == 0, worker.log()
        assert "stopping: finishing the tasks in hand" in worker.log()
        status = worker.status()
        assert status["state"] == "stopped" and status["in_progress"] == 0  # every frame it took, finished
        assert status["counts"]["done"] == len(worker.frame_lines())
    assert temp_files(out) == []
    kept = {name: (p.stat().st_ino, p.stat().st_mtime_ns) for name, p in maps_in(out).items()}
    assert 20 <= len(kept) < FRAMES, f"{len(kept)} maps: the job was not interrupted"
    for path in maps_in(out).values():
        assert read_map(path) is not None

    fresh = farm.add_workers(2)
    done = farm.once(str(frames[0].parent), "-o", str(out))
    assert done.returncode == 0, done.stderr
    missing = FRAMES - len(kept)
    assert f"{FRAMES} frame(s): {len(kept)} up to date, {missing} to map" in done.stderr
    # The summary tells the maps written now from the ones already made (not both counted as written).
    assert f"{missing} depth map{'s' if missing != 1 else ''} written, {len(kept)} up to date, 0 failed" in done.stdout, done.stdout
    assert_whole(out, FRAMES)
    assert {name: (p.stat().st_ino, p.stat().st_mtime_ns) for name, p in maps_in(out).items() if name in kept} == kept
    computed = [wait_for(lambda w=w: w.status().get("counts"), what="counts") for w in fresh]
    assert sum(c["done"] for c in computed) == missing, (computed, [w.log() for w in fresh])
    assert sum(len(w.frame_lines()) for w in fresh) == missing

    # Run again under other settings: no map made under the old ones is "up to date" (a frame's version
    # alone does not make it so), and no map keeps the record of the old ones.
    from depthwatch.frames import provenance

    records = {name: provenance.read(p)["made_with"] for name, p in maps_in(out).items()}
    again = farm.once(str(frames[0].parent), "-o", str(out), "--gamma", "2.2")
    assert again.returncode == 0, again.stderr
    assert f"{FRAMES} frame(s): 0 up to date, {FRAMES} to map" in again.stderr
    assert f"{FRAMES} depth maps written, 0 failed" in again.stdout
    assert all(provenance.read(p)["made_with"] != records[name] for name, p in maps_in(out).items())


def test_error_sidecars_are_written_and_removed_on_the_farm(farm: Farm, frames: list[Path]) -> None:
    """`output.error_sidecar` holds on the farm too: a failed frame gets its record beside the output,
    and the record goes once the frame maps."""
    folder = farm.root / "records"
    folder.mkdir()
    shutil.copy(frames[0], folder / "a.jpg")
    (folder / "b.jpg").write_text("not a picture")
    config = yaml.safe_load(farm.config.read_text())
    config["output"] = {"error_sidecar": True}
    (farm.root / "records.yaml").write_text(yaml.safe_dump(config))
    done = farm.once(str(folder), "-c", str(farm.root / "records.yaml"))
    assert done.returncode == 1, done.stderr
    assert "not a JPEG" in json.loads((folder / "b.jpg.error.json").read_text())["error"]
    shutil.copy(frames[1], folder / "b.jpg")  # fixed
    assert farm.once(str(folder), "-c", str(farm.root / "records.yaml")).returncode == 0
    assert (folder / "b_depth.jpg").exists() and not (folder / "b.jpg.error.json").exists()


def test_stills_made_on_the_farm_are_up_to_date_the_next_time(farm: Farm, frames: list[Path]) -> None:
    """A still (in no numbered sequence) is mapped on its own (`normalise: frame`); its map's settings
    digest is that one's, and the next run finds it up to date rather than mapping it again."""
    stills = farm.root / "stills"
    stills.mkdir()
    for name, frame in zip(("a.jpg", "b.jpg", "c.jpg"), frames):
        shutil.copy(frame, stills / name)
    out = farm.root / "stills-maps"
    for expected in ("0 up to date, 3 to map", "3 up to date, 0 to map"):
        done = farm.once(str(stills), "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert f"3 frame(s): {expected}" in done.stderr


def test_a_frame_whose_answer_was_lost_with_the_scheduler_but_whose_map_is_on_disk_is_written(tmp_path: Path) -> None:
    """A task that fails as a whole (the scheduler gone, its connection cut) fails each frame, except
    those whose map a worker had written: on disk, of the frame's version, under these settings.
    Those count as written, so the summary never calls a frame failed whose map is there."""
    from depthwatch.farm.client import _outcomes
    from depthwatch.farm.tasks import FrameTask
    from depthwatch.frames import provenance
    from depthwatch.frames.job import Job

    class Lost:
        def result(self) -> None:
            raise RuntimeError("cancelled for reason: scheduler-connection-lost.")

    jobs = []
    for name in ("a", "b"):
        source = tmp_path / f"{name}.jpg"
        cv2.imwrite(str(source), np.full((8, 8, 3), 100, np.uint8))
        jobs.append(Job(source, tmp_path / f"{name}_depth.jpg"))
    record = provenance.record_for("a.jpg", os.stat(jobs[0].source), model="m.onnx", normalise="frame", invert=False, made_with="abc")
    jobs[0].output.write_bytes(provenance.embed(cv2.imencode(".jpg", np.zeros((8, 8), np.uint8))[1].tobytes(), record))
    batch = [FrameTask(i, str(job.source), str(job.output)) for i, job in enumerate(jobs)]
    written, lost = _outcomes(Lost(), batch, jobs, ["abc", "abc"])
    assert written.ok and not lost.ok and "the farm could not map it" in lost.error
    assert not _outcomes(Lost(), batch, jobs, ["other settings", "abc"])[0].ok  # made under other settings: not this run's


def test_the_daemon_and_local_once_never_import_dask(tmp_path: Path, tiny_model: Path) -> None:
    frame = make_frames(tmp_path / "f", count=1)[0]
    script = f"""
import importlib, pkgutil, sys
import depthwatch
for info in pkgutil.walk_packages(depthwatch.__path__, "depthwatch."):
    if not info.name.startswith("depthwatch.farm") and info.name != "depthwatch.__main__":
        importlib.import_module(info.name)
from depthwatch import cli
code = cli.main(["once", {str(frame)!r}, "--model", {str(tiny_model)!r}, "--profile", "midas-v21-small"])
assert code == 0, code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
print("loaded:", loaded)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout
    assert (frame.parent / "shot_1001_depth.jpg").is_file()


def test_an_unreachable_scheduler_or_a_missing_model_is_one_line(tmp_path: Path, tiny_model: Path) -> None:
    frame = make_frames(tmp_path / "f", count=1)[0]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nowhere = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    done = run_once("--farm", nowhere, str(frame), cwd=tmp_path)
    assert done.returncode == 69
    assert f"depthwatch: cannot reach the Dask scheduler at {nowhere}" in done.stderr and "Traceback" not in done.stderr
    assert not (frame.parent / "shot_1001_depth.jpg").exists()

    worker = subprocess.run(
        [sys.executable, "-m", "depthwatch", "worker", nowhere, "--model", str(tmp_path / "missing.onnx")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert worker.returncode == 78  # before it ever looks for the scheduler
    assert worker.stderr.strip().splitlines()[-1].startswith("depthwatch: model file") and "joining" not in worker.stderr


def test_a_model_named_for_a_farm_run_is_refused_since_the_workers_run_their_own(tmp_path: Path, tiny_model: Path) -> None:
    """`once --farm ... --model X` (or --profile) is refused: the workers map with the model each was
    started with, so X would silently not be used, and the run would still say its maps were written."""
    frame = make_frames(tmp_path / "f", count=1)[0]
    for extra in (("--model", str(tiny_model)), ("--profile", "midas-v21-small")):
        done = run_once("--farm", "tcp://127.0.0.1:9", str(frame), *extra, cwd=tmp_path)
        assert done.returncode == 78, done.stderr
        assert done.stderr.strip() == (
            f"depthwatch: {extra[0]} chooses the model for local once; a farm's workers run their own "
            "(depthwatch worker --model PATH): drop it, or start the workers with that model"
        )
        assert sorted(p.name for p in frame.parent.iterdir()) == [frame.name]


def test_a_frame_rewritten_between_the_two_passes_is_mapped_from_its_new_version(tmp_path: Path) -> None:
    """The farm's two passes read a frame twice too, on whichever workers: the second takes only
    the version the first ran the model on, and a frame rewritten in between is mapped from the
    version there now (its shot planned again), as local once and a fresh run map it.
    """
    from file_events import FileEvents, assert_read_once_before_the_rewrite_and_again_after, new_version, rewritten_between_the_passes
    from onnx_models import slow_model

    from depthwatch.frames.rules import map_is_current

    farm = Farm(tmp_path, model=slow_model(tmp_path / "slow.onnx", seconds=0.25, size=128, channels=64))
    try:
        farm.add_workers(1)
        paths = make_frames(tmp_path / "frames", 8)
        frame, out, log = paths[3], tmp_path / "maps", tmp_path / "once.log"
        new = new_version(frame)
        events = FileEvents(frame.parent)
        try:
            args = ("--farm", farm.address, "-c", str(farm.config), *map(str, paths), "-o", str(out))
            with rewritten_between_the_passes(frame, new, lambda: start_once(*args, cwd=tmp_path, log=log), events) as proc:
                assert proc.wait(300) == 0, log.read_text()
            assert_read_once_before_the_rewrite_and_again_after(events, frame.name)
        finally:
            events.close()
    finally:
        farm.close()
    ours = out / "shot_1004_depth.jpg"
    assert map_is_current(frame, ours)
    fresh = run_once(*map(str, paths), "-o", str(tmp_path / "fresh"), "-c", str(farm.config), cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    got, want = (read_map(p).astype(int) for p in (ours, tmp_path / "fresh" / ours.name))
    differs = np.abs(got - want).max()
    assert differs <= 2, f"the map is not the new version's: {differs} grey levels off a fresh run's in places"
    assert "1 frame(s) rewritten or gone between the two passes; planning their shots again" in log.read_text()
    assert "8 depth maps written, 0 failed" in log.read_text()


def test_a_frame_rewritten_again_while_its_shot_is_mapped_again_fails_with_no_map(tmp_path: Path) -> None:
    """The second time round on the farm, a frame that changes yet again between its passes
    fails with its line, and gets no map, as in local once."""
    from file_events import FileEvents, new_version, rewritten_between_the_passes
    from onnx_models import slow_model

    farm = Farm(tmp_path, model=slow_model(tmp_path / "slow.onnx", seconds=0.25, size=128, channels=64))
    try:
        farm.add_workers(1)
        paths = make_frames(tmp_path / "frames", 8)
        frame, out, log = paths[3], tmp_path / "maps", tmp_path / "once.log"
        new = new_version(frame)
        events = FileEvents(frame.parent)
        try:
            args = ("--farm", farm.address, "-c", str(farm.config), *map(str, paths), "-o", str(out))
            with rewritten_between_the_passes(frame, new, lambda: start_once(*args, cwd=tmp_path, log=log), events) as proc:
                # Read by its second pass (refused: not the first pass's version), then by the shot's first pass again.
                events.wait_for(lambda seen: seen.count(("read", frame.name)) >= 3, "the shot's first pass again")
                os.replace(new_version(paths[2]), frame)
                assert proc.wait(300) == 1, log.read_text()
            seen = events.take()
        finally:
            events.close()
    finally:
        farm.close()
    reads = [i for i, event in enumerate(seen) if event == ("read", frame.name)]
    moves = [i for i, event in enumerate(seen) if event == ("moved in", frame.name)]
    assert len(reads) == 4 and reads[0] < moves[0] < reads[1] and reads[2] < moves[1] < reads[3], seen
    said = log.read_text()
    assert f"depthwatch: {frame}: changed again while its shot was being mapped again; no map written" in said, said
    assert "7 depth maps written, 1 failed" in said, said
    assert sorted(p.name for p in out.iterdir()) == [f"shot_{n}_depth.jpg" for n in range(1001, 1009) if n != 1004]
