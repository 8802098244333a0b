"""depthwatch's benchmark suite: `python -m benchmarks` (see docs/benchmarks.md).

Kept free of imports (but `os`, which Python has loaded already) so the small child processes it starts (`benchmarks.bare`,
`benchmarks.classic_server`) load only what they use.
"""

import os as _os

# The seed's server and the bare session import onnxruntime without depthwatch: without this its
# telemetry (see depthwatch/__init__.py) would look up Microsoft's collector and write under the
# machine's ~/.cache and $TMPDIR from every run. It costs the seed nothing measurable.
_os.environ["ORT_DISABLE_TELEMETRY"] = "1"
