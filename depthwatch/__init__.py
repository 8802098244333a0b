"""depthwatch: drop a frame into a folder, get its depth map next to it."""

import os

__version__ = "0.1.0"

# Float depth maps as .exr: OpenCV's wheels build the OpenEXR codec in but leave it off unless
# this is set (a security default for decoding untrusted EXRs; depthwatch only writes them: frames
# are sniffed by their magic bytes first, so an EXR never reaches the decoder).
# OpenCV reads it when the codec is first used, so setting it here, before any cv2 work, enables
# it for this process and its children only; a value the user set is kept.
os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")
