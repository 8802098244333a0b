"""The imaging layer: pixels, and the image files that hold them.

Decoding and encoding, the model's input tensor, and the render chain that
turns a prediction into a map: normalise (one frame) or stabilise (a shot),
refine (the edge-aware upscale), levels. It knows a model only by its contract
and profile. Clips are the clip family's (`clips/`, their files in
`media/`).

Most of it is pure work on bytes and arrays, with no state. What is not, and why:

- Files: a plate is opened by the library that reads it (OpenImageIO), so
  `plates.py` hands it a plate's bytes as a memory file (a temporary file
  where there is none). Reading a frame safely and writing a map atomically
  are `frames/`'s, not this layer's.
- Threads: none is started here, but some code runs on several at once.
  `beside.py` hands half of a JPEG encode (`jpegstrips.py`) to another worker
  thread under a lock; `stabilise/live.py`'s Stabiliser is shared by the
  pipeline's workers and keeps its per-output state under a lock;
  `stabilise/motion.py` keeps one flow instance per thread.
"""
