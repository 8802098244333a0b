"""`python -m benchmarks`: run the scenarios, print the table, write the JSON.

Everything runs on 127.0.0.1 inside one temporary folder, which is removed at
the end together with every process the run started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks import bookkeeping
from benchmarks import clips as clip_bench
from benchmarks import farm as farm_bench
from benchmarks import farmclips as farmclips_bench
from benchmarks import firststart
from benchmarks import frames as framesets
from benchmarks import predict, report, scenarios, stable, standin
from benchmarks import refine as refine_bench
from benchmarks.daemon import Knobs
from benchmarks.processes import BenchError
from depthwatch.errors import DepthwatchError

SCENARIOS = ("classic", "predict", "burst", "bookkeeping", "latency", "memory", "refine", "stable", "farm", "clips", "first-start")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    from depthwatch.config import DaemonConfig, ModelConfig

    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure depthwatch against the machine's limit and the classic Flask/gunicorn server.",
    )
    p.add_argument("--model", metavar="PATH", type=Path, help="an .onnx depth model (default: a generated MiDaS v2.1 small stand-in)")
    p.add_argument("--profile", default=None, help="depthwatch profile for --model (default: auto; the stand-in uses midas-v21-small)")
    p.add_argument("--providers", default="auto", help="execution providers as depthwatch takes them: auto or e.g. openvino,cpu")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16", "int8"), help="model.precision (default auto)")
    p.add_argument(
        "--frames", metavar="DIR", type=Path, help="a folder of .jpg frames (default: 1920x1080 frames from scikit-image photographs)"
    )
    p.add_argument("--count", type=int, default=60, help="frames per burst, per classic run and per ceiling run (default 60)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each scenario; medians are reported (default 3)")
    p.add_argument("--latency-count", type=int, default=30, help="frames dropped one at a time for the latency percentiles (default 30)")
    p.add_argument("--scrub-seconds", type=float, default=3.0, help="how long the scrub rewrites its frame at 60 fps (default 3)")
    p.add_argument(
        "--intra-op-threads",
        type=int,
        default=ModelConfig().intra_op_threads,
        help="model.intra_op_threads for every scenario (default: depthwatch's)",
    )
    p.add_argument("--workers", type=int, default=DaemonConfig().workers, help="daemon.workers (default: depthwatch's)")
    p.add_argument("--cv2-threads", type=int, default=0, help="OpenCV threads in the daemon and the classic servers (0: OpenCV's default)")
    p.add_argument("--poll-ms", type=float, default=1.0, help="how often this process looks for output files (default 1 ms)")
    p.add_argument("--skip", action="append", choices=SCENARIOS, default=[], help="leave a scenario out (repeatable)")
    p.add_argument("--sweep", action="store_true", help="instead of the scenarios: the burst ratio for a grid of thread settings")
    p.add_argument("--sweep-intra", type=_ints, default=None, help="intra_op_threads values for --sweep (default: 1 and the core count)")
    p.add_argument("--sweep-workers", type=_ints, default=[1, 2, 3], help="workers values for --sweep (default 1,2,3)")
    p.add_argument("--sweep-cv2", type=_ints, default=[0, 1], help="OpenCV thread counts for --sweep (default 0,1; 0 = OpenCV's default)")
    p.add_argument("--clip-frames", type=int, default=1500, help="frames of the long 1080p clip for the clip memory row (default 1500)")
    p.add_argument("--json", metavar="OUT", type=Path, help="write the results here as JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes for the smoke test: a small model, 320x180 frames, 1 repeat")
    return p


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> str:
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "?"


def _openvino_version() -> str | None:
    from depthwatch.model.sessions import openvino

    return openvino.version() if openvino.installed() else None


def machine(applied: Sequence[str]) -> dict[str, Any]:
    import cv2
    import onnxruntime

    from depthwatch.model import providers
    from depthwatch.model.choosing import hardware

    return {
        "cores": scenarios.cores(),
        "cpu": _cpu_name(),
        # The ISA features that change which engine and precision win (every figure here ran with them).
        "cpu_features": list(hardware.cpu_features()),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "opencv": cv2.__version__,
        "opencv_default_threads": cv2.getNumThreads(),
        "providers_available": providers.available(),
        "providers_applied": list(applied),
        # OpenVINO here runs on the CPU, on the same cores as the image work.
        "accelerated": any(p not in (providers.CPU, providers.OPENVINO) for p in applied),
        "openvino": _openvino_version(),
        "load_before": _load(),
    }


def _progress(message: str) -> None:
    print(f"benchmarks: {message}", file=sys.stderr, flush=True)


def _run(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    _progress(f"{name} ...")
    start = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:  # one broken scenario must not stop the others (or the cleanup)
        results["errors"][name] = f"{type(exc).__name__}: {exc}"
        _progress(f"{name} failed: {exc}")
        if not isinstance(exc, BenchError):
            traceback.print_exc(file=sys.stderr)
        return None
    _progress(f"{name} done in {time.perf_counter() - start:.1f} s")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.count, args.repeats, args.latency_count, args.scrub_seconds = 4, 1, 3, 0.5
    if args.count < 1 or args.repeats < 1 or args.latency_count < 1:
        raise SystemExit("benchmarks: --count, --repeats and --latency-count must be at least 1")
    # SIGTERM unwinds like Ctrl-C, so every child is stopped and the folder removed.
    signal.signal(signal.SIGTERM, _terminate)
    work = Path(tempfile.mkdtemp(prefix="depthwatch-bench-"))
    try:
        return _bench(args, work)
    except DepthwatchError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _bench(args: argparse.Namespace, work: Path) -> int:
    shape = standin.QUICK if args.quick else standin.DEFAULT
    if args.model:
        model, profile, gflops = args.model.resolve(), args.profile or "auto", None
        name = model.name
    else:
        model = standin.build(work / "midas-small-standin.onnx", shape)
        profile, gflops = args.profile or "midas-v21-small", standin.flops(shape) / 1e9
        name = "stand-in for MiDaS v2.1 small"
    _progress("making frames ...")
    if args.frames:
        frames = framesets.load(args.frames, args.count)
    else:
        frames = framesets.generate(max(args.count, scenarios.WARM_UP + 1), (320, 180) if args.quick else framesets.FULL_HD)
    knobs = Knobs(model, profile, args.providers, args.intra_op_threads, args.workers, args.cv2_threads, precision=args.precision)
    plan = scenarios.Plan(work, knobs, frames, args.count, args.repeats, args.latency_count, args.scrub_seconds, args.poll_ms / 1000)

    # What depthwatch picks with these knobs (engine and precision), and ONNX Runtime's CPU
    # provider at fp32: what the seed runs, and depthwatch's rows with the same engine as the seed.
    _, captured = scenarios.load_reference(plan)
    ort_knobs = dataclasses.replace(knobs, providers="cpu", precision="fp32")
    same_engine = scenarios.engine_name(captured) == "CPU fp32"
    ort = captured if same_engine else scenarios.load_reference(plan, knobs=ort_knobs)[1]
    results: dict[str, Any] = {
        "machine": machine(captured.info.providers),
        "engine": {
            "chosen": scenarios.engine_name(captured),
            "seed": scenarios.engine_name(ort),
            "chosen_by": captured.info.chosen_by,
            "refused": list(captured.info.refused),
            "trials": [dataclasses.asdict(t) for t in captured.info.trials],
        },
        "model": {
            "name": name,
            "path": str(args.model) if args.model else None,
            "gflops": gflops,
            "profile": captured.info.profile.name,
            "contract": captured.info.contract.describe(),
        },
        "frames": {
            "count": len(frames),
            "size": list(frames.size),
            "mean_bytes": frames.mean_bytes,
            "source": frames.source,
            "describe": frames.describe(),
        },
        "settings": {
            **dataclasses.asdict(knobs),
            "model": str(knobs.model),
            "repeats": args.repeats,
            "session": ort.settings,
            "chosen_session": captured.settings,
        },
        "plan": {
            "count": args.count,
            "latency_count": args.latency_count,
            "scrub_seconds": args.scrub_seconds,
            "poll_ms": args.poll_ms,
            "quick": args.quick,
        },
        "scenarios": {},
        "errors": {},
    }
    s = results["scenarios"]
    config, single = scenarios.load_reference(plan, intra_op_threads=1)
    chosen = scenarios.engine_name(captured)
    s["costs"] = _run(results, f"single-threaded costs ({chosen})", lambda: scenarios.costs(plan, config, single))
    if not results["machine"]["accelerated"]:
        s["side_by_side"] = _run(
            results,
            f"the limit's two loops side by side ({chosen})",
            lambda: scenarios.side_by_side(plan, config, single, seconds=0.3 if args.quick else 2.0),
        )
    # On CPU the ceiling also runs the one-thread session in turn: what the engine's threads cost.
    alone = None if results["machine"]["accelerated"] else single
    s["ceiling"] = _run(results, f"ceiling ({chosen})", lambda: scenarios.ceiling(plan, captured, alone))
    ort_config, ort_single = (config, single) if same_engine else scenarios.load_reference(plan, intra_op_threads=1, knobs=ort_knobs)
    if not same_engine:
        alone_ort = None if results["machine"]["accelerated"] else ort_single
        s["costs_ort"] = _run(results, "single-threaded costs (CPU fp32)", lambda: scenarios.costs(plan, ort_config, ort_single))
        s["ceiling_ort"] = _run(results, "ceiling (CPU fp32)", lambda: scenarios.ceiling(plan, ort, alone_ort))
    if not results["machine"]["accelerated"]:
        cores = results["machine"]["cores"]
        # One onnxruntime session run from several threads at once (an OpenVINO request takes one at a time).
        s["parallel_ceiling"] = _run(
            results, "ceiling, frames in parallel", lambda: scenarios.parallel_ceiling(plan, ort_single, cores)
        )
    del single, ort_single
    if args.sweep:
        results["sweep"] = _sweep(args, plan, results)
    else:
        if "classic" not in args.skip:
            s["classic_flask"] = _run(results, "the seed as written (Flask)", lambda: scenarios.classic(plan, "flask", ort))
            s["classic_gunicorn"] = _run(results, "the seed under gunicorn", lambda: scenarios.classic(plan, "gunicorn", ort))
            s["classic_full"] = _run(
                results, "the seed's loop doing depthwatch's job", lambda: scenarios.classic(plan, "flask", ort, full=True)
            )
        if "predict" not in args.skip:
            s["predict"] = _run(results, "depthwatch POST /predict", lambda: predict.predict(plan))
        if "memory" not in args.skip:
            s["bare"] = _run(results, f"bare session process ({chosen})", lambda: scenarios.bare(plan, captured))
            if not same_engine:
                s["bare_ort"] = _run(results, "bare session process (CPU fp32)", lambda: scenarios.bare(plan, ort))
        if "burst" not in args.skip:
            s["burst"] = _run(results, f"depthwatch burst ({chosen})", lambda: scenarios.burst(plan))
            if not same_engine:
                s["burst_ort"] = _run(
                    results, "depthwatch burst (CPU fp32)", lambda: scenarios.burst(plan, ort_knobs, name="burst-ort")
                )
        if "bookkeeping" not in args.skip:
            s["bookkeeping"] = _run(results, "the daemon's bookkeeping per frame (notes, heartbeat)", lambda: bookkeeping.cost(work))
        if "latency" not in args.skip:
            one_at_a_time = _run(results, "depthwatch latency and scrub", lambda: scenarios.latency_and_scrub(plan))
            if one_at_a_time:
                s["latency"], s["scrub"], s["daemon"] = one_at_a_time
        if "refine" not in args.skip:
            s["refine_none"] = _run(results, "burst and latency with refine: none", lambda: refine_bench.compare(plan))
            s["refine_micro"] = _run(
                results,
                "refine micro-benchmark (one core)",
                lambda: refine_bench.micro(repeats=3 if args.quick else 30),
            )
        if "stable" not in args.skip:
            s["normalise"] = _run(results, "output.normalise frame vs stable", lambda: stable.compare(plan))
        if "farm" not in args.skip and farm_bench.available():
            s["farm"] = _run(results, "render farm", lambda: farm_bench.farm(plan))
        elif "farm" not in args.skip:
            _progress("render farm skipped: it needs the farm extra (pip install -e '.[farm]')")
        if "first-start" not in args.skip:
            s["first_start"] = _run(results, "first start of a model never measured here", lambda: firststart.first_start(plan))
        if "clips" not in args.skip and clip_bench.available():
            s["clip_throughput"] = _run(results, "once CLIP vs once over stills", lambda: clip_bench.throughput(plan))
            long_clip = (120, (320, 180)) if args.quick else (args.clip_frames, framesets.FULL_HD)
            s["clip_memory"] = _run(results, "daemon RSS over a long clip", lambda: clip_bench.memory(plan, *long_clip))
            if "farm" not in args.skip and farmclips_bench.available():
                farm_clip = (48, (160, 90)) if args.quick else long_clip
                s["farm_clips"] = _run(results, "a long clip on the farm vs once CLIP", lambda: farmclips_bench.compare(plan, *farm_clip))
        elif "clips" not in args.skip:
            _progress("clips skipped: they need the video extra (pip install -e '.[video]')")
    del captured, ort
    results["scenarios"] = {k: v for k, v in s.items() if v is not None}
    results["machine"]["load_after"] = _load()
    results["derived"] = report.derive(results)
    results["targets"] = report.targets(results)
    print(report.sweep_table(results) if args.sweep else report.table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 1 if results["errors"] else 0


def _sweep(args: argparse.Namespace, plan: scenarios.Plan, results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    cores = results["machine"]["cores"]
    for intra in args.sweep_intra or sorted({1, cores}):
        _, captured = scenarios.load_reference(plan, intra_op_threads=intra)
        ceiling = _run(results, f"ceiling intra_op {intra}", lambda: scenarios.ceiling(plan, captured))
        del captured
        for workers in args.sweep_workers:
            for cv2_threads in args.sweep_cv2:
                knobs = dataclasses.replace(plan.knobs, intra_op_threads=intra, workers=workers, cv2_threads=cv2_threads)
                label = f"burst intra_op {intra} workers {workers} cv2 {cv2_threads or 'default'}"
                burst = _run(results, label, lambda: scenarios.burst(plan, knobs, name="sweep"))
                burst = burst or {}
                rows.append(
                    {
                        "intra_op_threads": intra,
                        "workers": workers,
                        "cv2_threads": cv2_threads,
                        "ceiling_fps": ceiling["fps"] if ceiling else None,
                        "fps": burst.get("fps"),
                        "runs_fps": burst.get("runs_fps"),
                        "cpu_ms_per_frame": burst.get("cpu_ms_per_frame"),
                        "cores_busy": burst.get("cores_busy"),
                        "error": results["errors"].get(label),
                    }
                )
    return rows
