"""OpenVINO as an engine, and `model.precision`: faithful maps, one thread, one session, no fork.

The real FastDepth model on the Middlebury motorcycle checks that the maps
OpenVINO serves (at fp32, at bf16 where the CPU has it, and whatever `auto`
picks) are ONNX Runtime's fp32 maps: correlation at least 0.995, and the same
rank correlation with the ground-truth disparity within 0.005. A model that
computes its output as a small difference of large numbers shows that bf16 is
refused where it breaks the map, and taken where it does not.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import onnxruntime
import pytest
import yaml
from daemon_process import DaemonProcess, assert_one_process, strace_works, wait_for
from onnx_models import brightness_model, cancelling_model, slow_model, spec_for
from scipy.stats import spearmanr
from skimage import data

# Not importorskip: a plain `import openvino` sends telemetry through a forked process; depthwatch's
# sessions.openvino.runtime() imports it without that.
if importlib.util.find_spec("openvino") is None:
    pytest.skip("the OpenVINO engine needs the openvino extra: pip install -e '.[openvino]'", allow_module_level=True)

from depthwatch.commands.check import precision_line  # noqa: E402
from depthwatch.errors import Superseded  # noqa: E402
from depthwatch.model import providers  # noqa: E402
from depthwatch.model.engine import Engine  # noqa: E402
from depthwatch.model.profiles import PROFILES  # noqa: E402
from depthwatch.model.sessions import openvino  # noqa: E402
from depthwatch.model.spec import ModelSpec  # noqa: E402
from depthwatch.model.choosing.trials import SWITCH  # noqa: E402

OPENVINO = providers.OPENVINO
HAS_BF16 = "bf16" in openvino.reduced_precisions()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no native bf16 (AVX-512 BF16 or AMX)")


@pytest.fixture(scope="module")
def motorcycle():
    left, _, disparity = data.stereo_motorcycle()
    valid = np.isfinite(disparity) & (disparity > 0)
    return left, disparity, valid


def _nearness(depth: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return -cv2.resize(depth.astype(np.float32), size, interpolation=cv2.INTER_LINEAR)


def _openvino_compiles(model: Path, precision: str) -> bool:
    """Whether OpenVINO itself compiles `model` at `precision` on this CPU (some plugins have no int8
    kernel at bf16: "No suitable implementations"), asked directly, outside the engine."""
    try:
        openvino.OpenVINOSession(model, precision)
    except RuntimeError:
        return False
    return True


def _spearman(near: np.ndarray, disparity: np.ndarray, valid: np.ndarray) -> float:
    return float(spearmanr(near[valid][::7], disparity[valid][::7]).statistic)


@pytest.mark.parametrize(
    ("wanted", "precision"),
    [("auto", "auto"), ((OPENVINO,), "fp32"), pytest.param((OPENVINO,), "bf16", marks=needs_bf16)],
    ids=["auto", "openvino-fp32", "openvino-bf16"],
)
def test_the_real_model_through_openvino_gives_ort_fp32_maps(fastdepth, motorcycle, wanted, precision, tmp_path, monkeypatch):
    if wanted == "auto":  # a machine that has never run the model (the suite's cache folders remember it)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "never-measured"))
    left, disparity, valid = motorcycle
    size = (left.shape[1], left.shape[0])
    x = cv2.resize(left, (224, 224), interpolation=cv2.INTER_AREA)[None]
    reference = onnxruntime.InferenceSession(str(fastdepth), providers=[providers.CPU]).run(["depth"], {"image": x})[0]
    reference = reference[0, :, :, 0]
    spec = ModelSpec(path=fastdepth, profile=PROFILES["fastdepth-nyu"], providers=wanted, precision=precision)
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
        ours = engine.infer(x, info.generation).result(60).prediction
    if wanted == "auto":  # measured: ORT's CPU provider and OpenVINO at least, each with its maps checked
        assert info.chosen_by == "measured"
        assert {(t.provider, t.precision) for t in info.trials} >= {(providers.CPU, "fp32"), (OPENVINO, "fp32")}
        assert all(t.agreement is None or 0 < t.agreement <= 1 for t in info.trials)
    elif _openvino_compiles(fastdepth, precision):
        assert info.providers == (OPENVINO,) and info.precision == precision
    else:  # this CPU's OpenVINO plugin has no kernel for the graph at this precision: CPU, said in one line
        assert info.providers == (providers.CPU,) and info.precision == "fp32"
    correlation = float(np.corrcoef(reference.ravel(), ours.ravel())[0, 1])
    bare = _spearman(_nearness(reference, size), disparity, valid)
    mine = _spearman(_nearness(ours, size), disparity, valid)
    print(f"{info.providers[0]} {info.precision}: r {correlation:.4f} with ORT fp32; spearman {mine:.4f} (ORT fp32 {bare:.4f})")
    assert correlation >= 0.995
    assert abs(mine - bare) <= 0.005
    assert bare > 0.7


class Calls:
    """Which thread made each OpenVINO session and each run, recorded around the real methods."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[tuple[int, int]] = []  # (session id, thread ident)
        self.runs: list[tuple[int, int]] = []
        init, run = openvino.OpenVINOSession.__init__, openvino.OpenVINOSession.run
        calls = self

        def recorded_init(session, *args, **kwargs):
            init(session, *args, **kwargs)
            calls.made.append((id(session), threading.get_ident()))

        def recorded_run(session, *args, **kwargs):
            calls.runs.append((id(session), threading.get_ident()))
            return run(session, *args, **kwargs)

        monkeypatch.setattr(openvino.OpenVINOSession, "__init__", recorded_init)
        monkeypatch.setattr(openvino.OpenVINOSession, "run", recorded_run)


def test_openvino_sessions_are_made_and_run_on_the_one_inference_thread(tmp_path, monkeypatch):
    calls = Calls(monkeypatch)
    model = brightness_model(tmp_path / "m.onnx", size=(64, 64))
    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=(OPENVINO,), precision="auto")
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
        assert info.providers == (OPENVINO,)
        measured = len(calls.made) - 1
        assert measured == (len(info.trials) if info.trials else 0)  # one session per variant measured, then the one
        serving = calls.made[-1][0]
        runs_before = len(calls.runs)
        futures = []
        senders = [
            threading.Thread(
                target=lambda k=k: futures.append(engine.infer(np.full((1, 3, 64, 64), k / 10, np.float32), info.generation)),
                name=f"sender-{k}",
            )
            for k in range(6)
        ]
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
        predictions = [f.result(60).prediction for f in futures]
        inference = engine.thread.ident
    assert len(predictions) == 6 and all(p.shape == (64, 64) for p in predictions)
    assert {ident for _, ident in calls.made} == {inference}  # every session made on the inference thread
    assert {ident for _, ident in calls.runs} == {inference}  # and every run, whoever asked for it
    assert [sid for sid, _ in calls.runs[runs_before:]] == [serving] * 6  # the one serving session did them all
    assert engine.load_count == 1


def test_a_running_openvino_inference_is_stopped_when_its_frame_is_superseded(tmp_path):
    model = slow_model(tmp_path / "slow.onnx", seconds=0.2)
    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"].with_overrides(input_size=64), providers=(OPENVINO,), precision="fp32")
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
        tensor = np.zeros((1, 3, 64, 64), np.float32)
        running = engine.infer(tensor, info.generation)
        pause = threading.Event()
        while not engine.busy and not running.done():
            pause.wait(0.001)
        engine.abort(running)
        try:
            running.result(60)
        except Superseded:
            pass  # stopped mid-run (a fast machine may finish it first, which is fine too)
        assert engine.infer(tensor, info.generation).result(60).prediction.shape == (64, 64)  # the request still works


@needs_bf16
def test_bf16_that_breaks_the_map_falls_back_to_fp32_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="depthwatch")
    model = cancelling_model(tmp_path / "cancelling.onnx")
    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=(OPENVINO,), precision="auto")
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
    assert info.providers == (OPENVINO,) and info.precision == "fp32" and info.chosen_by == "measured"
    bf16 = next(t for t in info.trials if t.precision == "bf16")
    assert bf16.ok and bf16.agreement < 0.995 and not bf16.eligible
    # One line per reduced precision refused: bf16, and fp16 too on a CPU that has it.
    reduced = [t for t in info.trials if t.precision != "fp32"]
    assert len(info.refused) == len(reduced) and all(not t.eligible for t in reduced)
    assert any(line.startswith("bf16 on OpenVINO: its maps correlate ") for line in info.refused)
    assert any(r.levelno == logging.WARNING and "precision: auto refused bf16 on OpenVINO" in r.message for r in caplog.records)
    assert precision_line("auto", info).startswith("fp32 (auto); refused bf16 on OpenVINO")
    # Remembered with the provider choice: the next start measures nothing and still says why.
    with Engine(spec) as again:
        second = again.wait_ready(120)
    assert again.measurements == 0 and second.chosen_by == "remembered"
    assert second.precision == "fp32" and second.refused == info.refused


@needs_bf16
def test_bf16_that_keeps_the_map_is_taken(tmp_path):
    model = brightness_model(tmp_path / "m.onnx", size=(64, 64))
    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=(OPENVINO,), precision="auto")
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
    bf16 = next(t for t in info.trials if t.precision == "bf16")
    assert bf16.ok and bf16.agreement >= 0.995, bf16
    # Faithful, so never refused; served where it is clearly faster than the reference (OpenVINO
    # fp32 here, the first trial: SWITCH), else fp32. On this 64x64 model both can take 0.2 ms.
    fp32 = next(t for t in info.trials if t.precision == "fp32")
    assert info.trials[0] is fp32 and bf16.eligible and not any(line.startswith("bf16") for line in info.refused)
    # The served one: the fastest faithful variant at SWITCH x fp32's time or less (bf16, or the int8
    # file that OpenVINO tries too), else fp32.
    faster = [t for t in info.trials[1:] if t.eligible and t.run_ms <= SWITCH * fp32.run_ms]
    assert info.precision == (min(faster, key=lambda t: t.run_ms).precision if faster else "fp32")


def test_openvino_runs_the_int8_file_where_its_maps_are_faithful_and_refuses_it_where_not(tmp_path, caplog):
    # OpenVINO's own int8 kernels run the quantized file: about half its fp32 time on the trained
    # FastDepth (benchmarks.realint8), on any CPU, not only where bf16 is.
    caplog.set_level(logging.INFO, logger="depthwatch")
    good = slow_model(tmp_path / "conv.onnx", layers=6, size=64, channels=16)  # 6 convolutions: int8 keeps it
    spec = ModelSpec(path=good, profile=PROFILES["midas-v21-small"], providers=(OPENVINO,), precision="int8")
    with Engine(spec) as engine:
        info = engine.wait_ready(120)
        prediction = engine.infer(np.full((1, 3, 64, 64), 0.5, np.float32), info.generation).result(60).prediction
    assert info.providers == (OPENVINO,) and info.precision == "int8" and prediction.shape == (64, 64)
    with Engine(dataclasses.replace(spec, precision="auto")) as engine:
        info = engine.wait_ready(120)
    int8 = next(t for t in info.trials if t.precision == "int8")
    assert int8.provider == OPENVINO and int8.ok and int8.agreement >= 0.995 and int8.eligible, int8

    bad = cancelling_model(tmp_path / "cancelling.onnx")  # brightness as a small difference of large numbers
    with Engine(ModelSpec(path=bad, profile=PROFILES["midas-v21-small"], providers=(OPENVINO,), precision="auto")) as engine:
        info = engine.wait_ready(120)
    int8 = next(t for t in info.trials if t.precision == "int8")
    assert int8.ok and int8.agreement < 0.995 and not int8.eligible and info.precision != "int8"
    assert any(line.startswith("int8 on OpenVINO: its maps correlate ") for line in info.refused), info.refused
    assert any("precision: auto refused int8 on OpenVINO" in r.message for r in caplog.records)


def test_precision_for_onnxruntime_cpu_is_fp32_and_a_reduced_one_is_said_to_not_apply(tmp_path, caplog):
    model = brightness_model(tmp_path / "m.onnx")
    with Engine(spec_for(model, precision="bf16")) as engine:
        info = engine.wait_ready(60)
    assert info.providers == (providers.CPU,) and info.precision == "fp32"
    assert any("precision bf16: CPU runs the graph in fp32" in r.message for r in caplog.records)


def test_no_process_is_created_with_openvino(tmp_path, tiny_model):
    """The daemon measures OpenVINO's precisions, serves from it, and never forks or execs."""
    if (why := strace_works()) is not None:
        pytest.skip(why)
    strace = shutil.which("strace")
    trace = tmp_path / "strace.txt"
    d = DaemonProcess(
        tmp_path / "d",
        tiny_model,
        wrapper=(strace, "-f", "-e", "trace=fork,vfork,clone,clone3,execve", "-o", str(trace)),
    )
    config = yaml.safe_load(d.config_path.read_text())
    config["model"].update(providers=["openvino"], precision="auto")
    d.config_path.write_text(yaml.safe_dump(config))
    d.start()
    try:
        depth = d.watch / "depth.jpg"
        for i in range(3):
            before = depth.stat().st_mtime_ns if depth.exists() else None
            frame = np.full((48, 64, 3), 40 + 60 * i, np.uint8)
            (d.watch / ".frame.tmp").write_bytes(cv2.imencode(".jpg", frame)[1].tobytes())
            os.rename(d.watch / ".frame.tmp", d.watch / "frame.jpg")
            wait_for(lambda: depth.exists() and depth.stat().st_mtime_ns != before, what="the depth map")
        os.kill(d.status()["pid"], signal.SIGTERM)
        assert d.proc.wait(60) == 0
    finally:
        d.close()
    assert "applied providers: OpenVINO" in d.log()
    assert_one_process(trace)


def test_a_start_that_remembers_onnxruntime_never_imports_openvino(tmp_path, tiny_model):
    """Importing OpenVINO costs ~15 MiB of RSS: a daemon serving from onnxruntime must not pay it."""
    from depthwatch.model import caches
    from depthwatch.model.choosing import choice

    spec = dataclasses.replace(spec_for(tiny_model), providers="auto")
    available = providers.available()
    assert OPENVINO in available
    digest = caches.model_digest(spec.path, spec.state_dir())
    key = choice.decision_key(digest, providers.runtimes_version(available), available, spec.precision)
    choice.Decisions(spec.state_dir() / "providers.json").put(key, spec.path, (providers.CPU, "fp32"), [])
    script = (
        "import sys\n"
        "from depthwatch.model.engine import Engine\n"
        "import dataclasses, pathlib\n"
        "from onnx_models import spec_for\n"
        f"spec = dataclasses.replace(spec_for(pathlib.Path({str(tiny_model)!r})), providers='auto')\n"
        "with Engine(spec) as engine:\n"
        "    info = engine.wait_ready(60)\n"
        "print(info.chosen_by, info.providers[0], 'openvino' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["remembered", providers.CPU, "False"]
