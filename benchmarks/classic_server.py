"""The classic Flask /predict server: the pattern people start with, and the peer to beat.

The model is loaded when the app is made; `POST /predict` reads
`<folder>/frame.jpg` from disk with `cv2.imread` (a full decode), converts it
to RGB floats, resizes it to the model's input with cubic interpolation, runs
the session, scales the prediction to 0..255 and writes `<folder>/depth.jpg`
with `cv2.imwrite` at the model's resolution (256x256 for MiDaS small, not the
frame's size, as the classic example does), then answers "ok".

The benchmark runs it as a real process twice: under Flask's own server
(`python -m benchmarks.classic_server --port N`) and under
`gunicorn -w 1 'benchmarks.classic_server:create_app()'`. Everything it needs
comes in environment variables, so both serve the same app:

    BENCH_MODEL    the .onnx file
    BENCH_SESSION  JSON of depthwatch's session settings (see sessions.describe)
    BENCH_PREP     JSON: input width, height, layout (NCHW/NHWC), dtype, mean, std
    BENCH_FOLDER   where frame.jpg is read and depth.jpg written
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
    session = open_plain(os.environ["BENCH_MODEL"], json.loads(os.environ["BENCH_SESSION"]))
    input_name = session.get_inputs()[0].name
    size = (prep["width"], prep["height"])
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
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB) / 255.0
        img = cv2.resize(img, size, interpolation=cv2.INTER_CUBIC)
        if prep["dtype"] == "uint8":
            x = np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
        else:
            x = ((img - mean) / std).astype(np.float32)
        if prep["layout"] == "NCHW":
            x = x.transpose(2, 0, 1)
        prediction = session.run(None, {input_name: np.ascontiguousarray(x[None])})[0]
        depth = prediction.reshape(size[1], size[0])
        depth_min, depth_max = depth.min(), depth.max()
        out = 255 * (depth - depth_min) / max(depth_max - depth_min, 1e-9)
        if prep.get("output") == "depth":
            out = 255 - out
        cv2.imwrite(os.path.join(folder, "depth.jpg"), out.astype("uint8"))
        return "ok"

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="the classic Flask /predict server (Flask's own server)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    create_app().run(host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
