"""The seed's Flask /predict server, as written: the pattern people start with, and the peer to beat.

The model is loaded when the app is made; `POST /predict` runs the seed's own
code path: `cv2.imread` of `<folder>/frame.jpg`, `cv2.cvtColor` to RGB, then
the one change a 1080p frame needs, a `cv2.resize` of the uint8 frame to the
model's input (OpenCV's default, bilinear), then transpose, `astype("float32")
/ 255`, `session.run`, rescale to 0..255, and `cv2.imwrite` of
`<folder>/depth.jpg` at the model's size (256x256 for MiDaS small), not the
frame's. It answers "ok". Nothing else is changed: converting the whole 1080p
frame to float64 before resizing it, which the seed never does, would make the
peer about 1.7x slower than the seed.

`BENCH_FULL=1` is the labelled variant "the seed's loop doing depthwatch's
job": the same loop, but the map is resized to the frame's size and written
atomically (a temporary file in the folder, fsynced, renamed over
`depth.jpg`, the folder fsynced), as depthwatch writes it.

The benchmark runs it as a real process: under Flask's own server
(`python -m benchmarks.classic_server --port N`) and under
`gunicorn -w 1 'benchmarks.classic_server:create_app()'`. Everything it needs
comes in environment variables, so both serve the same app:

    BENCH_MODEL    the .onnx file
    BENCH_SESSION  JSON of depthwatch's session settings (see sessions.describe)
    BENCH_PREP     JSON: input width, height, layout (NCHW/NHWC), dtype, mean, std
    BENCH_FOLDER   where frame.jpg is read and depth.jpg written
    BENCH_FULL     1: the map at the frame's size, written atomically
"""

from __future__ import annotations

import argparse
import json
import os

import cv2
import numpy as np
from flask import Flask

from benchmarks.sessions import open_plain


def create_app() -> Flask:
    folder = os.environ["BENCH_FOLDER"]
    prep = json.loads(os.environ["BENCH_PREP"])
    full = os.environ.get("BENCH_FULL") == "1"
    session = open_plain(os.environ["BENCH_MODEL"], json.loads(os.environ["BENCH_SESSION"]))
    input_name = session.get_inputs()[0].name
    size = (prep["width"], prep["height"])
    # The seed feeds RGB / 255; a profile with mean and std (DPT) needs them too, and a
    # quantised model (uint8 input) takes the pixels as they are.
    normalised = prep["mean"] != [0.0, 0.0, 0.0] or prep["std"] != [1.0, 1.0, 1.0]
    mean = np.asarray(prep["mean"], np.float32)
    std = np.asarray(prep["std"], np.float32)

    app = Flask(__name__)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/predict")
    def predict() -> tuple[str, int] | str:
        img = cv2.imread(os.path.join(folder, "frame.jpg"))
        if img is None:
            return "cannot read frame.jpg", 400
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        frame_size = (img.shape[1], img.shape[0])
        img = cv2.resize(img, size)  # the one change 1080p needs: the uint8 frame to the model's input
        if normalised:  # per channel, before the channels move
            img = (img.astype("float32") / 255 - mean) / std * 255
        if prep["layout"] == "NCHW":
            img = img.transpose(2, 0, 1)
        x = img if prep["dtype"] == "uint8" else img.astype("float32") / 255
        prediction = session.run(None, {input_name: x[None]})[0]
        depth = prediction.reshape(size[1], size[0])
        depth_min, depth_max = depth.min(), depth.max()
        out = 255 * (depth - depth_min) / max(depth_max - depth_min, 1e-9)
        if prep.get("output") == "depth":
            out = 255 - out
        if not full:
            cv2.imwrite(os.path.join(folder, "depth.jpg"), out.astype("uint8"))
            return "ok"
        out = cv2.resize(out.astype("uint8"), frame_size)
        _write_atomically(folder, "depth.jpg", cv2.imencode(".jpg", out)[1].tobytes())
        return "ok"

    return app


def _write_atomically(folder: str, name: str, data: bytes) -> None:
    """A temporary file beside the target, fsynced, renamed over it; then the folder fsynced."""
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, name))
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description="the seed's Flask /predict server (Flask's own server)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    create_app().run(host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
