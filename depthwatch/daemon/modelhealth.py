"""The model's health as its results show it: several unusable predictions in a row are the model's fault.

A prediction that is no depth map (NaN, a constant), or a run that raised, is
never held against the frame; frame after frame, it is held against the
model: a health error in the status (and `/health` answers 503) until a map
comes out right or another model serves.
"""

from __future__ import annotations

import logging

from depthwatch.daemon.reporting import StatusReport
from depthwatch.frames.result import Result

log = logging.getLogger("depthwatch")

#: Unusable predictions in a row (NaN, a constant) after which the status shows a health error.
BAD_PREDICTIONS_UNHEALTHY = 5


class ModelHealth:
    """The run of unusable predictions since the last good map, and the health error it sets in `report`'s status."""

    def __init__(self, report: StatusReport) -> None:
        self._report = report
        self._status = report.status
        self._lock = report.lock
        #: Unusable predictions since the last good map (see BAD_PREDICTIONS_UNHEALTHY).
        self._bad_predictions = 0

    def judge(self, result: Result) -> None:
        """Several unusable predictions in a row are the model's fault, not the frames': say so in the status."""
        if result.superseded:
            return
        status = self._status
        with self._lock:
            if result.ok:
                if status.health_error is not None:
                    log.info("the model's predictions are usable again; health error cleared")
                self._bad_predictions = 0
                status.health_error = None
                return
            if not result.bad_prediction:
                return
            self._bad_predictions += 1
            count = self._bad_predictions
            if count < BAD_PREDICTIONS_UNHEALTHY:
                return
            first = status.health_error is None
            status.health_error = (
                f"the model's last {count} predictions were unusable ({result.error}); "
                "check the model file and model.providers (try providers: [cpu])"
            )
        if first:
            log.error("%s", status.health_error)

    def model_changed(self) -> None:
        """Another model serves: the last one's failures say nothing of it (main thread)."""
        with self._lock:
            self._bad_predictions = 0
            cleared, self._status.health_error = self._status.health_error, None
        if cleared is not None:
            log.info("another model is in service; the health error of the last one is cleared")
            self._report.touch()
