"""The first start of a model no one has measured on this machine: how soon `ready`, how soon the first map.

A new user's first `depthwatch run` with `providers: auto`: an empty cache
folder (no remembered engine choice, no int8 file), a model of about a second
a run (the stand-in widened four times: 16x its FLOPs), one frame dropped the
moment the daemon says it is ready. Reported: seconds from launch to
`running`, seconds from the drop to the map and that as a multiple of the
model's own run (from the daemon's log line), then how long the idle-time
measurement took and what it chose. `--quick` uses the quick stand-in.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import standin
from benchmarks.daemon import DaemonProcess, config_dict, drop, wall_of

#: The stand-in at four times its width: about 16x the FLOPs (93 GFLOP), about a second a run on two cores.
SLOW = standin.Shape(width=128)


def first_start(plan: Any) -> dict[str, Any]:
    """One first start in a fresh cache folder (the run is one: a second would find the choice remembered)."""
    quick = plan.count < 10
    model = standin.build(plan.work / "first-start.onnx", standin.QUICK if quick else SLOW, seed=7)
    folder = plan.work / "first-start"
    folder.mkdir(parents=True, exist_ok=True)
    knobs = plan.knobs
    config = config_dict(knobs, folder, ["*.jpg"], "{stem}_depth.jpg", plan.work / "first-start.status.json")
    config["model"].update(path=str(model), profile="midas-v21-small", providers="auto", precision="auto")
    cache = plan.work / "first-start-cache"
    daemon = DaemonProcess(plan.work, config, name="first-start", env={**knobs.env(), "XDG_CACHE_HOME": str(cache)})
    try:
        daemon.start(wait=True, timeout=600)
        ready_s = daemon.startup_s
        status = daemon.status()
        measuring_at_ready = bool(status.get("measuring"))
        served_first = f"{(status.get('providers') or ['?'])[0]} {status.get('precision')}"
        dropped = drop(folder, "first.jpg", plan.frames.data[0])
        output = folder / "first_depth.jpg"
        while not output.exists():
            daemon.child.check_alive()  # type: ignore[union-attr]
            time.sleep(plan.poll_s or 0.001)
        first_map_s = time.perf_counter() - dropped
        timings = []
        while not timings:
            timings = daemon.frame_timings()
            time.sleep(0.01)
        infer_ms = timings[0].get("infer", 0.0)
        measured_s = daemon.wait_measured(600)
        after = daemon.status()
        idle = daemon.wait_idle(wall_of(dropped))
    finally:
        daemon.stop()
    return {
        "ready_s": ready_s,
        "measuring_at_ready": measuring_at_ready,
        "served_first": served_first,
        "first_map_s": first_map_s,
        "infer_ms": infer_ms,
        "first_map_in_runs": first_map_s * 1000 / infer_ms if infer_ms else None,
        # From launch until the idle-time measurement ended (the daemon serving all along).
        "measured_after_s": measured_s,
        "chosen": f"{(after.get('providers') or ['?'])[0]} {after.get('precision')}",
        "engine_switches": after.get("engine_switches"),
        "model_loads": idle.get("model_loads"),
        "gflops": standin.flops(standin.QUICK if quick else SLOW) / 1e9,
        "model": Path(model).name,
    }
