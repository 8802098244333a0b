"""The frames layer: one frame's way from a file to its depth map on disk.

Which files are frames and where their maps go (rules, job), reading a frame
without trusting its path, the provenance record, the atomic writer, numbered
sequences, and the pipeline that carries a job through the worker threads and
the engine. It uses `imaging` for pixels and `model` for inference.
"""
