"""What the daemon's own bookkeeping costs a frame: the supervisor's notes and the heartbeat.

Every frame gets three notes in the black box (its read, its inference, its
render: one `pwrite` each, of the frame's path and version) and three clears,
through the same `Supervisor` the daemon wires; every 5 s the status file is
written whether anything changed or not (the heartbeat `depthwatch status`,
`/health` and systemd's watchdog read). Both run on the frame's own threads or
the main loop, so they are timed here as the daemon runs them, on one core,
and set against a frame's time in the burst of the same run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from depthwatch.daemon.blackbox import BlackBox
from depthwatch.daemon.status import Status, write_status
from depthwatch.daemon.supervisor import Supervisor

#: Frames per timed round, and rounds (the median is reported).
FRAMES = 2000
ROUNDS = 7
#: How often the main loop writes the status when nothing changed (`reporting`).
HEARTBEAT_S = 5.0


def cost(work: Path) -> dict[str, Any]:
    """Microseconds of bookkeeping per frame (median of ROUNDS rounds), and the heartbeat's share of a core."""
    folder = work / "bookkeeping"
    folder.mkdir(parents=True, exist_ok=True)
    status_file = folder / "status.json"
    box = BlackBox(status_file)
    supervisor = Supervisor(box, lambda: 60.0)
    box.open(slots=supervisor.slots_on_disk(2))
    frame = folder / "A001_C002_0101XY" / "frame.000123.jpg"
    per_frame: list[float] = []
    try:
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for k in range(FRAMES):
                label = (frame, (123_456 + k, 1_700_000_000_000_000_000 + k, 42))
                supervisor.worker(label, "read")
                supervisor.worker(None, None)
                supervisor.inference_note(label)
                supervisor.inference_note(None)
                supervisor.worker(label, "render")
                supervisor.worker(None, None)
            per_frame.append((time.perf_counter() - start) / FRAMES * 1e6)
        status = Status(state="running", watching=[str(folder)], model="midas_v21_small_256.onnx", providers=["CPUExecutionProvider"])
        status.threads = supervisor.threads()
        writes: list[float] = []
        for _ in range(50):
            start = time.perf_counter()
            status.heartbeat_at = time.time()
            write_status(status_file, status)
            writes.append((time.perf_counter() - start) * 1e6)
    finally:
        box.close()
    per_frame.sort()
    writes.sort()
    heartbeat_us = writes[len(writes) // 2]
    return {
        "notes_us_per_frame": per_frame[len(per_frame) // 2],
        "notes_rounds_us": per_frame,
        "heartbeat_write_us": heartbeat_us,
        "heartbeat_core_share": heartbeat_us / 1e6 / HEARTBEAT_S,
    }
