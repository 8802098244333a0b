"""depthwatch's `POST /predict` beside the classic server: same client loop, model and frames.

Two ways a plugin can use the daemon's HTTP API (`api.enabled`), each as a
real `python -m depthwatch run` process on 127.0.0.1:

- classic protocol: write `frame.jpg` in place, `POST /predict` with no body,
  the answer `DONE` comes once `depth.jpg` (at the frame's size) is on disk;
  exactly the loop `scenarios.classic` runs against the Flask server;
- image body: `POST /predict` with the JPEG as the body, the map comes back in
  the answer and nothing is written.

Per request: the time from the write (or the send) to the answer, p50 and p95,
and frames per second over `count` requests in a row. The daemon's status says
how many inferences ran: one per request, though its watcher sees every write.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

import yaml

from benchmarks.daemon import Daemon, signature, write_config
from benchmarks.processes import BenchError, free_port
from benchmarks.scenarios import WARM_UP, Plan, median, percentile


def _request(port: int, body: bytes | None = None, timeout: float = 120.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "image/jpeg"} if body else {}
        conn.request("POST", "/predict", body=body or b"", headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _done_count(daemon: Daemon, expected: int, timeout: float = 30.0) -> int | None:
    """The daemon's count of maps written, once it reaches `expected` (or after `timeout`: more shows double work)."""
    deadline = time.perf_counter() + timeout
    done = None
    while time.perf_counter() < deadline:
        done = ((daemon.status() or {}).get("counts") or {}).get("done")
        if done is not None and done >= expected:
            time.sleep(0.5)  # a second inference of the same version would show up by now
            return ((daemon.status() or {}).get("counts") or {}).get("done")
        time.sleep(0.02)
    return done


def predict(plan: Plan) -> dict[str, Any]:
    daemon = Daemon(plan.work, "predict", plan.knobs, ["frame.jpg"], "depth.jpg")
    port = free_port()
    config = yaml.safe_load(daemon.config_path.read_text())
    config["api"] = {"enabled": True, "port": port}
    write_config(daemon.config_path, config)
    daemon.start()
    try:
        frame, depth = daemon.folder / "frame.jpg", daemon.folder / "depth.jpg"
        frames = plan.frames.data

        def classic_round(data: bytes) -> tuple[float, bool]:
            before = signature(depth)
            t = time.perf_counter()
            with open(frame, "wb") as f:
                f.write(data)
            status, answer = _request(port)
            ms = (time.perf_counter() - t) * 1000
            return ms, status == 200 and answer == b"DONE" and signature(depth) not in (None, before)

        def body_round(data: bytes) -> tuple[float, bool]:
            t = time.perf_counter()
            status, answer = _request(port, data)
            return (time.perf_counter() - t) * 1000, status == 200 and answer[:3] == b"\xff\xd8\xff"

        out: dict[str, Any] = {"startup_s": daemon.startup_s}
        requests = 0
        for mode, one in (("classic", classic_round), ("body", body_round)):
            for i in range(WARM_UP):
                one(frames[i % len(frames)])
            runs, latencies, good = [], [], 0
            for _ in range(plan.repeats):
                start = time.perf_counter()
                for i in range(plan.count):
                    ms, ok = one(frames[i % len(frames)])
                    latencies.append(ms)
                    good += ok
                runs.append(plan.count / (time.perf_counter() - start))
            out[mode] = {
                "fps": median(runs),
                "runs_fps": runs,
                "p50_ms": median(latencies),
                "p95_ms": percentile(latencies, 95),
                "requests": plan.repeats * plan.count,
                "answered": good,
            }
            requests += WARM_UP + plan.repeats * plan.count
            if mode == "classic":
                # Every request's map is on disk when it is answered; the watcher saw every
                # write too, and still each version ran once.
                out["classic"]["inferences"] = _done_count(daemon, requests)
        if daemon.stop() != 0:
            raise BenchError(f"depthwatch exited with an error: {daemon.child.tail() if daemon.child else ''}")
        return out
    finally:
        daemon.stop()
