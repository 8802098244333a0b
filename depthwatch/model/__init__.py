"""The model layer: what a model is, and the one thread that runs it.

The model's spec, its I/O contract and profile, recognising a file, execution
providers, the CoreML and digest caches, the catalogue and downloads; the
runtimes behind one session interface (`sessions/`); which engine serves,
measured, and the sessions it hands the engine (`choosing/`); and the engine:
one inference thread serving from one session, the serving model loaded once.
"""
