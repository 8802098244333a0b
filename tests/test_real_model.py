"""The real FastDepth model on real photographs: plausible depth, same result from every path."""

from __future__ import annotations

import subprocess
import sys

import cv2
import numpy as np
import onnxruntime
import pytest
from scipy.stats import spearmanr
from skimage import data

from depthwatch.frames.job import Job
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec


@pytest.fixture(scope="module")
def motorcycle():
    left, _, disparity = data.stereo_motorcycle()
    return left, disparity


def bare_model_nearness(model, rgb: np.ndarray) -> np.ndarray:
    """What the model alone says, the way its PROVENANCE describes: negated depth."""
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = cv2.resize(rgb, (224, 224), interpolation=cv2.INTER_AREA)[None]
    depth = session.run(["depth"], {"image": x})[0][0, :, :, 0]
    return -cv2.resize(depth, (rgb.shape[1], rgb.shape[0]), interpolation=cv2.INTER_LINEAR)


def rank_correlation(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> float:
    return float(spearmanr(a[valid][::7], b[valid][::7]).statistic)


def test_depth_map_is_plausible_and_as_good_as_the_bare_model(tmp_path, fastdepth, motorcycle):
    left, disparity = motorcycle
    source = tmp_path / "motorcycle.png"
    cv2.imwrite(str(source), left[:, :, ::-1])
    spec = ModelSpec(path=fastdepth, profile=PROFILES["fastdepth-nyu"], providers=("cpu",))
    with Engine(spec) as engine:
        pipeline = Pipeline(engine)
        result = pipeline.process(Job(source, tmp_path / "depth.png"), Settings())
        pipeline.close()
    assert result.ok, result.error
    ours = cv2.imread(str(tmp_path / "depth.png"), cv2.IMREAD_UNCHANGED).astype(np.float64)
    assert ours.shape == disparity.shape  # pixel for pixel with the frame

    valid = np.isfinite(disparity) & (disparity > 0)
    near = valid & (disparity >= np.percentile(disparity[valid], 90))
    far = valid & (disparity <= np.percentile(disparity[valid], 10))
    assert ours[near].mean() > ours[far].mean() + 0.2 * 65535  # white = near, clearly

    bare = rank_correlation(bare_model_nearness(fastdepth, left), disparity, valid)
    mine = rank_correlation(ours, disparity, valid)
    assert bare > 0.7  # the model's own quality, as measured in its PROVENANCE
    print(f"spearman: depthwatch {mine:.3f}, bare model {bare:.3f}")
    assert mine > bare - 0.03, (mine, bare)


def test_once_gives_the_same_map_as_the_engine(tmp_path, fastdepth):
    frame = cv2.resize(data.astronaut()[:, :, ::-1], (1280, 720))
    source = tmp_path / "astronaut.jpg"
    cv2.imwrite(str(source), frame, [cv2.IMWRITE_JPEG_QUALITY, 92])
    spec = ModelSpec(path=fastdepth, profile=PROFILES["fastdepth-nyu"], providers=("cpu",))
    with Engine(spec) as engine:
        pipeline = Pipeline(engine)
        assert pipeline.process(Job(source, tmp_path / "direct.png"), Settings()).ok
        pipeline.close()
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(source), "-o", str(tmp_path / "cli.png"), "--model", str(fastdepth)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    direct = cv2.imread(str(tmp_path / "direct.png"), cv2.IMREAD_UNCHANGED).astype(np.int64)
    cli = cv2.imread(str(tmp_path / "cli.png"), cv2.IMREAD_UNCHANGED).astype(np.int64)
    assert cli.shape == direct.shape == (720, 1280)
    assert np.abs(cli - direct).max() <= 257  # one 8-bit step at most (thread scheduling in the int8 kernels)
    # Near (the astronaut, lower left) brighter than far (the background, upper right).
    assert direct[400:700, 100:500].mean() > direct[0:200, 900:1250].mean()
