"""Clip files, as `imaging` holds image files: what a clip holds (PyAV), whether it is whole yet, depthwatch's mark, a depth clip's names, a depth clip written.

Below `frames` and `config`, which ask what a clip is, where its depth clip
goes and whether a file is one of depthwatch's; a clip's way to its depth
clip is `clips`'.
"""
