"""`depthwatch once`'s work: the files named on the command line mapped to completion, then the process exits.

`inputs` (what was named, and where the outputs go), `vetting` (what is
refused before any work), `plan` (a run's frames made ready), `passes` (a
sequence's two passes), `local` (the frames mapped here), `cliploop` (the clips
mapped here), `progress` and `taskprogress` (what a run says as it goes and
when it ends). `farm` runs a batch's frames and clips on a render farm.
"""
