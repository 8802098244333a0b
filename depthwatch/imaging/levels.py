"""Levels, as in a grading tool: which nearness is white, which is black, and the curve between.

The map coming in is the normalised nearness, [0, 1] with 1 = nearest. Then:

    v = clip((m - far) / (near - far), 0, 1) ** (1 / gamma)      and 1 - v if inverted

`near` and `far` are levels of that map: a plain number is a fraction of the
normalised range (`near: 0.8` makes the nearest fifth of the range white), a
string like `"80%"` a percentile of this frame's map (`near: "80%"` makes the
nearest 20 % of the pixels white). `gamma` above 1 lifts the midtones, as in
Photoshop's or Resolve's levels. `invert` swaps black and white last, so
near/far keep meaning near/far. Defaults (near 1, far 0, gamma 1, no invert)
leave the map exactly as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Level:
    """A level of the nearness map: a fraction of its range, or a percentile of its pixels."""

    value: float
    percentile: bool = False

    def resolve(self, reference: np.ndarray) -> float:
        """The level as a nearness in [0, 1] for a frame whose map is `reference`."""
        if self.percentile:
            return float(np.percentile(reference, self.value))
        return self.value

    @property
    def setting(self) -> float | str:
        """As written in the config: 0.8 or '80%'."""
        return f"{self.value:g}%" if self.percentile else self.value


def parse_level(value: Any) -> Level:
    """A config value (0.8, 1, '80%', '12.5%') as a Level; ValueError says what is accepted."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1])
        except ValueError:
            raise ValueError(f"must be a fraction 0..1 or a percentile like '80%', not {value!r}") from None
        if not 0.0 <= number <= 100.0:
            raise ValueError(f"must be a percentile between 0% and 100%, not {value!r}")
        return Level(number, percentile=True)
    if isinstance(value, str):  # "0.8" from a command line
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"must be a fraction 0..1 or a percentile like '80%', not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a fraction 0..1 or a percentile like '80%', not {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be a fraction between 0 and 1 (or a percentile like '80%'), not {value:g}")
    return Level(float(value))


@dataclass(frozen=True)
class Levels:
    near: Level = Level(1.0)
    far: Level = Level(0.0)
    gamma: float = 1.0
    invert: bool = False

    @property
    def is_identity(self) -> bool:
        return self == Levels()


def apply(m: np.ndarray, levels: Levels, reference: np.ndarray | None = None) -> np.ndarray:
    """Levels on a float32 nearness map; percentiles are taken over `reference` (default `m`).

    Returns a new float32 array in [0, 1]; the identity returns `m` itself.
    Near and far that meet or cross (a fraction and a percentile of a nearly
    flat map) make a hard threshold rather than a division by zero.
    """
    if levels.is_identity:
        return m
    if levels == Levels(invert=True):
        return np.float32(1.0) - m
    ref = m if reference is None else reference
    near, far = levels.near.resolve(ref), levels.far.resolve(ref)
    span = max(near - far, 1e-6)
    v = (m - np.float32(far)) * np.float32(1 / span)
    np.clip(v, 0.0, 1.0, out=v)
    if levels.gamma != 1.0:
        np.power(v, np.float32(1 / levels.gamma), out=v)
    if levels.invert:
        np.subtract(np.float32(1.0), v, out=v)
    return v
