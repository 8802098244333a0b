"""depthwatch's benchmark suite: `python -m benchmarks` (see docs/benchmarks.md).

Kept free of imports so the small child processes it starts (`benchmarks.bare`,
`benchmarks.classic_server`) load only what they use.
"""
