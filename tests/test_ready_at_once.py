"""Ready at once: the engine measurement is off the start path, int8 where faithful, a key that names the CPU.

The daemon serves its first frame from the remembered choice, or from the
reference (onnxruntime's CPU provider at fp32) when there is none, and
measures the other engines in idle time on its one inference thread, every
live frame first. These tests drive the real daemon with a model slow enough
that a measurement takes many frames' time, the engine with stand-in
accelerators (real CPU sessions wearing an accelerator's name, see
test_providers), and real int8 quantizations of models built here.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from conftest import fill_disk, jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import DaemonProcess, wait_for
from onnx_models import brightness_model, cancelling_model, slow_model
from test_providers import CPU, CPU_DELAY, CUDA, FAST, SLOW, COREML, Machine, StandIn, spec

from depthwatch import processes
from depthwatch.config import parse
from depthwatch.daemon.lifecycle import Daemon
from depthwatch.errors import EX_SOFTWARE, BadPrediction, ModelChanged
from depthwatch.model import caches, providers
from depthwatch.model.choosing import choice, gauges, hardware, quantize
from depthwatch.model.choosing import precision as precisions
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec
from depthwatch.model.choosing.trials import SWITCH

INT8, FP32 = "int8", "fp32"


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "cache-home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "depthwatch"


def log_lines(d: DaemonProcess, text: str) -> list[int]:
    return [i for i, line in enumerate(d.log().splitlines()) if text in line]


# -- the real daemon -------------------------------------------------------------------------


def test_the_daemon_is_ready_and_maps_a_frame_before_the_measurement_ends_and_sigterm_ends_it(tmp_path):
    """A model of about a second a run, never measured: `ready` at once, the first map while the
    measurement still has many runs to make, then SIGTERM in the middle of the measurement."""
    model = slow_model(tmp_path / "slow.onnx", seconds=1.0, size=256)
    d = DaemonProcess(tmp_path, model, daemon={"workers": 1, "shutdown_timeout_s": 5})
    try:
        d.start()
        assert d.status()["measuring"] is True
        wait_for(lambda: log_lines(d, "ready: watching"), what="the ready line")
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame(256, 256)))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), timeout=120, what="the first map")
        wait_for(lambda: d.frame_lines(), what="the frame's log line")
        measured = log_lines(d, "providers: measured slow.onnx")
        assert not measured or measured[0] > log_lines(d, "frame.jpg")[0]
        wait_for(lambda: log_lines(d, "measuring engines for slow.onnx in idle time"), timeout=60, what="the measurement to start")
        started = log_lines(d, "measuring engines for slow.onnx in idle time")[0]
        assert "about" in d.log().splitlines()[started] and "every frame goes first" in d.log().splitlines()[started]
        assert d.stop(timeout=60) == 0  # SIGTERM; killed (and so not 0) had it waited for the measurement
        assert log_lines(d, "stopped")
    finally:
        d.close()


def test_sigterm_while_the_model_loads_ends_the_daemon(tmp_path):
    """SIGTERM before `ready` (the first load of a slow model) is honoured, not held until the start ends."""
    model = slow_model(tmp_path / "slow.onnx", seconds=2.0, size=256)
    d = DaemonProcess(tmp_path, model, daemon={"shutdown_timeout_s": 5})
    try:
        d.start(wait=False)
        wait_for(lambda: log_lines(d, "config "), timeout=60, what="the daemon to start loading")
        assert d.state() != "running"
        d.send(signal.SIGTERM)
        # The start does not hold the signal until the load and a measurement of every engine
        # (minutes for this model) have ended: it ends within its shutdown time.
        assert d.proc.wait(60) == 0
        assert log_lines(d, "stopped before the model was ready")
        assert not log_lines(d, "ready: watching")
    finally:
        d.close()


# -- the engine, with stand-in accelerators ----------------------------------------------------


def background(model: Path, machine: Machine, precision: str = "auto") -> Engine:
    return Engine(
        spec(model, "auto", precision), session_factory=machine, available_providers=machine.available, measure_providers="background"
    )


def test_the_switch_after_the_measurement_serves_from_the_measured_session_on_the_one_thread(tmp_path, cache_home):
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: FAST, CPU: CPU_DELAY})
    x = np.zeros((1, 3, 32, 32), np.float32)
    with background(model, machine) as engine:
        info = engine.wait_ready(60)
        # Ready with the reference, before any measurement: one session, nothing measured yet.
        assert info.providers == (CPU,) and info.chosen_by == "" and engine.measuring
        assert [p for p, _ in machine.sessions] == [CPU]
        assert engine.infer(x, info.generation).result(60).model.providers == (CPU,)
        wait_for(lambda: not engine.measuring, timeout=120, what="the measurement to end")
        now = engine.info
        assert now.providers == (CUDA, CPU) and now.generation == info.generation + 1
        assert now.runs_off_the_cpu and not info.runs_off_the_cpu  # the pipeline works ahead beside CUDA only
        assert engine.switches == 1 and engine.load_count == 1 and engine.measurements == 1
        # Idle-time work goes only to what can still win: CoreML's first run was clearly slower than
        # the CPU's (no second run, no probe: it had to reach 0.85x the CPU's time to be chosen); int8
        # (a CPU session, measured after CUDA) was not faster than CUDA, so its maps were not checked.
        # CUDA's were.
        trials = {t.provider if t.precision == "fp32" else t.precision: t for t in now.trials}
        assert trials[COREML].runs == 1 and not trials[COREML].ok
        assert "(0.85 x CPU fp32's " in trials[COREML].error and "maps were not checked" in trials[COREML].error
        assert not trials["int8"].ok and "(CUDA fp32's " in trials["int8"].error
        assert trials[CUDA].eligible and trials[CUDA].agreement is not None
        # Every session made on the inference thread; the CUDA one measured is the one serving
        # (no second CUDA session was loaded for it), the int8 one (a CPU session) came and went.
        assert [p for p, _ in machine.sessions] == [CPU, COREML, CUDA, CPU]
        assert {t for _, t in machine.sessions} == {"depthwatch-inference"}
        with pytest.raises(ModelChanged):  # a tensor prepared for the old generation is prepared again
            engine.infer(x, info.generation).result(60)
        assert engine.infer(x, now.generation).result(60).model.providers == (CUDA, CPU)
    decisions = json.loads((cache_home / "providers.json").read_text())
    assert [d["provider"] for d in decisions.values()] == [CUDA]

    machine.sessions.clear()
    with background(model, machine) as again:  # a restart: the remembered choice serves at once
        info = again.wait_ready(60)
        assert info.providers == (CUDA, CPU) and info.chosen_by == "remembered"
        busy = next(iter(decisions.values()))["busy"]
        assert again.measuring == busy  # measured again only if the first was on a busy machine
    if not busy:
        assert [p for p, _ in machine.sessions] == [CUDA]


def test_a_live_frame_goes_before_the_measurement(tmp_path):
    """A frame handed over while the measurement is under way is served before the measurement ends."""
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: SLOW, CPU: CPU_DELAY})  # every measured run a while
    x = np.zeros((1, 3, 32, 32), np.float32)
    with background(model, machine) as engine:
        info = engine.wait_ready(60)
        wait_for(lambda: len(machine.sessions) >= 2, timeout=60, what="the measurement to make its first session")
        result = engine.infer(x, info.generation).result(60)
        assert result.model.providers == (CPU,)
        assert engine.measuring, "the measurement (tens of runs of 0.1-0.3 s) ended before one frame was served"


def test_an_error_of_our_own_fails_the_frame_and_the_inference_thread_serves_on(tmp_path):
    """An empty prediction fails its frame as a bad prediction; the inference thread serves the next one.
    A ValueError from the map check, left to escape, would end that thread."""
    model = brightness_model(tmp_path / "m.onnx")
    empty = threading.Event()

    class Empty(StandIn):
        def run(self, names, feed, options=None):
            out = self.session.run(names, feed, options)
            return [np.zeros((1, 0, 0), np.float32)] if empty.is_set() else out

    def factory(path, sess_options=None, providers=None):
        return Empty(onnxruntime.InferenceSession(path, sess_options=sess_options, providers=[CPU]), CPU, 0.0)

    x = np.full((1, 3, 32, 32), 0.5, np.float32)
    x[..., :16] = 0.1
    with Engine(spec(model, ("cpu",), "fp32"), session_factory=factory) as engine:
        info = engine.wait_ready(60)
        empty.set()
        with pytest.raises(BadPrediction, match="empty map"):
            engine.infer(x, info.generation).result(60)
        empty.clear()
        assert engine.infer(x, info.generation).result(60).prediction.shape == (32, 32)
        assert engine.alive and engine.failure is None


def test_a_damaged_digest_record_is_hashed_again_and_the_model_loads(tmp_path, cache_home):
    """A digests.json entry without its sha256 is hashed again and the model loads; left as it is, it would be a
    KeyError on the inference thread: a bare exit 1."""
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({CUDA: FAST, CPU: CPU_DELAY})
    real = caches.model_digest(model, cache_home)
    index = cache_home / "digests.json"
    damaged = json.loads(index.read_text())
    del damaged[str(model)]["sha256"]
    index.write_text(json.dumps(damaged))
    with Engine(spec(model), session_factory=machine, available_providers=machine.available) as engine:
        assert engine.wait_ready(60).providers[0] == CUDA
    assert json.loads(index.read_text())[str(model)]["sha256"] == real


def test_a_daemon_whose_inference_thread_dies_says_so_and_exits_non_zero(tmp_path):
    """The thread ending (here: a BaseException from a session, which nothing should catch) is not
    hidden: the status says failed with the reason, /health would not say serving, exit 70."""

    class Fatal(BaseException):
        pass

    class Dying(StandIn):
        def run(self, names, feed, options=None):
            if np.any(feed[next(iter(feed))] != 0):  # a real frame, not the warm-up's zeros
                raise Fatal("the runtime pulled the rug")
            return self.session.run(names, feed, options)

    def factory(path, sess_options=None, providers=None):
        return Dying(onnxruntime.InferenceSession(path, sess_options=sess_options, providers=[CPU]), CPU, 0.0)

    model = brightness_model(tmp_path / "m.onnx")
    watch = tmp_path / "watch"
    watch.mkdir()
    status = tmp_path / "status.json"
    text = (
        f"model: {{path: '{model}', profile: midas-v21-small, providers: [cpu], precision: fp32}}\n"
        f"watch: {{folders: ['{watch}'], patterns: [frame.jpg]}}\n"
        f"daemon: {{status_file: '{status}', workers: 1, shutdown_timeout_s: 5}}\n"
    )
    config = parse(text, tmp_path / "config.yaml")
    daemon = Daemon(config, session_factory=factory)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(daemon.run()), name="test-daemon")
    thread.start()
    try:
        wait_for(lambda: json.loads(status.read_text()).get("state") == "running" if status.exists() else None, what="running")
        assert daemon.backend.health()[0]
        write_by_rename(watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        thread.join(60)
        assert not thread.is_alive() and codes == [EX_SOFTWARE]
        written = json.loads(status.read_text())
        assert written["state"] == "failed"
        assert "stopped the inference thread" in written["health_error"] and "Fatal" in written["health_error"]
        assert daemon.backend.health()[0] is False
    finally:
        daemon.request_stop()
        thread.join(30)


# -- int8 -------------------------------------------------------------------------------------


def conv_model(path: Path) -> Path:
    """A small convolutional model (6 layers of 3x3, ReLU) plus the frame's brightness: int8 keeps it."""
    return slow_model(path, layers=6, size=64, channels=16)


def test_int8_is_kept_where_its_maps_are_faithful_and_refused_where_not(tmp_path, cache_home, caplog):
    caplog.set_level(logging.INFO, logger="depthwatch")
    good = conv_model(tmp_path / "conv.onnx")
    with Engine(spec(good, ("cpu",))) as engine:
        info = engine.wait_ready(120)
    int8 = next(t for t in info.trials if t.precision == INT8)
    assert int8.ok and int8.agreement >= 0.995 and int8.eligible, int8
    fp32 = next(t for t in info.trials if t.precision == FP32)
    # Served in int8 where it is clearly faster than fp32 (SWITCH), else in fp32: either way a choice
    # among faithful variants, none refused.
    assert info.precision == (INT8 if int8.run_ms <= SWITCH * fp32.run_ms else FP32) and info.refused == ()
    files = list((cache_home / "int8").rglob(quantize.FILE))
    assert len(files) == 1  # kept beside the compiled models
    caplog.clear()
    with Engine(spec(good, ("cpu",), INT8)) as again:  # int8 as configured: the cached file, no new quantization
        assert again.wait_ready(120).precision == INT8
    assert not any("quantizing" in m for m in caplog.messages)

    bad = cancelling_model(tmp_path / "cancelling.onnx")
    caplog.clear()
    with Engine(spec(bad, ("cpu",))) as engine:
        info = engine.wait_ready(120)
    int8 = next(t for t in info.trials if t.precision == INT8)
    assert int8.ok and int8.agreement < 0.995 and not int8.eligible
    assert info.precision == "fp32" and len(info.refused) == 1 and info.refused[0].startswith("int8 on CPU: its maps correlate")
    assert any("precision: auto refused int8 on CPU" in m for m in caplog.messages)

    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPTHWATCH_")}
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "check", "--model", str(bad), "--profile", "midas-v21-small"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stderr
    # `check` measures every provider at hand and names the refusals of the one it chose: CPU on one machine,
    # OpenVINO on the next (whichever ran faster there). Either way int8 is refused on the one serving.
    served = re.search(r"^providers: +(\S+) \(auto", done.stdout, re.M)
    assert served, done.stdout
    assert f"refused int8 on {providers.short(served[1])}: its maps correlate" in done.stdout, done.stdout


def test_a_damaged_int8_file_in_the_cache_is_made_again_not_served(tmp_path, cache_home, caplog):
    """A cached int8 file damaged after it was written (a disk error, a sync cut short) is told by its sha256,
    removed and made again, in one line, and the maps are the model's. Unchecked, one that still parses would
    serve maps unlike the model's, said "ok"; one that does not would send the engine to the CPU at fp32 for
    good, said "did not take the model"."""
    caplog.set_level(logging.INFO, logger="depthwatch")
    model = conv_model(tmp_path / "conv.onnx")
    frame = np.random.default_rng(5).random((1, 3, 64, 64), dtype=np.float32)
    with Engine(spec(model, ("cpu",), INT8)) as engine:
        good = engine.infer(frame, engine.wait_ready(120).generation).result(60).prediction
    (made,) = list((cache_home / "int8").rglob(quantize.FILE))
    data = bytearray(made.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)  # the weights in the middle zeroed: a valid graph still
    made.write_bytes(bytes(data))
    caplog.clear()
    with Engine(spec(model, ("cpu",), INT8)) as engine:
        info = engine.wait_ready(120)
        again = engine.infer(frame, info.generation).result(60).prediction
    assert info.precision == INT8
    said = [m for m in caplog.messages if "in the cache is damaged (its sha256 is not the one written); removed, made again" in m]
    assert len(said) == 1 and str(made) in said[0], caplog.messages
    assert any(m.startswith("quantizing conv.onnx to int8") for m in caplog.messages)
    assert np.corrcoef(good.ravel(), again.ravel())[0, 1] > 0.999  # the file made again, not the damaged one


def test_a_remembered_int8_choice_whose_file_is_gone_serves_fp32_at_once_and_makes_int8_in_idle_time(tmp_path, cache_home, caplog):
    """The int8 file of a remembered int8 choice gone from the cache (cleaned, pruned, damaged): the daemon is
    ready at once at fp32 and makes the file again in idle time, not before `ready` (a minute for a 41 MB model,
    a frame dropped meanwhile waiting)."""
    caplog.set_level(logging.INFO, logger="depthwatch")
    model = conv_model(tmp_path / "conv.onnx")
    with Engine(spec(model, ("cpu",))) as engine:  # measured now, as `check --providers` does: int8 made
        engine.wait_ready(120)
    index = cache_home / "providers.json"
    decisions = json.loads(index.read_text())
    (key,) = decisions
    decisions[key].update(precision=INT8, busy=False)  # remembered: int8
    index.write_text(json.dumps(decisions))
    (made,) = list((cache_home / "int8").rglob(quantize.FILE))
    made.unlink()
    caplog.clear()
    with Engine(spec(model, ("cpu",)), measure_providers="background") as engine:
        info = engine.wait_ready(120)
        assert info.precision == FP32 and info.chosen_by == "remembered"
        assert not any(m.startswith("quantizing") for m in caplog.messages)  # nothing made before ready
        assert any("the int8 model of conv.onnx is not in the cache: CPU serves at fp32 now" in m for m in caplog.messages)
        assert engine.infer(np.zeros((1, 3, 64, 64), np.float32), info.generation).result(60).prediction.shape == (64, 64)
        wait_for(lambda: not engine.measuring, timeout=120, what="the idle-time measurement")
    assert made.is_file()  # made again, in idle time
    assert json.loads(index.read_text())[key]["measured"]  # and measured again


def test_int8_that_cannot_be_made_for_a_full_cache_serves_fp32_rather_than_nothing(tmp_path, small_disk, monkeypatch, caplog):
    """A full (or read-only) cache makes the quantization fail, and the fp32 model serves, said in one line:
    the model is not refused (`once`, `check` and the daemon, with int8 remembered and its file gone, would
    exit 78, the fp32 model never served)."""
    caplog.set_level(logging.INFO, logger="depthwatch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(small_disk))
    model = conv_model(tmp_path / "conv.onnx")
    fill_disk(small_disk)
    with Engine(spec(model, ("cpu",), INT8)) as engine:
        info = engine.wait_ready(120)
        assert engine.infer(np.zeros((1, 3, 64, 64), np.float32), info.generation).result(60).prediction.shape == (64, 64)
    assert info.precision == FP32
    said = [m for m in caplog.messages if "CPU serves conv.onnx at fp32" in m]
    assert len(said) == 1 and ("No space left on device" in said[0] or "cannot use the int8 cache" in said[0]), caplog.messages
    assert [p.name for p in small_disk.rglob("*.dwtmp")] == []


def test_a_quantization_ends_where_it_is_told_to_with_nothing_left(tmp_path):
    """A quantization looks between calibration images whether to stop (a stop, a frame dropped meanwhile),
    and ends there with nothing left: no temporary, no half a model. Waited for whole, it would take a 41 MB
    model 12 s, past the shutdown's timeout, and hold a dropped frame for a minute."""
    model = conv_model(tmp_path / "conv.onnx")
    cache_root, state = tmp_path / "int8", tmp_path / "state"
    tensors = [np.random.default_rng(i).random((1, 3, 64, 64), dtype=np.float32) for i in range(4)]
    looked = []

    class FrameWaiting(Exception):
        pass

    def check() -> None:
        looked.append(len(looked))
        if len(looked) == 4:  # between two calibration images
            raise FrameWaiting()

    with pytest.raises(FrameWaiting):  # as it was raised, not a failed quantization
        quantize.int8_model(model, cache_root, state, "image", tensors, check=check)
    folder = quantize._target(model, cache_root, state).parent
    assert sorted(p.name for p in folder.iterdir()) == ["depthwatch-entry.json"]  # no temporary, no half a model
    assert quantize.int8_model(model, cache_root, state, "image", tensors, check=lambda: None).is_file()


def padded_conv_model(path: Path) -> Path:
    """Each Conv behind a Pad of its own, as TensorFlow's exports write `same` padding (FastDepth has 19)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes, inits, channels, name = [], [], 3, "image"
    for i, out in enumerate((8, 8, 1)):
        inits += [
            numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), f"pads{i}"),
            numpy_helper.from_array((rng.standard_normal((out, channels, 3, 3)) * 0.2).astype(np.float32), f"w{i}"),
        ]
        nodes += [
            helper.make_node("Pad", [name, f"pads{i}"], [f"padded{i}"]),
            helper.make_node("Conv", [f"padded{i}", f"w{i}"], [f"conv{i}"]),
            helper.make_node("Relu", [f"conv{i}"], [f"act{i}"]),
        ]
        channels, name = out, f"act{i}"
    nodes.append(helper.make_node("Squeeze", [name, "axis"], ["depth"]))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis"))
    graph = helper.make_graph(
        nodes, "padded", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, 64, 64])], inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_int8_is_quantized_after_the_tools_preparation_so_a_pad_joins_its_conv(tmp_path, cache_home):
    # Unprepared, each Pad stays a node of its own between quantize and dequantize pairs: the
    # real FastDepth network in fp32 runs 1.2-1.4x slower in int8 that way (benchmarks.realint8).
    import onnx

    model = padded_conv_model(tmp_path / "padded.onnx")
    with Engine(spec(model, ("cpu",), INT8)) as engine:
        assert engine.wait_ready(120).precision == INT8
    (quantized,) = list((cache_home / "int8").rglob(quantize.FILE))
    ops = [node.op_type for node in onnx.load(str(quantized)).graph.node]
    assert ops.count("Conv") == 3 and "Pad" not in ops, ops


def test_a_quantization_that_did_not_finish_leaves_nothing_for_good(tmp_path):
    """A stop or a kill while quantizing leaves model-sized hidden files in the cache, one more at each
    interrupted start: the next quantization removes those of processes that are gone (a live one's
    stay), and its own go with it."""
    model = padded_conv_model(tmp_path / "padded.onnx")
    cache_root, state = tmp_path / "int8", tmp_path / "state"
    folder = quantize._target(model, cache_root, state).parent
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    left = [f".int8-{dead}-abcd1234.pre.onnx.dwtmp", f".int8-{dead}-abcd1234.pre.onnx-inferred.dwtmp", ".int8-k2j4h5g6.onnx.dwtmp"]
    live = f".int8-{os.getpid()}-live0000.onnx.dwtmp"  # a quantization under way in a live process
    # Another container's (or host's, the cache on NFS) pid 1: its quantization under way cannot be asked
    # from here (so it is not removed as a dead process's), and one left untouched for hours is left behind.
    there = "000000" if processes.own_host() != "000000" else "111111"
    elsewhere, abandoned = f".int8-1t99h{there}-busy0000.onnx.dwtmp", f".int8-1t98h{there}-gone0000.onnx.dwtmp"
    for name in (*left, live, elsewhere, abandoned):
        (folder / name).write_bytes(b"as large as the model")
    hours_ago = time.time() - 2 * processes.FOREIGN_IDLE_S
    os.utime(folder / abandoned, (hours_ago, hours_ago))
    tensors = [np.random.default_rng(i).random((1, 3, 64, 64), dtype=np.float32) for i in range(2)]
    target = quantize.int8_model(model, cache_root, state, "image", tensors)
    assert target.is_file()
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == sorted([live, elsewhere])


def test_int8_keeps_its_first_and_last_convolution_in_fp32_and_gives_the_others_all_8_bits(tmp_path, cache_home):
    # The real FastDepth network made fp32 again (benchmarks.realint8): whole in int8 its maps keep
    # r 0.9954 with VNNI and 0.9904 on AVX2 alone (u8s8 saturates there), with 7-bit weights on AVX2
    # 0.9693 (refused); the ends in fp32, 8-bit weights: 0.9976 / 0.9975.
    import onnx
    from onnx import numpy_helper

    model = conv_model(tmp_path / "conv.onnx")
    with Engine(spec(model, ("cpu",), INT8)) as engine:
        assert engine.wait_ready(120).precision == INT8
    (quantized,) = list((cache_home / "int8").rglob(quantize.FILE))
    graph = onnx.load(str(quantized)).graph
    made_by = {output: node for node in graph.node for output in node.output}
    initial = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

    def weights(conv: onnx.NodeProto) -> np.ndarray:
        """A convolution's weights as stored: float, or the int8 behind a DequantizeLinear."""
        if conv.input[1] in initial:
            return initial[conv.input[1]]
        dequantize = made_by[conv.input[1]]
        assert dequantize.op_type == "DequantizeLinear", dequantize
        return initial[dequantize.input[0]]

    convs = [node for node in graph.node if node.op_type == "Conv"]
    assert len(convs) >= quantize.ENDS_FROM
    assert weights(convs[0]).dtype == np.float32 and weights(convs[-1]).dtype == np.float32
    middle = [weights(conv) for conv in convs[1:-1]]
    assert middle and all(w.dtype == np.int8 for w in middle), [w.dtype for w in middle]
    # All 8 bits on every CPU (7-bit weights reach 63 at most), whatever this machine's features.
    assert all(int(np.abs(w.astype(np.int16)).max()) == 127 for w in middle)


def test_a_model_that_is_int8_already_is_not_quantized_again(tmp_path, fastdepth):
    with Engine(ModelSpec(path=fastdepth, profile=PROFILES["fastdepth-nyu"], providers=("cpu",))) as engine:
        info = engine.wait_ready(120)
    int8 = next(t for t in info.trials if t.precision == INT8)
    assert int8.error == "the model is quantized already" and info.precision == "fp32"


# -- what the choice is remembered under --------------------------------------------------------


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")


def _with_flags(cpuinfo: str, add: set[str], remove: set[str]) -> str:
    out = []
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags = (set(value.split()) - remove) | add
            line = f"{key}: {' '.join(sorted(flags))}"
        out.append(line)
    return "\n".join(out)


def test_the_decision_key_changes_with_the_cpus_features(tmp_path, cache_home):
    """Whatever this CPU has: the same machine with AVX-512 BF16 taken away or added is another key."""
    text = _cpuinfo()
    has = "avx512_bf16" in hardware.cpu_features(text)
    other = _with_flags(text, set() if has else {"avx512_bf16"}, {"avx512_bf16"} if has else set())
    assert hardware.machine(text) == hardware.machine()
    assert hardware.machine(other) != hardware.machine(text)
    assert hardware.machine(_with_flags(text, {"sse3_made_up_flag"}, set())) == hardware.machine(text)  # not one that matters
    assert f"{os.cpu_count()} cores" in hardware.machine(text)

    # A decision measured on the other CPU is not taken here: this start measures for itself.
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({CUDA: FAST, CPU: CPU_DELAY})
    digest = caches.model_digest(model, cache_home)
    versions = providers.runtimes_version(machine.available())
    foreign = choice.decision_key(digest, versions, machine.available(), "auto").replace(hardware.machine(), hardware.machine(other))
    assert foreign != choice.decision_key(digest, versions, machine.available(), "auto")
    cache_home.mkdir(parents=True, exist_ok=True)
    (cache_home / "providers.json").write_text(json.dumps({foreign: {"provider": CPU, "precision": "fp32", "at": time.time()}}))
    with Engine(spec(model), session_factory=machine, available_providers=machine.available) as engine:
        info = engine.wait_ready(120)
    assert engine.measurements == 1 and info.chosen_by == "measured" and info.providers[0] == CUDA


def test_a_choice_remembered_before_auto_tried_what_it_tries_now_is_measured_again(tmp_path, cache_home):
    # A new variant (OpenVINO's int8), or one made another way (int8's ends in fp32), may be the
    # faster one: a choice made without it is not served as if it had been measured against it.
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({CUDA: FAST, CPU: CPU_DELAY})
    digest = caches.model_digest(model, cache_home)
    versions = providers.runtimes_version(machine.available())
    key = choice.decision_key(digest, versions, machine.available(), "auto")
    assert key.endswith(f" | tried {precisions.TRIED}")
    older = key.replace(f" | tried {precisions.TRIED}", f" | tried {precisions.TRIED - 1}")
    cache_home.mkdir(parents=True, exist_ok=True)
    (cache_home / "providers.json").write_text(json.dumps({older: {"provider": CPU, "precision": "fp32", "at": time.time()}}))
    with Engine(spec(model), session_factory=machine, available_providers=machine.available) as engine:
        info = engine.wait_ready(120)
    assert engine.measurements == 1 and info.chosen_by == "measured" and info.providers[0] == CUDA


def test_a_choice_measured_on_a_busy_machine_serves_and_is_measured_again(tmp_path, cache_home, caplog):
    caplog.set_level(logging.INFO, logger="depthwatch")
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({CUDA: FAST, CPU: CPU_DELAY})
    with Engine(spec(model), session_factory=machine, available_providers=machine.available) as first:
        first.wait_ready(120)
    path = cache_home / "providers.json"
    decisions = json.loads(path.read_text())
    (key,) = decisions
    decisions[key]["busy"] = True
    path.write_text(json.dumps(decisions))
    machine.sessions.clear()
    with background(model, machine) as engine:
        info = engine.wait_ready(60)
        assert info.chosen_by == "remembered" and info.providers[0] == CUDA and engine.measuring
        wait_for(lambda: not engine.measuring, timeout=120, what="the second measurement")
        assert engine.measurements == 1
    assert any("on a busy machine: measuring again in idle time" in m for m in caplog.messages)
    assert json.loads(path.read_text())[key]["measured"]


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the load of other processes is read from /proc/stat")
def test_other_processes_keeping_the_cpus_busy_are_seen():
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        load = gauges.CpuLoad()
        wait_for(lambda: all(p.poll() is None for p in burners), what="the burners")
        load.begin()
        time.sleep(1.0)
        others = load.others()
        assert others is not None and others > gauges.BUSY_CORES, others
    finally:
        for p in burners:
            p.kill()
            p.wait(10)


def test_the_daemon_starts_with_a_damaged_digest_record(tmp_path):
    """The real process: a digests.json whose entry has lost its sha256 has the model hashed again, and the
    daemon maps (not a bare AssertionError at the first load and exit 1, a restart loop under launchd)."""
    model = brightness_model(tmp_path / "m.onnx")
    stat = model.stat()
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "depthwatch"
    cache.mkdir(parents=True, exist_ok=True)
    entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino, "used": time.time()}
    (cache / "digests.json").write_text(json.dumps({str(model.resolve()): entry}))
    d = DaemonProcess(tmp_path / "d", model)
    try:
        d.start()
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(quadrant_frame()))
        wait_for(lambda: (d.watch / "depth.jpg").exists(), what="the map")
        assert len(json.loads((cache / "digests.json").read_text())[str(model.resolve())]["sha256"]) == 64
        assert d.stop() == 0
    finally:
        d.close()


def test_an_int8_file_is_hashed_once_a_process_not_at_every_look(tmp_path, monkeypatch):
    """A process hashes the whole int8 file once, not at every look (the choice, then the load: twice before
    `ready`); a file changed since is looked at again."""
    model = conv_model(tmp_path / "conv.onnx")
    cache_root, state = tmp_path / "int8", tmp_path / "state"
    tensors = [np.random.default_rng(i).random((1, 3, 64, 64), dtype=np.float32) for i in range(2)]
    made = quantize.int8_model(model, cache_root, state, "image", tensors)
    quantize._VERIFIED.clear()  # as a new process finds it
    hashed = []
    real = quantize._file_digest
    monkeypatch.setattr(quantize, "_file_digest", lambda path: hashed.append(path) or real(path))
    assert quantize.cached(model, cache_root, state) == made
    assert quantize.cached(model, cache_root, state) == made
    assert len(hashed) == 1
    made.write_bytes(made.read_bytes()[:-1] + b"\0")  # changed since: looked at again, and found damaged
    assert quantize.cached(model, cache_root, state) is None and not made.exists()


def test_frames_that_keep_cutting_a_quantization_short_leave_it_for_the_next_start_said(tmp_path):
    """A quantization made in idle time starts over at every frame, so a steady trickle of frames could keep
    it from ever finishing: cut short MOST_CUT_SHORT times, it is given up, said, and the measurement is
    remembered as busy, so the next start measures again."""
    from depthwatch.model.choosing.measurement import MOST_CUT_SHORT, Measurement, Preempted

    tries = []

    class Session:
        def get_providers(self) -> list[str]:
            return [CPU]

    def create(variant, traced):
        if variant[1] == INT8:
            tries.append(variant)
            raise Preempted()  # as `SessionMaker._int8_file` does when a frame comes while it quantizes
        return Session()

    measurement = Measurement([(CPU, FP32), (CPU, INT8)], create, lambda session: None, budget_s=60.0)
    while measurement.step():
        pass
    int8 = next(t for t in measurement.trials if t.precision == INT8)
    assert len(tries) == MOST_CUT_SHORT and not int8.ok and "cut short by frames" in int8.error
    assert measurement.busy  # remembered as busy: the next start measures again
