"""Shot-stable normalisation: the same scene point keeps its grey from one map to the next.

Why: MiDaS-family models predict inverse depth only up to an unknown scale and
shift per frame, and a metric model (FastDepth) drifts in scale too; min-max
normalising each map on its own makes the grey of a wall jump whenever
something near or far enters or leaves the frame, and an effect driven by the
map pumps. So each prediction is *aligned* to the shot so far, pulled towards
the previous map where the two agree, and mapped to grey with a range that
belongs to the shot, not to the frame.

How, for each frame after a shot's first (the same steps live and offline):

1. Motion (`motion.measure`): OpenCV's DIS optical flow between the previous frame's
   grey thumbnail (THUMB_WIDTH wide, the frame's own aspect) and this one's,
   forward and backward. A pixel whose flow comes back to where it started
   (`consistent`) is a scene point seen in both frames; the rest is occluded,
   coming into view, or moving too fast to follow. Down to the thumbnail itself
   (`motion.FLOW_SCALE`), so what moves on a few of its pixels (leaves, a hand) is
   seen: live with the fast preset (`motion.LIVE_PRESET`) and without its
   variational refinement (`motion.LIVE_REFINEMENT`); offline with the medium
   preset (`motion.BATCH_PRESET`), refined. The stabiliser costs about 5 ms a
   1080p frame live and 12 ms offline (`python -m benchmarks.stable`).
2. Cut (`motion.Motion.score`): a bad alignment alone is not a cut. A cut is a frame
   that the flow cannot explain (most pixels inconsistent, and the previous
   frame warped by the flow leaves a large photometric residual) AND whose
   content changed (the mean HSV change, as PySceneDetect's ContentDetector
   measures it). Fast motion, parallax and people walking through keep most
   pixels consistent, or leave a small residual; only a new picture fails all three.
   A punch-in (a closer take of the same moment) passes them, since the flow explains
   it as a zoom: the camera's fitted scale jumping by 1.2x in one frame is a cut too
   (`motion.ZOOM_CUT`; a camera zooms far slower). Live, a frame that may be a cut is
   judged on a coarser flow first (`motion.CUT_PRESET`): a cut needs none to follow.
   Live (the daemon) decides on the frame itself; offline, where the frames
   after are known, a frame that nearly scores as a cut is one if it stands
   out from its neighbours (a burst of fast motion does not), and so is a jump
   cut (the same set-up a moment later, its colours kept), where the flow fails
   on that one frame far more than on the frames around it (`cuts.JUMP_STAND_OUT`).
   The daemon cannot tell a jump from an editor scrubbing, so there a frame the
   flow jumped to (`cuts.is_jump`: failing far more than the shot's last frames)
   keeps the shot and its tone curve and carries nothing of the last map.
3. Alignment (`alignment.follow`): the previous map, in the shot's units, is warped by
   the flow onto this frame; this prediction's scale and shift are fitted to it
   on the consistent pixels only, trimmed of the worst-fitting quarter twice
   (something that moved on its own). The scale is the ratio of spreads, not
   the least-squares slope, which noise biases towards 0 and which, chained
   over a shot, would fade the map a little every frame.
4. Temporal filter: the aligned map is pulled towards the warped previous map
   on consistent pixels where the two agree (weight up to CARRY, falling off
   where they differ by more than AGREE of the shot's range), as far as each
   pixel is trusted (`motion._trust`: less where the previous frame warped by the flow
   does not match this one, MISMATCH; offline, also where the flow is fast, MOVE_PX;
   live, where the pixel moves on its own, not with the camera, OWN_PX).
   The model's own frame-to-frame noise averages out on the still scene;
   occluded pixels, a moving subject whose flow is off and the background it
   uncovers take the new prediction, so nothing lags or ghosts. Offline, a backward pass pulls each map towards the
   LAG frames after it as well. Last (`alignment.keep_shape`), the pixels that move are pulled
   back towards the frame's own map where the filter left them correlating less than FIDELITY
   with it (on the moving pixels the flow follows both ways), each the more the further it is from it
   (the lag, not the noise): the lag is bounded frame by frame, so the gates can hold the still scene harder.
5. The grey range is the frame statistic (min and max, or `clip_percent`
   percentiles) of the filtered map; live it follows the shot through an
   exponential moving average, offline it is the mean over the frames around it.

A shot's first map is exactly the `frame` map (live), or that map stretched
over its shot's range (offline): no grey levels cross a cut.

Metric depth is aligned as negated depth, not as disparity (1 / depth): the
`frame` map is linear in depth, the first map of a shot must be exactly that
map, and every map of a shot must share one tone curve; a metric model's
frame-to-frame error is mostly a scale, which an affine fit in either space covers.

Streaming (the daemon, `live`): `Stabiliser` keeps one small state per output path
(LRU-bounded, forgotten after `IDLE_S` without a frame, a new shot when the
model generation or the normalise settings change). `map()` works from a
snapshot of it and changes nothing; `landed()`, called once the map is written,
makes the state that frame leaves the output's, unless a newer frame's already
is. So the state follows exactly the maps the editor sees, in order, and a
frame abandoned or superseded before it is written leaves no trace.

Offline (`depthwatch once` over a sequence, and the render farm) there is one
shot planner (`planner`), a generator with bounded memory:

    frames = ((key, summarise(prediction, kind, image, clip), prediction) for each frame in order)
    for key, nearness, first in stabilised(frames, kind, clip):   # [0, 1] maps, in frame order
        write(key, nearness)

It holds at most `window + LOOKAHEAD + 1` frames (see `held_at_most`) whatever
the sequence's length: a map leaves as soon as the frames it depends on have
come in, so predictions never pile up for a whole sequence, and none is
computed twice.

The package, one job a module, each below the next in this list:

- `motion`: the flow on thumbnails, its per-pixel trust, the camera's motion, the cut score;
- `cuts`: the cut tests on those measures, live on the frame itself and offline with look-ahead;
- `alignment`: the fit, the blend with a neighbour's map, the stretch (pure maths);
- `live`: the daemon's `Stabiliser` and its per-output state;
- `planner`: the offline shot planner, `stabilised`.

What the rest of depthwatch uses is imported here, so callers write
`stabilise.Stabiliser`, `stabilise.stabilised`, `stabilise.summarise`.
"""

from __future__ import annotations

from depthwatch.imaging.stabilise.alignment import Fit, fit
from depthwatch.imaging.stabilise.live import IDLE_S, MAX_OUTPUTS, Lookahead, ShotMap, Stabiliser
from depthwatch.imaging.stabilise.cuts import LOOKAHEAD, is_cut
from depthwatch.imaging.stabilise.motion import THUMB_WIDTH, Motion, measure, thumbnail
from depthwatch.imaging.stabilise.planner import RANGE_WINDOW, Summary, held_at_most, stabilised, summarise

__all__ = [
    "IDLE_S",
    "LOOKAHEAD",
    "MAX_OUTPUTS",
    "RANGE_WINDOW",
    "THUMB_WIDTH",
    "Fit",
    "Lookahead",
    "Motion",
    "ShotMap",
    "Stabiliser",
    "Summary",
    "fit",
    "held_at_most",
    "is_cut",
    "measure",
    "stabilised",
    "summarise",
    "thumbnail",
]
