"""The model layer: what a model is, and the one thread that runs it.

The model's spec, its I/O contract and profile, recognising a file, execution
providers and their measured choice, the CoreML and digest caches, the
catalogue and downloads, and the engine: one inference thread owning one
session, loaded once.
"""
