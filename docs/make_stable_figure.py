"""Make docs/stable.png: the same slow pan mapped per frame (top) and shot-stable (bottom).

    python docs/make_stable_figure.py [--model PATH] [--out docs/stable.png]

The pan is generated: crops of scikit-image's `coffee` photograph, 8 pixels
further right each frame at 640x360, the exposure wobbling by up to 4% and
JPEG-compressed, then run through the real FastDepth model (../shared/models)
the way the daemon runs it: `output.normalise: frame` for the middle row,
`stable` for the bottom one. Every fourth frame of 24 is shown; the caption
line gives the mean change of the same scene point between consecutive maps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np
from skimage import data

from depthwatch.imaging import codec, normalise, stabilise, tensor
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for `benchmarks`
from benchmarks.frames import pan_frames  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT.parent / "shared" / "models" / "fastdepth_224_nyu_int8.onnx"
W, H, STEP, FRAMES, SHOWN = 640, 360, 8, 24, 6
TILE = (176, 99)


def pan() -> list[np.ndarray]:
    return [codec.decode(f, max_pixels=10**8).image for f in pan_frames(data.coffee(), (W, H), FRAMES, STEP)]


def change(maps: list[np.ndarray]) -> float:
    """Mean absolute change of the same scene point between consecutive maps (share of full range)."""
    up = [cv2.resize(m, (W, H), interpolation=cv2.INTER_LINEAR) for m in maps]
    return float(np.mean([np.abs(a[:, STEP:] - b[:, : W - STEP]).mean() for a, b in zip(up, up[1:])]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "stable.png")
    args = parser.parse_args()
    profile = PROFILES["fastdepth-nyu"]
    frames = pan()
    with Engine(ModelSpec(args.model, profile, ("cpu",))) as engine:
        info = engine.wait_ready()
        predictions = []
        for image in frames:
            decoded = codec.Decoded(image, (W, H), "jpeg")
            prepared = tensor.prepare(decoded, info.contract, profile)
            predictions.append(engine.infer(prepared, info.generation).result().prediction)
    per_frame = [normalise.frame(p, profile.predicts) for p in predictions]
    stabiliser, stable = stabilise.Stabiliser(), []
    out = Path("depth.jpg")
    for i, (image, p) in enumerate(zip(frames, predictions)):
        shot_map = stabiliser.map(out, p, profile.predicts, image, key=0, seq=i + 1)
        stabiliser.landed(out, shot_map)
        stable.append(shot_map.map)

    shown = range(0, FRAMES, FRAMES // SHOWN)
    def row(images: list[np.ndarray]) -> np.ndarray:
        tiles = [cv2.resize(images[i], TILE, interpolation=cv2.INTER_AREA) for i in shown]
        return np.hstack([np.pad(t, ((2, 2), (2, 2), (0, 0)) if t.ndim == 3 else ((2, 2), (2, 2)), constant_values=255) for t in tiles])

    grey = [cv2.cvtColor((m * 255 + 0.5).astype(np.uint8), cv2.COLOR_GRAY2BGR) for m in per_frame]
    steady = [cv2.cvtColor((m * 255 + 0.5).astype(np.uint8), cv2.COLOR_GRAY2BGR) for m in stable]
    rows = [row(frames), row(grey), row(steady)]
    labels = [
        "frames: a slow pan, exposure +-4%",
        f"output.normalise: frame  (same point changes {100 * change(per_frame):.1f}% a frame)",
        f"output.normalise: stable (same point changes {100 * change(stable):.1f}% a frame)",
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
    print(f"wrote {args.out} ({figure.shape[1]}x{figure.shape[0]}): " + "; ".join(labels[1:]))


if __name__ == "__main__":
    main()
