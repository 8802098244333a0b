"""A long clip on the render farm: `once --farm CLIP` on one and on two workers, against local `once CLIP`.

One generated clip (H.264 with B-frames, a cut every third of it), mapped to
a ProRes depth clip three ways, each command timed whole as a user runs it:
local `once CLIP`; `once --farm` with one `depthwatch worker` on 127.0.0.1
(the farm's overhead: the packet index, two passes with the second decode,
predictions and maps across the network, the planner on the client, the
join); and with two workers sharing this machine's cores. The fixed cost of
each (start-up, model load or connection, a one-frame clip) is taken out as
in the frame farm's rows. Peak RSS is sampled for the client and for each
worker: neither may grow with the clip's length.
"""

from __future__ import annotations

import shutil
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from benchmarks.clips import pan_clip_frames, write_clip
from benchmarks.daemon import Knobs, config_dict, write_config
from benchmarks.processes import BenchError, Child, free_port, python


def available() -> bool:
    """Whether the farm and video extras are both installed."""
    import importlib.util

    return importlib.util.find_spec("distributed") is not None and importlib.util.find_spec("av") is not None


def _run(name: str, argv: list[str], log: Path, knobs: Knobs, timeout: float) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one command run to its end."""
    child = Child(name, argv, log, knobs.env())
    try:
        child.proc.wait(timeout)
    except Exception:
        child.stop()
        raise BenchError(f"{name} took over {timeout:.0f} s: {child.tail()}") from None
    wall = time.perf_counter() - child.started
    peak = child.peak_rss()
    code = child.stop()
    if code != 0:
        raise BenchError(f"{name} exited {code}: {child.tail()}")
    return wall, peak


def compare(plan: Any, frames: int, size: tuple[int, int]) -> dict[str, Any]:
    """Frames per second and peak RSS: local `once CLIP`, and `once --farm CLIP` on 1 and 2 workers."""
    from benchmarks.farm import _wait_running
    from benchmarks.scenarios import median

    knobs: Knobs = plan.knobs
    folder = plan.work / "farm-clip"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    clip = folder / "long.mp4"
    count = write_clip(clip, pan_clip_frames(size, frames, step=max(1, size[0] // 400), shot=max(1, frames // 3)), codec="h264", rate=Fraction(24))
    one = folder / "one.mp4"
    write_clip(one, pan_clip_frames(size, 1), codec="h264", rate=Fraction(24))
    config = write_config(
        plan.work / "farm-clip.yaml",
        config_dict(knobs, plan.work / "farm-clip-watch", ["*.mp4"], "{stem}_depth.jpg", plan.work / "farm-clip.status.json"),
    )
    base = [python(), "-m", "depthwatch", "once", "-c", str(config)]
    timeout = 120 + 2 * frames
    out = plan.work / "farm-clip-depth.mov"
    logs = plan.work / "farm-clip-logs"
    logs.mkdir(exist_ok=True)

    local, local_fixed, local_rss = [], [], []
    for i in range(plan.repeats):
        wall, rss = _run("once CLIP", [*base, str(clip), "-o", str(out)], logs / f"local{i}.log", knobs, timeout)
        local.append(wall)
        local_rss.append(rss)
        local_fixed.append(_run("once one frame", [*base, str(one), "-o", str(plan.work / "farm-clip-one.mov")], logs / f"local-one{i}.log", knobs, timeout)[0])

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    results: dict[str, Any] = {"frames": count, "size": list(size)}
    children: list[Child] = []
    try:
        scheduler = Child(
            "dask scheduler",
            [python(), "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            logs / "scheduler.log",
        )
        children.append(scheduler)
        workers: list[Child] = []
        for n in (1, 2):
            status = plan.work / f"farm-clip-worker{n}.status.json"
            worker = Child(
                f"depthwatch worker {n}",
                [python(), "-m", "depthwatch", "worker", address, "-c", str(config), "--status", str(status)],
                logs / f"worker{n}.log",
                knobs.env(),
            )
            children.append(worker)
            workers.append(worker)
            _wait_running(status, worker)
            runs, fixed, client_rss = [], [], []
            for i in range(plan.repeats):
                # --force: every range rendered again, none kept from the run before.
                wall, rss = _run(f"once --farm CLIP ({n})", [*base, "--farm", address, "--force", str(clip), "-o", str(out)],
                                 logs / f"farm{n}-{i}.log", knobs, timeout)
                runs.append(wall)
                client_rss.append(rss)
                fixed.append(_run("once --farm one frame", [*base, "--farm", address, "--force", str(one), "-o", str(plan.work / "farm-clip-one.mov")],
                                  logs / f"farm{n}-one{i}.log", knobs, timeout)[0])
            results[f"workers_{n}"] = {
                "fps": _fps(count, median(runs), median(fixed)),
                "wall_s": runs,
                "fixed_s": fixed,
                "client_peak_rss_bytes": max(client_rss),
                "worker_peak_rss_bytes": [w.peak_rss() for w in workers],
            }
    finally:
        for child in reversed(children):
            child.stop()
    results["local"] = {
        "fps": _fps(count, median(local), median(local_fixed)),
        "wall_s": local,
        "fixed_s": local_fixed,
        "peak_rss_bytes": max(local_rss),
    }
    one_fps, local_fps = results["workers_1"]["fps"], results["local"]["fps"]
    results["overhead_ms_per_frame"] = 1000 / one_fps - 1000 / local_fps if one_fps and local_fps else None
    return results


def _fps(frames: int, wall_s: float, fixed_s: float) -> float | None:
    """Frames per second beyond the fixed cost; None when the run was within the fixed cost's noise."""
    from benchmarks.farm import _rate

    return _rate(frames, wall_s, fixed_s) if wall_s > fixed_s else None


def _f(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def rows(results: dict[str, Any]) -> list[str]:
    """The report's lines for this scenario."""
    f = results["scenarios"].get("farm_clips")
    if not f:
        return []
    mb = 1 / (1 << 20)
    w1, w2, local = f["workers_1"], f["workers_2"], f["local"]
    return [
        f"  clip on the farm ({f['frames']} frames, {f['size'][0]}x{f['size'][1]}, H.264 -> ProRes): "
        f"local once {_f(local['fps'])} fps (peak RSS {local['peak_rss_bytes'] * mb:.0f} MB); "
        f"1 worker {_f(w1['fps'])} fps, 2 workers {_f(w2['fps'])} fps (same machine); "
        f"overhead {_f(f['overhead_ms_per_frame'])} ms/frame; client peak RSS {w2['client_peak_rss_bytes'] * mb:.0f} MB, "
        f"workers {', '.join(f'{r * mb:.0f}' for r in w2['worker_peak_rss_bytes'])} MB",
    ]
