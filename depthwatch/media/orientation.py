"""A clip's display matrix as the turn between its stored pixels and its picture as players show it.

Why its own module: a phone films on its side and stores the pixels turned,
with a display matrix saying how to show them. A depth model sees a picture
the way it was trained, upright: FastDepth's map of a photograph on its side,
turned back, correlates -0.20 to 0.26 with its map of the photograph upright (five
of scikit-image's). So a clip's frames are turned upright before the model and
the maps are made upright; a depth clip stores its maps turned back, as its
source's pixels are, under the same matrix; an image sequence, with no matrix
to carry, keeps them upright.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import cv2
import numpy as np

_Op = Callable[[np.ndarray], np.ndarray]


def _rotate(code: int) -> _Op:
    return functools.partial(cv2.rotate, rotateCode=code)


def _antitranspose(image: np.ndarray) -> np.ndarray:
    return cv2.rotate(cv2.transpose(image), cv2.ROTATE_180)


#: Each turn: (stored -> shown, shown -> stored).
_TURNS: dict[str, tuple[_Op, _Op]] = {
    "transpose": (cv2.transpose, cv2.transpose),
    "clockwise": (_rotate(cv2.ROTATE_90_CLOCKWISE), _rotate(cv2.ROTATE_90_COUNTERCLOCKWISE)),
    "counterclockwise": (_rotate(cv2.ROTATE_90_COUNTERCLOCKWISE), _rotate(cv2.ROTATE_90_CLOCKWISE)),
    "antitranspose": (_antitranspose, _antitranspose),
    "half": (_rotate(cv2.ROTATE_180), _rotate(cv2.ROTATE_180)),
    "mirror": (functools.partial(cv2.flip, flipCode=1), functools.partial(cv2.flip, flipCode=1)),
    "flip": (functools.partial(cv2.flip, flipCode=0), functools.partial(cv2.flip, flipCode=0)),
}
_QUARTER = ("transpose", "clockwise", "counterclockwise", "antitranspose")


@dataclass(frozen=True)
class Turn:
    """One of FFmpeg's autorotate turns (a quarter or half turn, a flip), both ways."""

    name: str

    def shown(self, image: np.ndarray) -> np.ndarray:
        """Stored pixels as the picture is shown."""
        return _TURNS[self.name][0](image)

    def stored(self, image: np.ndarray) -> np.ndarray:
        """A picture as shown back into the stored pixels' orientation."""
        return _TURNS[self.name][1](image)

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The shown picture's (width, height) for stored pixels of this size."""
        return (height, width) if self.name in _QUARTER else (width, height)

    def aspect(self, sar: Fraction | None) -> Fraction | None:
        """The shown picture's pixel aspect for stored pixels of aspect `sar` (a quarter turn turns it over)."""
        return 1 / sar if self.name in _QUARTER and sar else sar


def turn_for(matrix: tuple[int, ...] | None) -> Turn | None:
    """The turn a display matrix (FFmpeg's layout: 16.16 and 2.30 fixed point) asks for; None: none.

    FFmpeg's own choice (its `autorotate`), for quarter and half turns and
    flips; any other angle is left as stored, as players that only turn by
    quarters leave it.
    """
    if matrix is None or len(matrix) != 9:
        return None
    a, b, _, d, e = (float(v) / 65536 for v in matrix[:5])
    scale_x, scale_y = math.hypot(a, d), math.hypot(b, e)
    if not scale_x or not scale_y:
        return None
    theta = round(math.degrees(math.atan2(b / scale_y, a / scale_x)))
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return Turn("transpose" if matrix[3] > 0 else "clockwise")
    if abs(theta - 270) < 1:
        return Turn("antitranspose" if matrix[3] < 0 else "counterclockwise")
    if abs(theta - 180) < 1:
        flips = (matrix[0] < 0, matrix[4] < 0)
    elif abs(theta) < 1:
        flips = (False, matrix[4] < 0)
    else:
        return None
    return {(True, True): Turn("half"), (True, False): Turn("mirror"), (False, True): Turn("flip")}.get(flips)
