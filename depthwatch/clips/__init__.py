"""Clips: a clip's way to its depth clip, in one streamed pass, renamed into place only once whole.

`job`: what a clip job is (`ClipJob`), where it stands (`Progress`), how it
ended (`ClipResult`). `make`: the clip job itself (`make_clip`), which the
daemon's clip thread, `once` and the farm call. `stream`: the streamed pass,
decode -> infer -> shot planner, and the maps written behind it. `placing`:
the temporary name beside the final one and the rename (or, for an image
sequence, the folder swap) that puts a whole depth clip in place. `sequence`:
an image sequence's folder begun, its frames' record, each frame written
(local clips and the farm's workers alike).

Above `frames` (a clip's frames go the way a frame's settings, records and
writes say) and below `daemon`, which runs clip jobs on a thread of its own.
"""
