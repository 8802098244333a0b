"""The imaging layer: pure pixel work, no files and no threads.

Decoding and encoding, the model's input tensor, and the render chain that
turns a prediction into a map: normalise (one frame) or stabilise (a shot),
refine (the edge-aware upscale), levels. It knows a model only by its contract
and profile.
"""
