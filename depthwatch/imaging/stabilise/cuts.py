"""The cut tests: whether a frame starts a new shot, live on the frame itself, offline with look-ahead.

Why its own module: the flow and its measures (`motion`) say how well one
frame follows the one before; deciding from them what is a cut is another job,
and the daemon and the planner decide differently (the daemon has no frame
after to compare with, the planner has LOOKAHEAD on each side).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from depthwatch.imaging.stabilise.motion import Motion

#: Offline: frames looked at on each side, and how far a cut's score must stand above theirs.
LOOKAHEAD = 2
STAND_OUT = 2.0
#: Offline: a frame just under the live threshold that stands out this well is a cut too.
BATCH_SCORE = 0.8
#: Offline: a jump cut (the same set-up a moment later: an interview trimmed, a take shortened)
#: keeps the colours and much of the picture, so it scores under a cut; but the flow fails on
#: that one frame far more than on the frames around it, where motion fails it on a run of
#: frames. A frame whose `Motion.failure` is JUMP_FAILURE or more (the planner's own floor:
#: BATCH_JUMP_FAILURE) and JUMP_STAND_OUT times the mean of its LOOKAHEAD neighbours' on each side
#: is a cut. Chosen on real footage (the edits of benchmarks.cuts and the clips of
#: benchmarks.stable, about 6,000 frames): the jumps fail 0.13 or more and stand out 2.6-13x;
#: nothing else failing 0.12 or more stands out over 2.2x (under the floor, frames that hardly fail
#: stand out up to 3.0x). `python -m benchmarks.cuts --jumps` prints where each stands; docs/stable.md,
#: "Cuts". Live a jump is no cut (see `is_new_picture` and JUMP_LIVE).
JUMP_FAILURE = 0.12
JUMP_STAND_OUT = 2.4
#: The planner's own floor: its flow is finer (the thumbnail itself, refined) and fails less, so a
#: jump of benchmarks.cuts' fails only 0.111 there. At 0.10 the planner finds the jumps a coarser flow
#: finds at JUMP_FAILURE, and nothing else failing 0.10 or more stands out over 2.03x (`python -m
#: benchmarks.cuts --jumps`; offline 67 of the 70 cuts of `python -m benchmarks.cuts` are found, the
#: 3 missed jumps on scenes that barely move).
BATCH_JUMP_FAILURE = 0.10
#: Live, with no frame after to compare: a frame (JUMP_FAILURE or more) whose residual and whose
#: failure are both JUMP_LIVE times the median of the shot's last JUMP_HISTORY frames' (at least
#: JUMP_KNOWN of them) jumped (`is_jump`): an edit's jump cut, or an editor scrubbing to another
#: moment. The daemon cannot tell which, so it keeps the shot and its tone curve and only carries
#: nothing of the last map into that frame's (live.Stabiliser.map).
JUMP_LIVE = 4.0
JUMP_HISTORY = 8
JUMP_KNOWN = 4


def is_new_picture(before: np.ndarray, after: np.ndarray, motion: Motion | None) -> bool:
    """The daemon's cut test: the flow cannot explain the frame, or it is another size (another clip).

    Decided on the frame itself. A jump cut is not one here: the daemon cannot tell an edit's jump
    from an editor scrubbing to another moment of the shot, where the shot's tone curve must hold;
    `is_jump` lets the frame keep the shot and carry nothing instead. With no image to compare
    (either thumbnail empty), the shot goes on.
    """
    if motion is None:
        return before.size > 0 and after.size > 0
    return motion.score >= 1.0


def is_jump(motion: Motion, recent: Sequence[tuple[float, float]]) -> bool:
    """Live: the flow fails on this frame far more than it did on the shot's last frames (see JUMP_LIVE).

    `recent`: (residual, failure) of the shot's frames before this one, oldest first.
    """
    recent = recent[-JUMP_HISTORY:]
    if len(recent) < JUMP_KNOWN or motion.failure < JUMP_FAILURE:
        return False
    residual = float(np.median([r for r, _f in recent]))
    failure = float(np.median([f for _r, f in recent]))
    return motion.residual >= JUMP_LIVE * residual and motion.failure >= JUMP_LIVE * failure


def is_cut(motions: Mapping[int, Motion | None], t: int) -> bool:
    """Offline: frame t starts a shot, given the motions of the frames around it (by index; None: no flow).

    A frame the daemon would call a cut (1 or more) is one here too, so a run
    of unrelated stills is a run of cuts. One that nearly is (BATCH_SCORE or
    more) is a cut if it stands out STAND_OUT times above the mean of the
    LOOKAHEAD frames on each side: a cut is one frame the flow cannot explain,
    where fast motion makes several in a row. And a jump cut, whose content
    hardly changes, is one whose flow fails JUMP_STAND_OUT times more than
    its neighbours' (BATCH_JUMP_FAILURE or more).
    """
    motion = motions.get(t)
    if motion is None:
        return False
    s = motion.score
    if s >= 1.0:
        return True
    if s >= BATCH_SCORE and s >= STAND_OUT * _mean_around(motions, t, "score"):
        return True
    failure = motion.failure
    return failure >= BATCH_JUMP_FAILURE and failure >= JUMP_STAND_OUT * _mean_around(motions, t, "failure")


def failure_stand_out(motions: Mapping[int, Motion | None], t: int) -> float:
    """How many times more the flow fails on frame t than on its LOOKAHEAD neighbours each side (what
    JUMP_STAND_OUT is a line on; inf where they do not fail at all, 0 where t has no motion)."""
    motion = motions.get(t)
    if motion is None:
        return 0.0
    mean = _mean_around(motions, t, "failure")
    return motion.failure / mean if mean > 0 else float("inf")


def _mean_around(motions: Mapping[int, Motion | None], t: int, measure_: str) -> float:
    """The mean `score` or `failure` of the LOOKAHEAD frames on each side of t that have a motion (0 if none)."""
    around = [getattr(m, measure_) for i in range(t - LOOKAHEAD, t + LOOKAHEAD + 1) if i != t and (m := motions.get(i)) is not None]
    return float(np.mean(around)) if around else 0.0
