"""`depthwatch check`: is this config usable? Validate it, load the model, run one frame."""

from __future__ import annotations

import argparse

import numpy as np

from depthwatch.commands.common import add_config_arguments, config_from_args

HELP = "check the config and the model: load it, show its providers and I/O, run one synthetic frame"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def main(args: argparse.Namespace) -> int:
    import cv2

    from depthwatch import catalogue, imaging
    from depthwatch.config import check_combinations
    from depthwatch.engine import Engine
    from depthwatch.pipeline import Settings

    config = config_from_args(args)
    check_combinations(config)
    print(f"config:    {config.source or 'built-in defaults'}")
    for folder in config.watch.folders:
        state = "ok" if folder.is_dir() else "missing (created at start if its parent exists)"
        print(f"watch:     {folder} [{state}]")
    spec = catalogue.resolve(config.model, config.base)
    with Engine(spec) as engine:
        info = engine.wait_ready()
        print(f"model:     {spec.path} (profile {info.profile.name}, loaded in {info.load_seconds:.2f} s)")
        print(f"providers: {', '.join(info.providers)}")
        print(f"contract:  {info.contract.describe()}")
        # A synthetic 1080p frame through the same steps as a real one.
        frame = np.zeros((1080, 1920, 3), np.uint8)
        frame[:, :, :] = np.linspace(0, 255, 1920, dtype=np.uint8)[None, :, None]
        data = cv2.imencode(".jpg", frame)[1].tobytes()
        settings = Settings.from_config(config)
        decoded = imaging.decode(data, max_pixels=settings.max_pixels, min_size=(info.contract.width or 512, info.contract.height or 512))
        inference = engine.infer(imaging.prepare(decoded, info.contract, info.profile), info.generation).result()
        nearness = imaging.normalise(inference.prediction, info.profile.output, settings.render)
        depth = imaging.render(nearness, decoded.size, settings.render, guide=decoded.image)
        encoded = imaging.encode(depth, ".jpg", jpeg_quality=settings.jpeg_quality)
        print(f"frame:     1920x1080 synthetic frame -> {len(encoded)} byte depth map, inference {inference.seconds * 1000:.1f} ms")
    print("ok")
    return 0
