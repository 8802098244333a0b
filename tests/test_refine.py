"""Edge-aware upsampling: depth edges land on the objects, and nothing is invented elsewhere."""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime
import pytest
from conftest import jpeg_bytes
from scipy.stats import spearmanr
from skimage import data

from depthwatch.frames.job import Job
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.imaging import codec, normalise, refine, render
from depthwatch.imaging.render import RenderOptions
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import DEPTH, PROFILES
from depthwatch.model.spec import ModelSpec

LIMIT = 100_000_000
PROFILE = PROFILES["fastdepth-nyu"]


@pytest.fixture(scope="module")
def session(request):
    from conftest import FASTDEPTH

    if not FASTDEPTH.is_file():
        pytest.skip(f"the real model {FASTDEPTH} is not here")
    return onnxruntime.InferenceSession(str(FASTDEPTH), providers=["CPUExecutionProvider"])


def model_nearness(session, decoded: codec.Decoded) -> np.ndarray:
    """The normalised map ([0, 1], 1 = nearest) the pipeline makes from this decoded frame."""
    x = cv2.cvtColor(cv2.resize(decoded.image, (224, 224), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)[None]
    depth = session.run(None, {session.get_inputs()[0].name: x})[0][0, :, :, 0]
    return normalise.frame(depth, DEPTH)


def both_maps(session, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(refined, plain) float maps at the frame's size, from the frame as a 1080p-style JPEG would come."""
    decoded = codec.decode(jpeg_bytes(frame), max_pixels=LIMIT, min_size=(224, 224))
    n = model_nearness(session, decoded)
    edges = render.render(n, decoded.size, RenderOptions(bits=32, refine="edges"), guide=decoded.image)
    plain = render.render(n, decoded.size, RenderOptions(bits=32, refine="none"), guide=decoded.image)
    return edges, plain


# -- the acceptance figures: the Middlebury motorcycle at twice the photo's size ---------------


def gradient_energy_ratio(depth: np.ndarray, edges: np.ndarray, rest: np.ndarray) -> float:
    """Mean squared gradient at ground-truth depth edges over the same elsewhere."""
    dy, dx = np.gradient(depth.astype(np.float64))
    energy = dx * dx + dy * dy
    return float(energy[edges].mean() / energy[rest].mean())


@pytest.mark.parametrize("kind", ["jpg", "png"])  # a JPEG decodes at 1/4 scale here, a PNG in full
def test_refined_edges_sit_on_the_ground_truth_edges_and_stay_as_accurate(tmp_path, fastdepth, kind):
    left, _, disparity = data.stereo_motorcycle()
    h, w = left.shape[:2]
    size = (2 * w, 2 * h)  # 1482x1000: the model sees 224 px of it
    frame = cv2.resize(left[:, :, ::-1], size, interpolation=cv2.INTER_CUBIC)
    source = tmp_path / f"motorcycle.{kind}"
    source.write_bytes(jpeg_bytes(frame) if kind == "jpg" else cv2.imencode(".png", frame)[1].tobytes())

    truth = cv2.resize(disparity.astype(np.float32), size, interpolation=cv2.INTER_NEAREST)
    valid = np.isfinite(truth) & (truth > 0)
    inner = cv2.erode(valid.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    gy, gx = np.gradient(np.where(valid, truth, 0.0))
    jumps = (np.hypot(gx, gy) > 2.0) & inner  # disparity steps of more than 2 px per pixel
    at_edges = cv2.dilate(jumps.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool) & inner
    elsewhere = inner & ~at_edges
    assert 0.002 < at_edges.mean() < 0.05  # a thin band along the outlines

    spec = ModelSpec(path=fastdepth, profile=PROFILE, providers=("cpu",))
    maps = {}
    with Engine(spec) as engine:
        pipeline = Pipeline(engine)
        for refine_mode in ("edges", "none"):
            settings = Settings(render=RenderOptions(refine=refine_mode))
            out = tmp_path / f"depth-{refine_mode}.png"
            result = pipeline.process(Job(source, out), settings)
            assert result.ok, result.error
            maps[refine_mode] = cv2.imread(str(out), cv2.IMREAD_UNCHANGED).astype(np.float64) / 65535
        pipeline.close()
    assert maps["edges"].shape == maps["none"].shape == truth.shape

    session = onnxruntime.InferenceSession(str(fastdepth), providers=["CPUExecutionProvider"])
    x = cv2.resize(frame[:, :, ::-1], (224, 224), interpolation=cv2.INTER_AREA)[None]
    bare = -cv2.resize(session.run(["depth"], {"image": x})[0][0, :, :, 0], size, interpolation=cv2.INTER_LINEAR)

    def spearman(depth: np.ndarray) -> float:
        return float(spearmanr(depth[valid][::7], truth[valid][::7]).statistic)

    sharpness = gradient_energy_ratio(maps["edges"], at_edges, elsewhere) / gradient_energy_ratio(
        maps["none"], at_edges, elsewhere
    )
    rho = {name: spearman(m) for name, m in (("edges", maps["edges"]), ("none", maps["none"]), ("bare", bare))}
    print(
        f"{kind}: edge gradient energy (edges/elsewhere): refined {sharpness:.2f}x the plain upscale's; "
        f"spearman: refined {rho['edges']:.4f}, plain {rho['none']:.4f}, bare model {rho['bare']:.4f}"
    )
    assert rho["bare"] > 0.7  # the model's own quality, as its PROVENANCE says
    assert sharpness >= 1.2, sharpness
    assert rho["edges"] >= rho["bare"] - 0.01, rho


# -- faithful: the same map, only sharper ---------------------------------------------------


@pytest.mark.parametrize("photo", ["astronaut", "coffee", "chelsea", "rocket"])
def test_refined_map_stays_the_plain_upscale_on_real_photos(session, photo):
    image = getattr(data, photo)()[:, :, ::-1]
    frame = cv2.resize(image, (1920, 1080), interpolation=cv2.INTER_CUBIC)
    edges, plain = both_maps(session, frame)
    assert edges.shape == plain.shape == (1080, 1920)
    assert edges.dtype == np.float32 and 0.0 <= edges.min() and edges.max() <= 1.0
    r = float(np.corrcoef(edges.ravel(), plain.ravel())[0, 1])
    print(f"{photo}: correlation refined vs plain {r:.4f}")
    assert r >= 0.97
    assert not np.array_equal(edges, plain)  # it did refine


def test_flat_depth_on_a_textured_photo_stays_flat():
    """A flat prediction has no edges to move: the texture of the photo must not leak in."""
    frame = cv2.resize(data.astronaut()[:, :, ::-1], (1920, 1080), interpolation=cv2.INTER_CUBIC)
    decoded = codec.decode(jpeg_bytes(frame), max_pixels=LIMIT, min_size=(224, 224))
    flat = np.full((224, 224), 0.6, np.float32)
    out = render.render(flat, decoded.size, RenderOptions(bits=32, refine="edges"), guide=decoded.image)
    assert np.abs(out - 0.6).max() < 1e-4


def test_smooth_depth_on_a_textured_photo_gets_no_edges():
    """A smooth slope (a floor, a wall at an angle) stays a slope: no texture copied into it."""
    frame = cv2.resize(data.astronaut()[:, :, ::-1], (1920, 1080), interpolation=cv2.INTER_CUBIC)
    decoded = codec.decode(jpeg_bytes(frame), max_pixels=LIMIT, min_size=(224, 224))
    slope = np.repeat(np.linspace(0, 1, 224, dtype=np.float32)[:, None], 224, axis=1)
    edges = render.render(slope, decoded.size, RenderOptions(bits=32, refine="edges"), guide=decoded.image)
    plain = render.render(slope, decoded.size, RenderOptions(bits=32, refine="none"), guide=decoded.image)
    deviation = np.abs(edges - plain)
    print(f"slope: largest deviation {deviation.max():.4f}, mean {deviation.mean():.5f}")
    assert deviation.max() < 0.03 and deviation.mean() < 0.003


def test_refine_guides_at_the_decoded_scale_without_a_full_decode():
    """A 1080p JPEG decodes at 1/4 for a 224-px model; the refined map comes back at that scale."""
    frame = cv2.resize(data.astronaut()[:, :, ::-1], (1920, 1080), interpolation=cv2.INTER_CUBIC)
    decoded = codec.decode(jpeg_bytes(frame), max_pixels=LIMIT, min_size=(224, 224))
    assert decoded.image.shape == (270, 480, 3)
    n = np.random.default_rng(0).random((224, 224)).astype(np.float32)
    assert refine.edges(n, decoded.image).shape == (270, 480)
    # A full-size guide (a PNG frame) is reduced by a whole factor towards twice the prediction's size.
    assert refine.edges(n, frame).shape == (540, 960)


def test_refine_none_is_todays_plain_upscale_exactly():
    rng = np.random.default_rng(2)
    n = cv2.GaussianBlur(rng.random((224, 224)).astype(np.float32), (0, 0), 4)
    n = (n - n.min()) / (n.max() - n.min())
    guide = np.zeros((270, 480, 3), np.uint8)
    out = render.render(n, (1920, 1080), RenderOptions(bits=8, refine="none"), guide=guide)
    today = cv2.resize((n * 255 + 0.5).astype(np.uint8), (1920, 1080), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(out, today)
