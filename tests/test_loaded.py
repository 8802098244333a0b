"""What is loaded, and what is said about it: the precision a model really computes in, and the log kept depthwatch's own."""

from __future__ import annotations

import os
import subprocess
import sys

from daemon_process import DaemonProcess, wait_for
from onnx_models import brightness_model, unused_weight_model

from depthwatch.model import graph_ops


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
