"""From the config's `model` setting to a model file and the profile to run it with.

`model.path` is either a catalogue name (a known model living in the user's
model folder, fetched with `depthwatch models fetch NAME`) or a path to any
.onnx file. The daemon never downloads: a missing model is a one-line error
naming the command that fetches it.
"""

from __future__ import annotations

from pathlib import Path

from depthwatch.config import ModelConfig, expand_path
from depthwatch.engine import ModelSpec
from depthwatch.errors import ConfigError, ModelError
from depthwatch.profiles import PROFILES, profile_for


def is_catalogue_name(value: str) -> bool:
    return "/" not in value and "\\" not in value and not value.lower().endswith(".onnx") and not value.startswith(("~", "."))


def model_file(name: str, models_dir: Path) -> Path:
    """Where the catalogue model `name` lives once fetched."""
    profile = PROFILES.get(name)
    if profile is None or not profile.files:
        known = ", ".join(sorted(p.name for p in PROFILES.values() if p.files))
        raise ConfigError(f"unknown model {name!r}; use a path to an .onnx file or one of: {known}")
    return models_dir / profile.files[0]


def resolve(model: ModelConfig, base: Path) -> ModelSpec:
    """The ModelSpec for a config's model section; ModelError if the file is not there."""
    if is_catalogue_name(model.path):
        path = model_file(model.path, model.models_folder())
        if not path.is_file():
            raise ModelError(
                f"model {model.path!r} is not installed ({path} is missing); "
                f"fetch it with `depthwatch models fetch {model.path}` or set model.path to an .onnx file"
            )
        profile_name = model.path if model.profile == "auto" else model.profile
    else:
        path = expand_path(model.path, base)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist; check model.path (or --model)")
        profile_name = model.profile
    profile = profile_for(profile_name, path).with_overrides(
        input_size=model.input_size,
        multiple_of=model.multiple_of,
        mean=model.mean,
        std=model.std,
        output=model.output,
    )
    return ModelSpec(
        path=path,
        profile=profile,
        providers=model.providers,
        intra_op_threads=model.intra_op_threads,
        coreml_cache=model.coreml_cache,
    )
