"""What a model's graph cannot say about itself: size, normalisation, meaning.

The graph tells the input name, type and layout (see `contract`); a profile
supplies the input size for dynamic models, the resize rule, the normalisation
done outside the graph, and whether larger outputs mean nearer (inverse depth:
MiDaS, DPT, Depth Anything) or farther (metric depth: FastDepth).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthwatch.errors import ConfigError

INVERSE_DEPTH = "inverse_depth"
DEPTH = "depth"

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Profile:
    """Pre- and post-processing rules for one family of depth models.

    Float inputs get `(rgb / 255 - mean) / std`; uint8 inputs get raw RGB
    (quantised models carry their own input scale).
    """

    name: str
    #: Side length for dynamic-size inputs (the shorter side when keep_aspect).
    input_size: int | None = None
    #: Dynamic sizes are rounded to a multiple of this (32 for MiDaS/DPT, 14 for ViT-14).
    multiple_of: int = 32
    #: Dynamic inputs keep the frame's aspect ratio; fixed inputs are always stretched.
    keep_aspect: bool = True
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    #: What the model's output means: inverse_depth (larger = nearer) or depth (larger = farther);
    #: the config's `model.output`.
    predicts: str = INVERSE_DEPTH
    #: File names by which `auto` recognises this profile.
    files: tuple[str, ...] = ()

    def with_overrides(self, **overrides: Any) -> Profile:
        """This profile with explicit config settings applied (None = keep)."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        for key in ("mean", "std"):
            if key in changes:
                changes[key] = tuple(float(x) for x in changes[key])
        return dataclasses.replace(self, **changes)


#: What the DPT models (hybrid and large) share.
_DPT: dict[str, Any] = {"input_size": 384, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        # Official MiDaS v2.1 ONNX exports: RGB in [0, 1], normalisation inside the graph.
        Profile("midas-v21-small", input_size=256, files=("model-small.onnx",)),
        Profile("midas-v21-large", input_size=384, files=("model-f6b98070.onnx",)),
        # DPT (MiDaS v3): mean 0.5 / std 0.5 outside the graph.
        Profile("dpt-hybrid", **_DPT, files=("dpt_hybrid-midas-501f0c75.onnx", "dpt_hybrid_384.onnx")),
        Profile("dpt-large", **_DPT, files=("dpt_large-midas-2f21e586.onnx", "dpt_large_384.onnx")),
        # Depth Anything V2: ImageNet mean/std outside the graph, ViT patch 14.
        Profile(
            "depth-anything-v2-small",
            input_size=518,
            multiple_of=14,
            mean=_IMAGENET_MEAN,
            std=_IMAGENET_STD,
            files=("depth_anything_v2_vits.onnx", "depth_anything_v2_small.onnx"),
        ),
        # The small real model in shared/models: uint8 NHWC in, metres out.
        Profile(
            "fastdepth-nyu",
            input_size=224,
            predicts=DEPTH,
            files=("fastdepth_224_nyu_int8.onnx",),
        ),
    )
}

#: Used for an unknown file with `profile: auto`: the MiDaS conventions.
GENERIC = Profile("generic", input_size=384)


def profile_for(name: str, model_path: Path | None = None) -> Profile:
    """The profile called `name`, or for `auto` the one that knows the model's file name."""
    if name == "auto":
        file_name = model_path.name if model_path else ""
        for profile in PROFILES.values():
            if file_name in profile.files:
                return profile
        return GENERIC
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ConfigError(f"unknown model profile {name!r}; use auto or one of: {known}") from None
