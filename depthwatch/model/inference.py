"""What the engine takes and gives back: the session factory, the queue's priorities, a prediction with its model.

Kept apart from the engine so that what a caller hands the inference thread,
and what comes back, read in one short module (`engine` names them too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from depthwatch.model.sessions import Session
from depthwatch.model.spec import ModelInfo

#: Called as onnxruntime.InferenceSession is: (path, sess_options=..., providers=[(name, options), ...]).
SessionFactory = Callable[..., Session]

#: Queue priorities: lower runs first. A live frame (an editor waiting on it), a model
#: load and the HTTP API's images go before the frames of a clip job, which only
#: fill the time the live frames leave.
LIVE = 0
BACKGROUND = 1


@dataclass(frozen=True)
class Inference:
    """A prediction as [H, W] floats, the seconds `session.run` took, and the model that made it.

    The model travels with the prediction because a swap may finish before the
    prediction is rendered: its profile (depth or inverse depth) must be the one
    that produced it, or the map comes out inverted.
    """

    prediction: np.ndarray
    seconds: float
    model: ModelInfo

    @property
    def generation(self) -> int:
        return self.model.generation
