"""The daemon layer: `depthwatch run`'s process.

Its lifecycle (startup, main loop, reload, shutdown), the watcher that turns
filesystem events into jobs, the queue they wait in, the per-folder locks, the
status file and the optional HTTP API. It hands jobs down to `frames`; nothing
below imports it.
"""
