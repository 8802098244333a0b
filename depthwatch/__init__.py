"""depthwatch: drop a frame into a folder, get its depth map next to it."""

__version__ = "0.1.0"
