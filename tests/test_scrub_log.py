"""While an editor scrubs, superseded frames are summarised, not logged one line each."""

from __future__ import annotations

import itertools
import re

from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for
from onnx_models import slow_model

from depthwatch.frames import provenance


def test_superseded_frames_are_summarised_and_none_is_reported_as_inferred(tmp_path):
    model = slow_model(tmp_path / "slow.onnx", seconds=0.1, size=128)
    d = DaemonProcess(tmp_path / "d", model, watch={"settle_ms": 0}, providers=["cpu"]).start()
    try:
        versions = [jpeg_bytes(quadrant_frame(160, 96, corner)) for corner in ("top-left", "top-right", "bottom-left")]
        frame, written = d.watch / "frame.jpg", itertools.count()

        def scrub() -> bool:
            # A burst is over in milliseconds: a loaded machine may wake the daemon only
            # after it, to see just its last version (mapped, none superseded). Scrub on
            # until the daemon has seen one version replace another.
            for _ in range(40):
                write_by_rename(frame, versions[next(written) % 3])
            return d.counts().get("superseded", 0) > 0

        wait_for(scrub, what="frames to be superseded")
        # The newest version is the one mapped: however many were superseded, none is lost.
        def newest_mapped() -> bool:
            return provenance.same_version(provenance.read(d.watch / "depth.jpg") or {}, frame.stat())

        wait_for(newest_mapped, what="the newest version's map")
        wait_for(lambda: d.status().get("queue_depth") == 0 and d.status().get("in_progress") == 0, what="idle")
        assert d.stop() == 0
        counts = d.counts()  # the status file's last word, written as it stopped
    finally:
        d.close()

    log = d.log()
    summaries = re.findall(r"INFO    (\d+) frames? superseded by newer versions in the last (\d+) s \(([^)]*)\)", log)
    assert summaries, log
    # Every superseded frame is in exactly one summary, each split by how far it got.
    assert sum(int(count) for count, _, _ in summaries) == counts["superseded"] > 0
    for count, _, how in summaries:
        parts = dict((stage, int(n)) for n, stage in (p.split(" ", 1) for p in how.split(", ")))
        assert set(parts) <= {"replaced while queued", "before inference", "after inference had started"}
        assert sum(parts.values()) == int(count)
    # No line per superseded frame, and none dressed up as a frame line with timings.
    assert "skipped" not in log and "a newer version arrived" not in log
    assert len(d.frame_lines()) == counts["done"]
