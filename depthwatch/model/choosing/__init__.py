"""Engine choice: which runtime, provider and precision serve a model here, measured, and the sessions it hands the engine.

The engine (`model.engine`) is the one inference thread and the session it
serves from; everything about which engine that session is lives here, as
parts the engine holds and that never hold the engine:

- `making`: `SessionMaker` makes every session (serving, measured, the int8
  calibration's reference), warmed up and described, and counts them (`Tally`);
- `idle`: `IdleMeasurement`, the measurement made a step at a time between frames;
- `sideruns`: the runs that are not a frame's, which a stop or a live frame ends;
- `choice` (the decision and `providers.json`), `trials` (a variant's figures),
  `measurement` (its steps), `gauges` (what it reads besides the clock),
  `hardware` (the machine's key), `precision` (which arithmetic, and whether
  a map stays faithful), `quantize` (the int8 file).
"""
