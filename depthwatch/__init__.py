"""depthwatch: drop a frame into a folder, get its depth map next to it."""

import os as _os

__version__ = "0.1.0"

# onnxruntime's wheels (1.32 on Linux, at least) start Microsoft's 1DS telemetry when the library
# loads: DNS lookups of mobile.events.data.microsoft.com from its own threads, a device id and
# an event database under ~/.cache/Microsoft/DeveloperTools, a `.ses` file in $TMPDIR. depthwatch
# never phones home and writes nothing outside its own folders, so it is switched off here, in
# the one module every entry point (run, once, worker, the farm's tasks, the API) imports before
# any of onnxruntime: the library reads the variable as it loads. Set, not defaulted: "0" would
# turn it back on. (OpenVINO's telemetry is kept out in `model.sessions.openvino.runtime`.)
_os.environ["ORT_DISABLE_TELEMETRY"] = "1"
