"""Four and a half thousand frames through one daemon: flat memory, one model load, nothing unaccounted for.

Three thousand frames after the daemon is warm: a leak of 1.8 KB a frame (a fifth of one
64x48 frame decoded) alone adds the 5% the test allows to its memory (about 105 MiB; without
a leak it grows 2% more up to frame 4,000, then stays flat). No more than that: six thousand
frames take 35 s of CPU and 70 s of one test process on an AVX2 machine, whose whole suite must
stay under ten minutes on slower hosts of the same kind.
"""

from __future__ import annotations

import psutil
import pytest
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
#: Frames after which the daemon counts as warm: its bounded memories (the last 1,024
#: outputs written and versions seen, the stabiliser's recent outputs) are full, so
#: what grows after this grows without bound.
WARM = 1_500


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_and_a_half_thousand_frames(tmp_path, tiny_model):
    total, batch, bad_every = 4_500, 100, 997
    d = DaemonProcess(
        tmp_path, tiny_model, watch={"patterns": ["*.jpg"]}, output={"template": "{stem}_depth.jpg", "error_sidecar": True}
    ).start()
    frames = [jpeg_bytes(quadrant_frame(64, 48, q)) for q in QUADRANTS]
    bad = {i for i in range(total) if i % bad_every == bad_every - 1}
    process = psutil.Process(d.proc.pid)
    try:
        rss = {}
        for start in range(0, total, batch):
            for i in range(start, min(total, start + batch)):
                write_by_rename(d.watch / f"f{i:05d}.jpg", b"not a frame" if i in bad else frames[i % 4])
            dropped = min(total, start + batch)
            wait_for(
                lambda: d.counts().get("done", 0) + d.counts().get("failed", 0) >= dropped,
                timeout=300,
                what=f"{dropped} frames",
            )
            if dropped == WARM:
                rss["first"] = process.memory_info().rss
        wait_for(lambda: d.status().get("queue_depth") == 0 and d.status().get("in_progress") == 0, what="idle")
        rss["last"] = process.memory_info().rss
        status = d.status()
    finally:
        assert d.stop() == 0
    growth = rss["last"] / rss["first"] - 1
    print(f"RSS after {WARM} frames {rss['first'] / 2**20:.1f} MiB, after {total}: {rss['last'] / 2**20:.1f} MiB ({growth:+.1%})")
    assert growth < 0.05
    assert status["model_loads"] == 1
    assert status["counts"]["done"] == total - len(bad) and status["counts"]["failed"] == len(bad)
    for i in range(total):
        record = d.watch / f"f{i:05d}.jpg.error.json"
        output = d.watch / f"f{i:05d}_depth.jpg"
        assert record.exists() if i in bad else output.exists(), i
