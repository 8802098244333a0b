"""The errors depthwatch reports to people, each carrying a one-line message.

The CLI turns these into one line on stderr and an exit code; the daemon turns
`FrameError` into one log line and carries on. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

#: sysexits.h EX_CONFIG: a restart cannot fix this (bad config, missing model),
#: so launchd/systemd are told not to spin on it.
EX_CONFIG = 78


class DepthwatchError(Exception):
    """An error whose message is one line a user can act on."""

    exit_code = 1


class ConfigError(DepthwatchError):
    """The configuration cannot be used as written."""

    exit_code = EX_CONFIG


class ModelError(DepthwatchError):
    """The model file is missing, unreadable or not a usable depth model."""

    exit_code = EX_CONFIG


class InputError(DepthwatchError):
    """A file or folder named on the command line is not there (sysexits EX_NOINPUT)."""

    exit_code = 66


class FrameError(DepthwatchError):
    """One input frame cannot be turned into a depth map; the others can."""


class BadPrediction(FrameError):
    """The model ran but its prediction is no depth map (NaN or infinite values, or one value everywhere).

    An fp16 overflow on a GPU provider gives NaN everywhere, a broken export
    a constant: either would be a black map logged as a success.
    """


class InferenceFailed(FrameError):
    """The model's run raised for this frame (a wedged provider, a graph that fails on every input).

    One such frame may be the frame's fault; several in a row are the model's, and
    the status says so (as for `BadPrediction`): else a model that fails every
    frame leaves `/health` saying all is well.
    """


class RunGivenUp(InferenceFailed):
    """The model ran on a frame past the stall bound and the run was given up: the model's fault, not the frame's."""


class Superseded(FrameError):
    """The frame changed or vanished after it was found: nothing to do for this version.

    A newer version, if any, has an event of its own; this is no failure.
    """


class Vanished(Superseded):
    """The frame (or its folder) was deleted or moved away before it could be read: there is no newer
    version, so it is said as such (one line naming it), not summed up with the frames replaced."""


class Stopped(Superseded):
    """The daemon's stop, out of time, dropped the frame before its map was made: the next start maps it.
    No newer version either: not counted with the frames replaced."""


class OutputError(DepthwatchError):
    """A depth map could not be written; `retryable` when the cause may clear (full disk, permissions)."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ModelChanged(Exception):
    """A tensor was prepared for a model that has since been swapped out."""


class OwnOutput(Superseded):
    """The file is a depth map depthwatch wrote (it carries its record): never taken as input."""


#: sysexits.h EX_UNAVAILABLE: a service depthwatch needs (the farm's scheduler) cannot be reached.
EX_UNAVAILABLE = 69
#: sysexits.h EX_SOFTWARE: depthwatch's own fault (its inference thread died); a restart may help.
EX_SOFTWARE = 70
#: sysexits.h EX_TEMPFAIL: another daemon watches the same folder. The condition clears by itself
#: once the other daemon stops, so a service manager retrying later is right (78, EX_CONFIG, would
#: tell systemd never to retry, though nothing in the config is wrong).
EX_TEMPFAIL = 75


class FarmError(DepthwatchError):
    """The render farm cannot be used: no scheduler at the address, or the farm extra is missing."""

    exit_code = EX_UNAVAILABLE
