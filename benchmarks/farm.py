"""The render farm against local `once`, on the same frames: what scaling out costs per frame.

A real `dask scheduler` and one, then two, long-lived `depthwatch worker`
processes on 127.0.0.1, and `depthwatch once --farm` sending them the frames,
against plain `depthwatch once` on the same frames. Each command is timed
whole, as a user runs it, and so is its fixed cost: local `once` on one frame
(start, model load, one frame), `once --farm` with every map up to date (start,
importing Dask, connecting, the scan). Frames per second are the frames over
the time beyond that fixed cost, and the farm's overhead per frame (scheduling,
the task round trip, the client's handling of results) is

  1000 / (farm, one worker, frames/s) - 1000 / (local, frames/s)

On one machine both workers share its cores, so two do not make it faster here;
on a farm each worker has a machine of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.daemon import Knobs, config_dict, write_config
from benchmarks.processes import ROOT, BenchError, Child, child_env, free_port, python


def _timed(argv: list[str], knobs: Knobs, timeout: float) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=child_env(knobs.env()), capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[2:4])} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return elapsed


def _wait_running(status: Path, child: Child, timeout: float = 120.0) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            if json.loads(status.read_text()).get("state") == "running":
                return
        except (OSError, ValueError):
            pass
        child.check_alive()
        time.sleep(0.02)
    raise BenchError(f"{child.name} did not join the farm within {timeout:.0f} s: {child.tail()}")


def available() -> bool:
    """Whether Dask distributed (the farm extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("distributed") is not None


def farm(plan: Any) -> dict[str, Any]:
    """Frames per second: local `once`, and `once --farm` with one and with two workers."""
    from benchmarks.scenarios import _write_frames, median

    knobs: Knobs = plan.knobs
    frames = _write_frames(plan, "farm-frames", plan.count)
    folder = frames[0].parent
    one = _write_frames(plan, "farm-one", 1)[0]
    config = write_config(
        plan.work / "farm.yaml",
        config_dict(knobs, plan.work / "farm-watch", ["*.jpg"], "{stem}_depth.jpg", plan.work / "farm.status.json"),
    )
    out = plan.work / "farm-maps"
    timeout = 120 + 5 * plan.count
    base = [python(), "-m", "depthwatch", "once", "-c", str(config)]

    local, local_fixed = [], []
    for _ in range(plan.repeats):
        shutil.rmtree(out, ignore_errors=True)
        local.append(_timed([*base, str(folder), "-o", str(out)], knobs, timeout))
        local_fixed.append(_timed([*base, str(one), "-o", str(plan.work / "farm-one-map.jpg")], knobs, timeout))

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    children: list[Child] = []
    results: dict[str, Any] = {"frames": plan.count}
    try:
        scheduler = Child(
            "dask scheduler",
            [python(), "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            plan.work / "farm-scheduler.log",
        )
        children.append(scheduler)
        for count in (1, 2):
            status = plan.work / f"farm-worker{count}.status.json"
            worker = Child(
                f"depthwatch worker {count}",
                [python(), "-m", "depthwatch", "worker", address, "-c", str(config), "--status", str(status)],
                plan.work / f"farm-worker{count}.log",
                knobs.env(),
            )
            children.append(worker)
            _wait_running(status, worker)
            runs = []
            for _ in range(plan.repeats):
                # --force: every frame is mapped again, none skipped as up to date.
                runs.append(_timed([*base, "--farm", address, "--force", str(folder), "-o", str(out)], knobs, timeout))
            results[f"workers_{count}"] = {"fps": plan.count / median(runs), "wall_s": runs}
        fixed = [_timed([*base, "--farm", address, str(folder), "-o", str(out)], knobs, timeout) for _ in range(plan.repeats)]
    finally:
        for child in reversed(children):
            child.stop()
    local_fixed_s, farm_fixed_s = median(local_fixed), median(fixed)
    results["local"] = {"fps": _rate(plan.count, median(local), local_fixed_s), "wall_s": local, "fixed_s": local_fixed}
    for count in (1, 2):
        r = results[f"workers_{count}"]
        r["fps"] = _rate(plan.count, median(r["wall_s"]), farm_fixed_s)
    results["farm_fixed_s"] = fixed
    results["overhead_ms_per_frame"] = 1000 / results["workers_1"]["fps"] - 1000 / results["local"]["fps"]
    return results


def _rate(frames: int, wall_s: float, fixed_s: float) -> float:
    """Frames per second once the command's fixed cost (start-up, model or connection) is taken out."""
    return frames / max(wall_s - fixed_s, 1e-3)


def rows(results: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(label, frames/s, notes) for the report's table."""
    f = results["scenarios"].get("farm")
    if not f:
        return []
    local_fixed = sorted(f["local"]["fixed_s"])[len(f["local"]["fixed_s"]) // 2]
    farm_fixed = sorted(f["farm_fixed_s"])[len(f["farm_fixed_s"]) // 2]
    return [
        (f"local once ({f['frames']} frames)", f["local"]["fps"], f"beyond start-up, model load and one frame ({local_fixed:.2f} s)"),
        ("once --farm, 1 local worker", f["workers_1"]["fps"], f"beyond client start and connect ({farm_fixed:.2f} s); "
         f"farm overhead {f['overhead_ms_per_frame']:.1f} ms/frame"),
        ("once --farm, 2 local workers", f["workers_2"]["fps"], "both on this machine's cores"),
    ]
