"""What is loaded, and what is said about it: the precision a model really computes in, and the log kept depthwatch's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
from daemon_process import DaemonProcess, wait_for
from onnx_models import brightness_model, unused_weight_model
from test_providers import CPU, CPU_DELAY, COREML, CUDA, FAST, SLOW, Machine, spec

from depthwatch.model import graph_ops
from depthwatch.model.engine import Engine


def _top_level(text: str) -> list[str]:
    """`text` split at the commas outside parentheses: one entry per variant of a figures line."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def test_a_quantized_graph_is_told_apart_from_its_file_alone(tmp_path, fastdepth):
    assert graph_ops.quantized(fastdepth)  # QDQ pairs and int8 weights
    assert not graph_ops.quantized(brightness_model(tmp_path / "plain.onnx"))


def test_an_int8_model_is_logged_and_checked_as_int8(tmp_path, fastdepth):
    """The real FastDepth, quantized by its makers: the load's line and `check` say int8, not fp32."""
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "check", "--model", str(fastdepth), "--profile", "fastdepth-nyu"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    precision = next(line for line in done.stdout.splitlines() if line.startswith("precision: "))
    assert precision == "precision: int8 (auto); the model comes quantized and runs as it is"
    loaded = next(line for line in done.stderr.splitlines() if "loaded fastdepth_224_nyu_int8.onnx" in line)
    assert loaded.endswith("; precision int8")
    assert "fp32" not in loaded


def test_onnxruntimes_own_log_lines_stay_out_of_the_daemons_log(tmp_path):
    """The idle-time measurement quantizes a model whose sessions make onnxruntime warn on its own
    logger (colour codes, a weight's name unescaped): none of that reaches the daemon's log."""
    model = unused_weight_model(tmp_path / "unused.onnx")
    d = DaemonProcess(tmp_path, model)
    try:
        d.start()
        wait_for(lambda: "quantizing unused.onnx to int8" in d.log(), timeout=120, what="the measurement's quantization")
        wait_for(lambda: d.status().get("measuring") is False, timeout=300, what="the measurement to end")
        assert d.stop(timeout=60) == 0
    finally:
        d.close()
    log = d.log()
    assert "onnxruntime:" not in log and "\x1b" not in log, log
    assert "providers: measured unused.onnx" in log


def test_every_session_made_is_counted_and_only_the_serving_one_is_a_load(tmp_path):
    """The engine's count of sessions is the factory's own: the serving session, then each the measurement made."""
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: FAST, CPU: CPU_DELAY})
    engine = Engine(spec(model), session_factory=machine, available_providers=machine.available, measure_providers="background")
    with engine:
        info = engine.wait_ready(60)
        assert engine.sessions_made == 1 == engine.load_count  # ready with the reference alone
        engine.infer(np.zeros((1, 3, 32, 32), np.float32), info.generation).result(60)
        wait_for(lambda: not engine.measuring, timeout=120, what="the measurement to end")
        made = len(machine.sessions)
        assert made > 1 and engine.sessions_made == made
        assert engine.load_count == 1  # the measurement's sessions, the one it switched to included, are no loads
        assert {thread for _, thread in machine.sessions} == {"depthwatch-inference"}  # one at a time, on the one thread


def test_the_status_counts_the_sessions_the_idle_time_measurement_makes(tmp_path):
    """A real daemon with `providers: auto` and a model never measured: the model is loaded once, and the
    status file and `depthwatch status` count the sessions the measurement made beside it."""
    model = brightness_model(tmp_path / "fresh.onnx")
    d = DaemonProcess(tmp_path, model)
    try:
        d.start()
        wait_for(lambda: "providers: measured fresh.onnx" in d.log(), timeout=300, what="the measurement's figures")
        wait_for(lambda: d.status().get("measuring") is False, timeout=300, what="the measurement to end")
        status = d.status()
        shown = subprocess.run(
            [sys.executable, "-m", "depthwatch", "status", "-c", str(d.config_path)],
            capture_output=True, text=True, timeout=120, env=dict(os.environ),
        )
    finally:
        assert d.stop(timeout=60) == 0
        d.close()
    # Each variant with a time had a session of its own; the reference (the first) is the serving one.
    figures = next(line for line in d.log().splitlines() if "providers: measured fresh.onnx" in line)
    variants = _top_level(figures.split(": ", 2)[2].rsplit("; auto", 1)[0])
    timed = [v for v in variants[1:] if re.search(r"\d ms", v)]
    assert status["model_loads"] == 1
    assert 1 + len(timed) <= status["sessions_made"] <= 1 + len(variants), (status, variants)
    made = status["sessions_made"]
    row = next(line for line in shown.stdout.splitlines() if line.startswith("sessions"))
    assert row.endswith(
        f"model loaded 1 time(s) (start, reloads); {made} session(s) made in all "
        f"({made - 1} by the engine measurement, one at a time, in idle time)"
    ), shown.stdout
