"""The memory and start-up baseline: a bare process holding one session, nothing else.

`python -m benchmarks.bare MODEL SETTINGS_JSON` imports onnxruntime (or, for
OpenVINO, the openvino runtime through depthwatch's one-class session module)
and numpy only, creates one session with depthwatch's settings, runs it once on zeros,
then prints one JSON line (its peak RSS as the kernel counts it) and exits.
The parent times the start from launch to that line and samples the RSS too.
"""

from __future__ import annotations

import json
import resource
import sys

import numpy as np

from benchmarks.sessions import open_plain

_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}


def main(argv: list[str]) -> int:
    model, settings = argv[0], json.loads(argv[1])
    session = open_plain(model, settings)
    inp = session.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 256 for d in inp.shape]  # OpenVINO: None for dynamic
    session.run(None, {inp.name: np.zeros(shape, _TYPES.get(inp.type, np.float32))})
    print(json.dumps({"peak_rss_bytes": _peak_rss()}), flush=True)
    return 0


def _peak_rss() -> int:
    """This process's high-water RSS. Linux's ru_maxrss survives exec (it would count the
    parent's memory at fork), so the kernel's per-process VmHWM is read instead."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # macOS: bytes


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
