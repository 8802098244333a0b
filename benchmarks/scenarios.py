"""The scenarios, each against the same model, frames and thread settings.

Each function measures one thing and returns plain numbers (JSON-ready);
ratios between scenarios are computed in `report`. Times are
`time.perf_counter()` seconds in this process; CPU costs are
`time.process_time()`; "visible" means this process saw the output file
appear or change, polling every `poll_s` (1 ms by default).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from benchmarks import sessions
from benchmarks.daemon import (
    Daemon,
    Knobs,
    config_dict,
    drop,
    signature,
    stage,
    wall_of,
    write_config,
)
from benchmarks.frames import FrameSet
from benchmarks.processes import BenchError, Child, free_port, python

#: Frames run before timing starts, in every scenario.
WARM_UP = 2
SCRUB_FPS = 60


@dataclass(frozen=True)
class Plan:
    """What every scenario shares."""

    work: Path
    knobs: Knobs
    frames: FrameSet
    count: int
    repeats: int
    latency_count: int
    scrub_seconds: float
    poll_s: float = 0.001


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _folder(plan: Plan, name: str) -> Path:
    folder = plan.work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


# -- the model as depthwatch loads it ---------------------------------------------------


def load_reference(
    plan: Plan, intra_op_threads: int | None = None, knobs: Knobs | None = None
) -> tuple[Any, sessions.Captured]:
    """depthwatch's Config for these knobs (the plan's by default) and the session its Engine makes from it."""
    from depthwatch import config as configuration
    from depthwatch.model import catalogue

    knobs = knobs or plan.knobs
    if intra_op_threads is not None:
        knobs = dataclasses.replace(knobs, intra_op_threads=intra_op_threads)
    folder = plan.work / "reference"
    folder.mkdir(exist_ok=True)
    path = write_config(
        plan.work / f"reference-{knobs.providers.replace(',', '-')}-{knobs.precision}-{knobs.intra_op_threads}.yaml",
        config_dict(knobs, folder, ["*.jpg"], "{stem}_depth.jpg", plan.work / "reference.status.json"),
    )
    config = configuration.load(path)
    return config, sessions.capture(catalogue.resolve(config.model, config.base))


def _write_frames(plan: Plan, name: str, limit: int) -> list[Path]:
    folder = _folder(plan, name)
    paths = []
    for i, data in enumerate(plan.frames.data[:limit]):
        path = folder / f"f{i:04d}.jpg"
        path.write_bytes(data)
        paths.append(path)
    return paths


# -- 0. the machine's limit: single-threaded CPU cost of inference and of the image work --


def costs(plan: Plan, config: Any, single: sessions.Captured) -> dict[str, Any]:
    """CPU seconds per frame of inference (one intra-op thread) and of the daemon's image work.

    `single` is the model loaded by depthwatch with one intra-op thread, from
    `config`. The image work is depthwatch's own, stage by stage as the
    daemon's log line names them: read the file, decode (at reduced scale),
    prepare the tensor, then the render chain (normalise, render at the
    frame's size, encode) and the atomic write, with OpenCV on one thread.
    """
    from depthwatch.frames.frameline import STAGES

    work = _ImageWork(config, single)
    paths = _write_frames(plan, "costs", max(plan.count, WARM_UP + 1))
    samples = min(max(plan.count, 3), 40)
    order = [paths[i % len(paths)] for i in range(WARM_UP + samples)]
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    wall: list[float] = []
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        for n, path in enumerate(order):
            cpu: dict[str, float] = {}
            clock = [time.process_time()]

            def lap(stage: str) -> None:  # CPU ms per stage, as the daemon's laps take wall ms
                now = time.process_time()
                cpu[stage] = cpu.get(stage, 0.0) + (now - clock[0]) * 1000
                clock[0] = now

            w0 = time.perf_counter()
            decoded, prepared = work.front(path, lap)
            w2 = time.perf_counter()
            output = work.infer(prepared)
            lap("infer")
            w3 = time.perf_counter()
            work.back(path, decoded, output, lap)
            w5 = time.perf_counter()
            if n < WARM_UP:
                continue
            for key in stages:
                stages[key].append(cpu.get(key, 0.0))
            wall.append(((w2 - w0) + (w5 - w3)) * 1000)
    finally:
        cv2.setNumThreads(threads)
    per_stage = {k: median(v) for k, v in stages.items()}
    image_ms = median([sum(stages[k][i] for k in stages if k != "infer") for i in range(samples)])
    return {
        "samples": samples,
        "infer_cpu_ms": per_stage["infer"],
        "image_cpu_ms": image_ms,
        "image_wall_ms": median(wall),
        "stage_cpu_ms": per_stage,
        "decode_scale": f"1/{_reduction(decoded.image.shape, decoded.size)}",
    }


class _ImageWork:
    """One frame's work as the daemon does it, in the order its stages run, outside any daemon."""

    def __init__(self, config: Any, single: sessions.Captured) -> None:
        from depthwatch.frames.settings import Settings

        self.settings = Settings.from_config(config)
        self.single = single
        self.info = single.info

    def front(self, path: Path, lap: Callable[[str], None]) -> tuple[Any, np.ndarray]:
        """read, decode, prepare."""
        from depthwatch.frames.reading import read_source
        from depthwatch.imaging import codec, tensor

        data, _ = read_source(path)
        lap("read")
        decoded = codec.decode(data, max_pixels=self.settings.max_pixels, min_size=self.info.min_frame_size)
        lap("decode")
        prepared = tensor.prepare(decoded, self.info.contract, self.info.profile)
        lap("prepare")
        return decoded, prepared

    def infer(self, prepared: np.ndarray) -> np.ndarray:
        contract = self.info.contract
        return self.single.session.run([contract.output_name], {contract.input_name: prepared})[0]

    def back(self, path: Path, decoded: Any, output: np.ndarray, lap: Callable[[str], None]) -> None:
        """normalise, render, encode, then the atomic write of the map."""
        from depthwatch.frames.writer import atomic_write
        from depthwatch.imaging import render
        from depthwatch.model.contract import depth_map

        made = render.depth_map(
            depth_map(output),
            self.info.profile.predicts,
            decoded,
            ext=".jpg",
            options=self.settings.render,
            encoding=self.settings.encoding,
            lap=lap,
        )
        atomic_write(path.with_name(path.stem + "_depth.jpg"), made.data)
        lap("write")


def side_by_side(plan: Plan, config: Any, single: sessions.Captured, seconds: float = 2.0) -> dict[str, Any]:
    """Do two busy cores slow each other down? The two single-threaded loops the limit adds up, alone and at once.

    The machine's limit assumes a core does as much beside a busy neighbour as
    it does alone. Here the inference loop (one operator thread) and the image
    work loop (OpenCV on one thread; the frames are in the page cache) run for
    `seconds` each alone, then both together on two threads of this process;
    each reports its median per frame (the inference loop in wall time, as its
    work may run on the engine's own thread; the image work in its thread's
    CPU time). Beside against alone near 1.00 says the cores and caches are
    not what the daemon loses against the limit.
    """
    import threading

    if cores() < 2:
        return {"skipped": "one core"}
    work = _ImageWork(config, single)
    paths = _write_frames(plan, "side", max(1, min(plan.count, 16)))
    outputs = [work.front(p, _no_lap) for p in paths]
    prediction = work.infer(outputs[0][1])

    # Each loop runs until told to stop and has timed a frame beyond the warm-up,
    # so a starved thread on a loaded machine still reports.
    def inference(stop: threading.Event, samples: list[float]) -> None:
        i = 0
        while not stop.is_set() or len(samples) <= WARM_UP:
            t0 = time.perf_counter()
            work.infer(outputs[i % len(outputs)][1])
            samples.append((time.perf_counter() - t0) * 1000)
            i += 1

    def image(stop: threading.Event, samples: list[float]) -> None:
        i = 0
        while not stop.is_set() or len(samples) <= WARM_UP:
            t0 = time.thread_time()
            path = paths[i % len(paths)]
            decoded, _ = work.front(path, _no_lap)
            work.back(path, decoded, prediction, _no_lap)
            samples.append((time.thread_time() - t0) * 1000)
            i += 1

    def run(*loops: Any) -> list[float]:
        stop = threading.Event()
        samples: list[list[float]] = [[] for _ in loops]
        threads = [
            threading.Thread(target=loop, args=(stop, out), name=f"bench-side-{k}")
            for k, (loop, out) in enumerate(zip(loops, samples, strict=True))
        ]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        return [median(s[WARM_UP:]) for s in samples]

    cv_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)  # as in `costs`: the limit's image work is timed on one thread
    try:
        (infer_alone,) = run(inference)
        (image_alone,) = run(image)
        infer_beside, image_beside = run(inference, image)
    finally:
        cv2.setNumThreads(cv_threads)
    return {
        "seconds": seconds,
        "infer_ms_alone": infer_alone,
        "infer_ms_beside": infer_beside,
        "image_cpu_ms_alone": image_alone,
        "image_cpu_ms_beside": image_beside,
    }


def _no_lap(stage: str) -> None:
    """Stage timings are not wanted here."""


def _reduction(shape: tuple[int, ...], size: tuple[int, int]) -> int:
    return max(1, round(size[0] / shape[1]))


# -- 1. ceiling: bare session.run on pre-decoded, pre-resized inputs ------------------------


def ceiling(plan: Plan, captured: sessions.Captured, single: sessions.Captured | None = None) -> dict[str, Any]:
    """The bare run loop: frames a second; with `single`, what the engine's threads cost in CPU.

    `single`: the same model and engine with one intra-op thread. Each repeat
    runs the loop on the engine's own threads, then on one, and takes the
    process's CPU a run for both (nothing else of this process runs then):
    `threads_cpu_ratio` is the median of the repeats' ratios, measured in
    turn so that a busy moment moves both sides. The limit counts a run's CPU
    on one thread; `report.one_run_fps` says what the ratio leaves.
    """
    sides = [captured] if single is None else [captured, single]
    tensors = _tensors(plan, captured)
    contract = captured.info.contract
    feed_name, names = contract.input_name, [contract.output_name]
    for side in sides:
        for t in tensors[:WARM_UP]:
            side.session.run(names, {feed_name: t})
    runs: list[float] = []
    cpu: list[list[float]] = [[] for _ in sides]
    for _ in range(plan.repeats):
        for k, side in enumerate(sides):
            start, cpu_start = time.perf_counter(), time.process_time()
            for i in range(plan.count):
                side.session.run(names, {feed_name: tensors[i % len(tensors)]})
            if k == 0:
                runs.append(plan.count / (time.perf_counter() - start))
            cpu[k].append((time.process_time() - cpu_start) * 1000 / plan.count)
    fps = median(runs)
    result = {"fps": fps, "ms_per_frame": 1000 / fps, "runs_fps": runs, "frames": plan.count, "cpu_ms_per_frame": median(cpu[0])}
    if single is not None:
        result["single_cpu_ms_per_frame"] = median(cpu[1])
        result["threads_cpu_ratio"] = median([a / b for a, b in zip(cpu[0], cpu[1])])
    return result


def parallel_ceiling(plan: Plan, single: sessions.Captured, threads: int) -> dict[str, Any]:
    """`threads` frames in flight on one session, each run on its own thread with one intra-op thread.

    Not a depthwatch scenario: it shows what frame-level parallelism would
    reach where onnxruntime's intra-op threads scale poorly.
    """
    import threading

    tensors = _tensors(plan, single)
    session, feed_name, names = single.session, single.info.contract.input_name, [single.info.contract.output_name]
    runs = []
    for _ in range(plan.repeats):
        counter = iter(range(plan.count))
        lock = threading.Lock()

        def loop() -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                session.run(names, {feed_name: tensors[i % len(tensors)]})

        workers = [threading.Thread(target=loop, name=f"bench-run-{k}") for k in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        runs.append(plan.count / (time.perf_counter() - start))
    fps = median(runs)
    return {"fps": fps, "ms_per_frame": 1000 / fps, "runs_fps": runs, "threads": threads}


def _tensors(plan: Plan, captured: sessions.Captured) -> list[np.ndarray]:
    from depthwatch.imaging import codec, tensor

    info = captured.info
    return [
        tensor.prepare(codec.decode(d, max_pixels=10**9, min_size=info.min_frame_size), info.contract, info.profile)
        for d in plan.frames.data[: max(1, min(plan.count, 16))]
    ]


# -- 2. the classic Flask /predict server ----------------------------------------------------


def _post(port: int, path: str, timeout: float = 120.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST" if path == "/predict" else "GET", path, body=b"" if path == "/predict" else None)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _wait_http(child: Child, port: int, timeout: float = 120.0) -> float:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        child.check_alive()
        try:
            if _post(port, "/health", timeout=2.0)[0] == 200:
                return time.perf_counter() - child.started
        except OSError:
            pass
        time.sleep(0.01)
    raise BenchError(f"{child.name} did not answer within {timeout:.0f} s: {child.tail()}")


def prep_for(captured: sessions.Captured, frame_size: tuple[int, int]) -> dict[str, Any]:
    """What the classic server needs to feed the model, from depthwatch's contract and profile."""
    from depthwatch.model.contract import model_input_size

    info = captured.info
    w, h = model_input_size(info.contract, info.profile, frame_size)
    return {
        "width": w,
        "height": h,
        "layout": info.contract.layout,
        "dtype": np.dtype(info.contract.input_dtype).name,
        "mean": list(info.profile.mean),
        "std": list(info.profile.std),
        "output": info.profile.predicts,
    }


def classic(plan: Plan, server: str, captured: sessions.Captured, full: bool = False) -> dict[str, Any]:
    """Write frame.jpg, POST /predict, the server reads, runs, writes depth.jpg, answers.

    `captured`: the ONNX Runtime CPU session the seed runs (fp32, depthwatch's
    thread settings). `full`: the seed's loop doing depthwatch's job (the map
    at the frame's size, written atomically).
    """
    name = f"classic-{server}{'-full' if full else ''}"
    folder = _folder(plan, name)
    port = free_port()
    env = {
        "BENCH_MODEL": str(plan.knobs.model),
        "BENCH_SESSION": json.dumps(captured.settings),
        "BENCH_PREP": json.dumps(prep_for(captured, plan.frames.size)),
        "BENCH_FOLDER": str(folder),
        "BENCH_FULL": "1" if full else "0",
        **plan.knobs.env(),
    }
    if server == "flask":
        argv = [python(), "-m", "benchmarks.classic_server", "--port", str(port)]
    else:
        argv = [python(), "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", "--timeout", "300"]
        argv += ["--graceful-timeout", "5", "--log-level", "warning", "--worker-tmp-dir", str(plan.work)]
        argv += _gunicorn_extra()
        argv += ["benchmarks.classic_server:create_app()"]
    child = Child(f"classic server ({name})", argv, plan.work / f"{name}.log", env)
    try:
        startup = _wait_http(child, port)
        frame, depth = folder / "frame.jpg", folder / "depth.jpg"
        requests = produced = 0
        runs, latencies = [], []

        def one(data: bytes) -> bool:
            before = signature(depth)
            t = time.perf_counter()
            with open(frame, "wb") as f:
                f.write(data)
            status, _ = _post(port, "/predict")
            latencies.append((time.perf_counter() - t) * 1000)
            return status == 200 and signature(depth) not in (None, before)

        for i in range(WARM_UP):
            one(plan.frames.data[i % len(plan.frames)])
        latencies.clear()
        for _ in range(plan.repeats):
            start = time.perf_counter()
            done = 0
            for i in range(plan.count):
                done += one(plan.frames.data[i % len(plan.frames)])
            runs.append(plan.count / (time.perf_counter() - start))
            requests += plan.count
            produced += done
        out = cv2.imread(str(depth), cv2.IMREAD_UNCHANGED)
        return {
            "fps": median(runs),
            "runs_fps": runs,
            "p50_ms": median(latencies),
            "p95_ms": percentile(latencies, 95),
            "requests": requests,
            "outputs": produced,
            "output_size": [int(out.shape[1]), int(out.shape[0])] if out is not None else None,
            "startup_s": startup,
            "full_size": full,
            "engine": "onnxruntime CPU fp32",
        }
    finally:
        child.stop()


def _gunicorn_extra() -> list[str]:
    """Flags newer gunicorns need to stay inside the benchmark's folder."""
    try:
        from gunicorn.config import KNOWN_SETTINGS
    except ImportError:
        return []
    names = {s.name for s in KNOWN_SETTINGS}
    return ["--no-control-socket"] if "control_socket_disable" in names else []


# -- 3. depthwatch burst: N frames dropped at once ----------------------------------------------


def burst(plan: Plan, knobs: Knobs | None = None, name: str = "burst") -> dict[str, Any]:
    """Rename N staged frames into the watched folder at once; time until every map exists."""
    knobs = knobs or plan.knobs
    runs, startups, peaks, loads, produced, failed = [], [], [], [], 0, 0
    cpu_per_frame: list[float] = []
    by_thread: list[dict[str, float]] = []
    busy: list[float] = []
    timings: list[dict[str, float]] = []
    for r in range(plan.repeats):
        daemon = Daemon(plan.work, f"{name}{r}", knobs, ["*.jpg"], "{stem}_depth.jpg")
        try:
            startups.append(daemon.start())
            folder = daemon.folder
            warm_start = time.time()
            for i in range(WARM_UP):
                drop(folder, f"warm{i}.jpg", plan.frames.data[i % len(plan.frames)])
            _wait_files([folder / f"warm{i}_depth.jpg" for i in range(WARM_UP)], daemon, plan.poll_s, 120)
            daemon.wait_idle(warm_start)
            names = [f"b{r}_{i:04d}.jpg" for i in range(plan.count)]
            staged = [stage(folder, n, plan.frames.data[i % len(plan.frames)]) for i, n in enumerate(names)]
            outputs = [folder / f"{Path(n).stem}_depth.jpg" for n in names]
            assert daemon.child is not None
            cpu, threads = daemon.child.cpu_seconds(), daemon.child.thread_cpu_seconds()
            start = time.perf_counter()
            for tmp, n in zip(staged, names):
                os.rename(tmp, folder / n)
            elapsed = _wait_files(outputs, daemon, max(plan.poll_s, 0.002), 60 + 5 * plan.count) - start
            cpu = daemon.child.cpu_seconds() - cpu
            after = daemon.child.thread_cpu_seconds()
            by_thread.append({k: (v - threads.get(k, 0.0)) * 1000 / plan.count for k, v in after.items()})
            runs.append(plan.count / elapsed)
            cpu_per_frame.append(cpu * 1000 / plan.count)
            busy.append(cpu / (elapsed * cores()))
            status = daemon.wait_idle(wall_of(start))
            timings += _logged(daemon, WARM_UP + plan.count)[WARM_UP:]
            produced += sum(o.exists() for o in outputs)
            failed += status["counts"]["failed"]
            loads.append(status["model_loads"])
            peaks.append(daemon.peak_rss())
        finally:
            daemon.stop()
            shutil.rmtree(daemon.folder, ignore_errors=True)
    return {
        "fps": median(runs),
        "runs_fps": runs,
        # The daemon's own CPU time (all threads) per frame during the burst, and the
        # share of the machine's cores it kept busy: fps = busy x cores / cpu per frame.
        "cpu_ms_per_frame": median(cpu_per_frame),
        # ... split by thread role (Linux): the model (dw-inference with the engine's own
        # threads), the image work (dw-worker with OpenCV's), the watcher, the rest.
        "cpu_ms_per_frame_by_thread": {
            k: median([run.get(k, 0.0) for run in by_thread]) for k in sorted({k for run in by_thread for k in run})
        },
        "cores_busy": median(busy),
        # The daemon's own per-stage medians (ms of wall time) during the bursts, from its log.
        "daemon_stage_ms": _stage_medians(timings),
        "frames": plan.count * plan.repeats,
        "outputs": produced,
        "failed": failed,
        "model_loads": max(loads) if loads else None,
        "startup_s": startups,
        "peak_rss_bytes": max(peaks) if peaks else None,
    }


def _wait_files(paths: list[Path], daemon: Daemon, poll_s: float, timeout: float) -> float:
    """Poll until every path exists (mostly in order, so one stat per poll); the time it did."""
    assert daemon.child is not None
    deadline = time.perf_counter() + timeout
    i, polls = 0, 0
    while True:
        while i < len(paths) and paths[i].exists():
            i += 1
        if i == len(paths):
            return time.perf_counter()
        polls += 1
        if polls % 200 == 0:
            daemon.child.check_alive()
            if time.perf_counter() > deadline:
                raise BenchError(f"{len(paths) - i} depth map(s) missing after {timeout:.0f} s: {daemon.child.tail()}")
        time.sleep(poll_s)


# -- 4 and 5. depthwatch latency, one frame at a time, and the scrub ----------------------------


def _logged(daemon: Daemon, count: int) -> list[dict[str, float]]:
    """The daemon's per-frame log lines, once `count` are there (they follow the maps by a moment)."""
    deadline = time.perf_counter() + 5
    timings = daemon.frame_timings()
    while len(timings) < count and time.perf_counter() < deadline:
        time.sleep(0.01)
        timings = daemon.frame_timings()
    return timings


def _stage_medians(timings: list[dict[str, float]]) -> dict[str, float]:
    return {k: median([t[k] for t in timings]) for k in timings[0]} if timings else {}


def _until_changed(path: Path, before: tuple[int, int] | None, daemon: Daemon, poll_s: float, timeout: float) -> float:
    assert daemon.child is not None
    deadline = time.perf_counter() + timeout
    polls = 0
    while True:
        if signature(path) != before:
            return time.perf_counter()
        polls += 1
        if polls % 500 == 0:
            daemon.child.check_alive()
            if time.perf_counter() > deadline:
                raise BenchError(f"{path.name} did not change within {timeout:.0f} s: {daemon.child.tail()}")
        time.sleep(poll_s)


def latency_and_scrub(plan: Plan, name: str = "single") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One daemon watching frame.jpg -> depth.jpg: latency samples, then the scrub repeats."""
    daemon = Daemon(plan.work, name, plan.knobs, ["frame.jpg"], "depth.jpg")
    try:
        startup = daemon.start()
        latency, idle = one_at_a_time(plan, daemon)
        scrub = _scrub(plan, daemon, idle)
        status = daemon.status() or {}
        process = {
            "startup_s": [startup],
            "peak_rss_bytes": daemon.peak_rss(),
            "model_loads": status.get("model_loads"),
        }
    finally:
        rc = daemon.stop()
        shutil.rmtree(daemon.folder, ignore_errors=True)
    process["exit_code"] = rc
    return latency, scrub, process


def one_at_a_time(plan: Plan, daemon: Daemon) -> tuple[dict[str, Any], dict[str, Any]]:
    """Drop frames one at a time; the results and the daemon's idle status after them."""
    folder, depth = daemon.folder, daemon.folder / "depth.jpg"
    samples: list[float] = []
    total = WARM_UP + plan.latency_count
    t0 = time.perf_counter()
    for i in range(total):
        before = signature(depth)
        t0 = drop(folder, "frame.jpg", plan.frames.data[i % len(plan.frames)])
        t1 = _until_changed(depth, before, daemon, plan.poll_s, 120)
        if i >= WARM_UP:
            samples.append((t1 - t0) * 1000)
        time.sleep(0.03)  # let the daemon go idle: each sample is one frame alone
    status = daemon.wait_idle(wall_of(t0))
    timings = _logged(daemon, total)[WARM_UP:total]
    stages = {}
    if len(timings) == plan.latency_count:
        stages = _stage_medians(timings)
        # From the rename to the job being queued, plus this process noticing the file.
        stages["watch_and_poll"] = median([s - t["total"] for s, t in zip(samples, timings)])
    return {
        "p50_ms": median(samples),
        "p95_ms": percentile(samples, 95),
        "samples_ms": samples,
        "frames": plan.latency_count,
        "outputs": len(samples),
        "failed": status["counts"]["failed"],
        "daemon_stage_ms": stages,
    }, status


def _scrub(plan: Plan, daemon: Daemon, idle: dict[str, Any]) -> dict[str, Any]:
    """Rewrite frame.jpg at 60 fps; count inferences, time the last map after the last write."""
    folder, depth = daemon.folder, daemon.folder / "depth.jpg"
    writes = max(2, round(SCRUB_FPS * plan.scrub_seconds))
    tails, inferences, superseded = [], [], []
    before = idle
    for _ in range(plan.repeats):
        start = time.perf_counter()
        for k in range(writes):
            delay = start + k / SCRUB_FPS - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            last = drop(folder, "frame.jpg", plan.frames.data[k % len(plan.frames)])
        last_wall = time.time()
        tail, after = _settle(daemon, depth, last, last_wall, plan.poll_s)
        tails.append(tail)
        counts, was = after["counts"], before["counts"]
        inferences.append(counts["done"] + counts["failed"] - was["done"] - was["failed"])
        superseded.append(counts["superseded"] - was["superseded"])
        before = after
    return {
        "writes": writes,
        "seconds": plan.scrub_seconds,
        "inferences": median(inferences),
        "runs_inferences": inferences,
        "superseded": median(superseded),
        "last_map_ms": median(tails),
        "runs_last_map_ms": tails,
    }


def _settle(daemon: Daemon, depth: Path, last: float, last_wall: float, poll_s: float) -> tuple[float, dict[str, Any]]:
    """Watch depth.jpg after the last write until the daemon is idle and the file stays put.

    The latest-wins queue runs the last write's job after any in flight, so
    the last change to depth.jpg is the last frame's map.
    """
    assert daemon.child is not None
    quiet = 0.5
    current, changed = signature(depth), None
    deadline = time.perf_counter() + 120
    next_status = 0.0
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        sig = signature(depth)
        if sig != current:
            current, changed = sig, now
        if changed is not None and now - changed >= quiet and now >= next_status:
            next_status = now + 0.02
            status = daemon.status()
            if (
                status
                and status.get("updated", 0) >= last_wall
                and status.get("queue_depth") == 0
                and status.get("in_progress") == 0
            ):
                return (changed - last) * 1000, status
            daemon.child.check_alive()
        time.sleep(poll_s)
    raise BenchError(f"the scrub's last depth map did not settle within 120 s: {daemon.child.tail()}")


# -- 6. memory and start-up: a bare process holding one session ---------------------------------


def bare(plan: Plan, captured: sessions.Captured) -> dict[str, Any]:
    """A process holding one session of `captured`'s engine (onnxruntime's or OpenVINO's), nothing else."""
    peaks, startups = [], []
    for r in range(plan.repeats):
        log = plan.work / f"bare{r}.log"
        child = Child("bare session", [python(), "-m", "benchmarks.bare", str(captured.info.file), json.dumps(captured.settings)], log)
        try:
            deadline = time.perf_counter() + 120
            line = None
            while line is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                line = next((x for x in text.splitlines() if x.startswith("{")), None)
                if line is None:
                    if not child.alive() or time.perf_counter() > deadline:
                        raise BenchError(f"the bare session process did not report: {child.tail()}")
                    time.sleep(0.002)
            startups.append(time.perf_counter() - child.started)
            peaks.append(max(json.loads(line)["peak_rss_bytes"], child.peak_rss()))
            child.proc.wait(30)
        finally:
            child.stop()
    return {"peak_rss_bytes": max(peaks), "startup_s": startups, "engine": engine_name(captured)}


def engine_name(captured: sessions.Captured) -> str:
    """E.g. "OpenVINO bf16" or "CPU fp32": the engine and precision a figure was taken with."""
    return f"{captured.info.providers[0].replace('ExecutionProvider', '')} {captured.info.precision}"
