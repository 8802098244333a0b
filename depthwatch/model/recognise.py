"""Which profile a model needs, told from its contents rather than its file name.

A file name proves nothing (FastDepth copied to `depth.onnx`, a stand-in saved
as `model-small.onnx`), and the wrong profile gives a map that looks plausible
but is inverted or badly normalised: the worst failure depthwatch can have. So
with `profile: auto` a model is recognised by, in order:

1. its sha256, where a known size matches (the catalogue's checksums, and
   FastDepth's from shared/models/PROVENANCE.md): exact, and cheap because only
   a file of a known size is hashed;
2. its graph's signature (input type, layout and fixed size, output layout),
   read from the session the engine has just made, so the model is loaded once.
   A name (catalogue entry or known file name) may pick between profiles whose
   signature fits; it never overrides the graph.

Anything else is refused in one line naming the profiles to choose from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from depthwatch.errors import ModelError
from depthwatch.files import sha256_of
from depthwatch.model.contract import NCHW, NHWC, Contract
from depthwatch.model.profiles import PROFILES, Profile

log = logging.getLogger("depthwatch")


@dataclass(frozen=True)
class Signature:
    """What a profile's models look like from outside."""

    dtype: type
    layout: str
    #: Fixed input sides (height = width) its exports use; None in the tuple: a dynamic-size export.
    sides: tuple[int | None, ...]
    #: Output layouts: "1HW", "11HW" or "1HW1".
    outputs: tuple[str, ...]


_FLOAT_MAP = ("1HW", "11HW")

SIGNATURES: dict[str, Signature] = {
    "midas-v21-small": Signature(np.float32, NCHW, (256, None), _FLOAT_MAP),
    "midas-v21-large": Signature(np.float32, NCHW, (384, None), _FLOAT_MAP),
    "dpt-hybrid": Signature(np.float32, NCHW, (384, None), _FLOAT_MAP),
    "dpt-large": Signature(np.float32, NCHW, (384, None), _FLOAT_MAP),
    "depth-anything-v2-small": Signature(np.float32, NCHW, (518, None), _FLOAT_MAP),
    "fastdepth-nyu": Signature(np.uint8, NHWC, (224,), ("1HW1",)),
}

#: (size in bytes, sha256) of model files known exactly, beside the catalogue's.
KNOWN_FILES: dict[tuple[int, str], str] = {
    # shared/models/fastdepth_224_nyu_int8.onnx (PROVENANCE.md)
    (1_565_382, "44a4ff9950ff014ed0237402a5775e5a36ca1ae4cddb01335b01eb793c078f65"): "fastdepth-nyu",
}


def output_layout(shape: tuple[object, ...]) -> str | None:
    if len(shape) == 3:
        return "1HW"
    if len(shape) == 4 and shape[1] == 1:
        return "11HW"
    if len(shape) == 4 and shape[3] == 1:
        return "1HW1"
    return None


def fits(contract: Contract) -> list[str]:
    """The profiles whose signature this graph fits."""
    side = contract.height if contract.height == contract.width else -1
    layout = output_layout(contract.output_shape)
    return [
        name
        for name, sig in SIGNATURES.items()
        if np.dtype(sig.dtype) == np.dtype(contract.input_dtype)
        and sig.layout == contract.layout
        and side in sig.sides
        and layout in sig.outputs
    ]


def by_checksum(path: Path, known: Iterable[tuple[int | None, str | None, str]] = ()) -> str | None:
    """The profile of a file known by (size, sha256), or None; hashes only files of a known size.

    `known` adds (size, sha256, profile) triples, the catalogue's; an entry with a
    checksum but no size is hashed whatever the file's size.
    """
    table = [(size, digest, profile) for (size, digest), profile in KNOWN_FILES.items()]
    table += [(size, digest, profile) for size, digest, profile in known if digest]
    try:
        size = path.stat().st_size
    except OSError:
        return None
    candidates = [(digest, profile) for s, digest, profile in table if s is None or s == size]
    if not candidates:
        return None
    try:
        digest = sha256_of(path)
    except OSError:
        return None  # unreadable: loading it says why, in the words a model error uses
    return next((profile for d, profile in candidates if d == digest), None)


@dataclass(frozen=True)
class ProfileChoice:
    """A profile left for the engine to choose once it has read the graph.

    `hint` is what the name says (catalogue entry or known file name), used only
    among the profiles the graph fits; `overrides` are the config's explicit
    settings, applied to whichever profile is chosen.
    """

    file: str
    hint: str | None = None
    overrides: tuple[tuple[str, object], ...] = ()

    def choose(self, contract: Contract) -> Profile:
        """The profile for this graph; ModelError (exit 78) if the graph does not say."""
        fitting = fits(contract)
        if self.hint in fitting:
            name, how = self.hint, "its file name and graph"
        elif len(fitting) == 1 and contract.fixed_size is not None:
            name, how = fitting[0], "its graph"
        else:
            raise refusal(self.file, contract, fitting)
        if self.hint is not None and name != self.hint:
            log.warning("%s is named like a %s model but its graph is %s's; running it as %s", self.file, self.hint, name, name)
        log.info("%s: profile %s, recognised by %s", self.file, name, how)
        return PROFILES[name].with_overrides(**dict(self.overrides))


def refusal(file: str, contract: Contract, fitting: list[str]) -> ModelError:
    known = ", ".join(sorted(PROFILES))
    if fitting:
        what = f"its graph ({contract.describe()}) fits {', '.join(fitting)}"
    else:
        what = f"its graph ({contract.describe()}) is not one depthwatch knows"
    return ModelError(
        f"cannot tell which profile model {file} needs: {what}; "
        f"name one with --profile NAME or model.profile ({known}); a guess could invert the map"
    )
