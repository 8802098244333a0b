"""Providers: auto measures once per model and machine, CoreML's compiled models are keyed by contents.

No accelerator exists on this Linux machine, so stand-in sessions play them:
each is a real CPU session of the real model that reports an accelerator's name
and takes a known extra time per run (0.3 s for the slow one, none for the
fast one, 0.1 s added to CPU so the fast one wins by a wide margin). The
engine sees them through its `available_providers` seam, as it would see
onnxruntime's own list.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx_models import brightness_model

from depthwatch.model import caches, providers
from depthwatch.model.choosing import gauges
from depthwatch.model.choosing.trials import SWITCH
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec

CPU, CUDA, COREML = providers.CPU, providers.CUDA, providers.COREML
SLOW, FAST, CPU_DELAY = 0.3, 0.0, 0.1


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch) -> Path:
    """Every test keeps depthwatch's cache (digests, decisions, compiled models) in its own folder."""
    home = tmp_path / "cache-home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "depthwatch"


class StandIn:
    """A real CPU session wearing an accelerator's name, `delay` seconds slower per run."""

    def __init__(self, session, provider: str, delay: float, fail: bool = False) -> None:
        self.session, self.provider, self.delay, self.fail = session, provider, delay, fail

    def get_providers(self):
        return [self.provider] if self.provider == CPU else [self.provider, CPU]

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def end_profiling(self):
        return self.session.end_profiling()

    def run(self, names, feed, options=None):
        if self.fail:
            raise RuntimeError(f"{self.provider}: device lost")
        if self.delay:
            time.sleep(self.delay)
        return self.session.run(names, feed, options)


class Machine:
    """The session factory of a machine with stand-in accelerators; records every session made."""

    def __init__(self, delays: dict[str, float], failing: tuple[str, ...] = ()) -> None:
        self.delays, self.failing = delays, failing
        self.sessions: list[tuple[str, str]] = []  # (first provider, thread name)

    def available(self) -> list[str]:
        return [*self.delays, "AzureExecutionProvider"]

    def __call__(self, path, sess_options=None, providers=None):
        first, options = providers[0] if isinstance(providers[0], tuple) else (providers[0], {})
        self.sessions.append((first, threading.current_thread().name))
        cache = options.get("ModelCacheDirectory")
        if cache and not any(p.name != caches.MARKER for p in Path(cache).iterdir()):
            (Path(cache) / "compiled.mlmodelc").write_bytes(b"compiled")  # what CoreML leaves there
        session = onnxruntime.InferenceSession(path, sess_options=sess_options, providers=[CPU])
        self.last = StandIn(session, first, self.delays[first], fail=first in self.failing)
        return self.last


def spec(model: Path, providers_: str | tuple[str, ...] = "auto", precision: str = "auto") -> ModelSpec:
    return ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=providers_, precision=precision)


def load(model: Path, machine: Machine, providers_: str | tuple[str, ...] = "auto", precision: str = "auto"):
    """A start of batch work (`once`): load, measuring first if need be, note what happened, stop."""
    engine = Engine(spec(model, providers_, precision), session_factory=machine, available_providers=machine.available)
    with engine:
        info = engine.wait_ready(120)
        result = engine.infer(np.zeros((1, 3, 32, 32), np.float32), info.generation).result(60)
    assert result.prediction.shape == (32, 32)
    return engine, info


def test_auto_measures_once_keeps_the_fastest_and_remembers_it_across_restarts(tmp_path, cache_home, caplog):
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: FAST, CPU: CPU_DELAY})
    with caplog.at_level(logging.INFO, logger="depthwatch"):
        first, info = load(model, machine)
    assert first.measurements == 1 and first.load_count == 1
    assert info.providers == (CUDA, CPU) and info.chosen_by == "measured"
    trials = {t.provider: t for t in info.trials}
    assert set(trials) == {COREML, CUDA, CPU} and all(t.ok for t in trials.values())
    assert trials[CUDA].run_ms < trials[CPU].run_ms < trials[COREML].run_ms
    # One session per candidate (the second CPU one is int8), then the serving one, all on the
    # inference thread, before ready.
    assert [p for p, _ in machine.sessions] == [CPU, COREML, CUDA, CPU, CUDA]
    assert {t for _, t in machine.sessions} == {"depthwatch-inference"}
    figures = [m for m in caplog.messages if m.startswith("providers: measured m.onnx: ")]
    assert len(figures) == 1 and figures[0].endswith("; auto uses CUDAExecutionProvider at fp32")  # int8 was measured
    decisions = json.loads((cache_home / "providers.json").read_text())
    assert [d["provider"] for d in decisions.values()] == [CUDA]

    machine.sessions.clear()
    second, again = load(model, machine)  # a restart
    assert second.measurements == 0 and again.chosen_by == "remembered"
    assert again.providers == (CUDA, CPU)
    assert [p for p, _ in machine.sessions] == [CUDA]  # the serving session only


def test_an_accelerator_slower_than_cpu_is_not_chosen(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    engine, info = load(model, Machine({COREML: SLOW, CPU: CPU_DELAY}))
    assert engine.measurements == 1
    assert info.providers == (CPU,)


def test_an_engine_only_a_little_faster_than_the_reference_is_not_chosen(tmp_path, cache_home):
    """A lead of 5% on one frame at a time is noise, and does not survive a burst: the reference serves.
    One that takes 0.6 of the reference's time serves (the line is trials.SWITCH, 0.85)."""
    for scale, accelerated, chosen in ((1.0, 0.95 * CPU_DELAY, (CPU,)), (2.0, 0.6 * CPU_DELAY, (CUDA, CPU))):
        model = brightness_model(tmp_path / f"m{scale}.onnx", scale=scale)  # two models: two choices
        engine, info = load(model, Machine({CUDA: accelerated, CPU: CPU_DELAY}), precision="fp32")
        trials = {t.provider: t for t in info.trials}
        assert trials[CUDA].eligible and trials[CPU].eligible, trials  # both measured in full (not lazy)
        # The lead as measured, on the side of the line its delays put it (a margin of 10% of a run at
        # least, where sleeps that oversleep under load move each run by a few ms).
        lead = trials[CUDA].run_ms / trials[CPU].run_ms
        assert (lead < SWITCH) == (chosen == (CUDA, CPU)), (lead, trials)
        assert engine.measurements == 1 and info.providers == chosen, (scale, trials)
    decisions = json.loads((cache_home / "providers.json").read_text())
    assert sorted(d["provider"] for d in decisions.values()) == [CPU, CUDA]  # remembered as measured


def test_a_failing_accelerator_is_dropped_from_the_measurement(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    engine, info = load(model, Machine({CUDA: FAST, COREML: SLOW, CPU: CPU_DELAY}, failing=(CUDA,)))
    trials = {t.provider: t for t in info.trials}
    assert trials[CUDA].error == f"the model failed its first run: {CUDA}: device lost" and not trials[CUDA].ok
    assert info.providers == (CPU,)


def test_a_changed_model_is_measured_again(tmp_path, cache_home):
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: FAST, CPU: CPU_DELAY})
    assert load(model, machine)[0].measurements == 1
    assert load(model, machine)[0].measurements == 0
    brightness_model(model, scale=3.0)  # a newer file under the same name
    engine, info = load(model, machine)
    assert engine.measurements == 1 and info.chosen_by == "measured"
    assert len(json.loads((cache_home / "providers.json").read_text())) == 2


def test_an_explicit_list_is_honoured_without_measuring(tmp_path, cache_home):
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: SLOW, CUDA: FAST, CPU: CPU_DELAY})
    engine, info = load(model, machine, ("coreml",))
    assert engine.measurements == 0 and info.chosen_by == "" and info.trials == ()
    assert info.providers == (COREML, CPU)  # the slow one, because the config says so
    assert [p for p, _ in machine.sessions] == [COREML]
    assert not (cache_home / "providers.json").exists()


def test_an_explicit_lists_precision_choice_is_not_remembered_as_autos(tmp_path, cache_home):
    """An explicit list measures only its own provider's precisions; that is no answer for `auto`.

    Stored under auto's key, a `check` with `providers: [cuda]` on a machine without CUDA (falling back
    to the CPU) would make every later `auto` daemon and worker serve from the CPU, saying "measured before".
    """
    model = brightness_model(tmp_path / "m.onnx")
    machine = Machine({COREML: FAST, CPU: CPU_DELAY})
    _, listed = load(model, machine, ("cpu",))
    assert listed.providers[0] == CPU
    engine, auto = load(model, machine)
    assert auto.providers[0] == COREML and auto.chosen_by == "measured", (auto.providers, auto.chosen_by)


def test_cpu_alone_at_fp32_is_not_measured_and_nothing_is_written(tmp_path, cache_home):
    model = brightness_model(tmp_path / "m.onnx")
    engine, info = load(model, Machine({CPU: 0.0}), precision="fp32")
    assert engine.measurements == 0 and info.providers == (CPU,) and info.chosen_by == ""
    assert not cache_home.exists()


def test_a_model_changed_under_the_same_name_gets_a_new_cache_key_and_the_old_entry_is_pruned(tmp_path, cache_home):
    model = brightness_model(tmp_path / "m.onnx")
    other = brightness_model(tmp_path / "other.onnx", scale=2.0)
    machine = Machine({COREML: 0.0, CPU: 0.0})
    _, first = load(model, machine, ("coreml",))
    _, kept = load(other, machine, ("coreml",))
    assert first.compiled is not None and not first.compiled.existed
    assert first.compiled.path.parent == cache_home / "coreml"
    _, again = load(model, machine, ("coreml",))
    assert again.compiled == caches.CompiledFolder(first.compiled.path, existed=True)  # from the cache

    brightness_model(model, scale=5.0)  # fetched anew under the same name
    _, changed = load(model, machine, ("coreml",))
    assert changed.compiled.path != first.compiled.path and not changed.compiled.existed
    assert not first.compiled.path.exists()  # the stale compiled model is gone
    assert kept.compiled.path.is_dir()  # another model's entry stays
    assert sorted(p.name for p in (cache_home / "coreml").iterdir()) == sorted(
        [changed.compiled.path.name, kept.compiled.path.name]
    )


def test_the_cache_key_covers_contents_runtime_and_options():
    base = caches.cache_key("ab" * 32, "1.21.0", {"ModelFormat": "MLProgram"})
    assert base == caches.cache_key("ab" * 32, "1.21.0", {"ModelFormat": "MLProgram"})
    assert base != caches.cache_key("cd" * 32, "1.21.0", {"ModelFormat": "MLProgram"})
    assert base != caches.cache_key("ab" * 32, "1.22.0", {"ModelFormat": "MLProgram"})
    assert base != caches.cache_key("ab" * 32, "1.21.0", {"ModelFormat": "NeuralNetwork"})


def test_the_cache_stays_bounded(tmp_path):
    root = tmp_path / "coreml"
    paths = []
    for i in range(caches.MAX_ENTRIES + 3):
        model = brightness_model(tmp_path / f"m{i}.onnx", scale=float(i + 1))
        digest = caches.model_digest(model, tmp_path)
        paths.append(caches.open_entry(root, model, digest, "1.21.0", {}).path)
    assert len(list(root.iterdir())) == caches.MAX_ENTRIES
    assert all(p.exists() for p in paths[-caches.MAX_ENTRIES :])  # the most recent stay


def test_the_model_digest_is_remembered_until_the_file_changes(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    real = caches.model_digest(model, tmp_path)
    index = tmp_path / "digests.json"
    recorded = json.loads(index.read_text())
    recorded[str(model)]["sha256"] = "f" * 64  # if it were hashed again, this would not come back
    index.write_text(json.dumps(recorded))
    assert caches.model_digest(model, tmp_path) == "f" * 64
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert caches.model_digest(model, tmp_path) == real


def test_node_counts_read_the_provider_of_each_node_from_a_real_trace(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=[CPU])
    for _ in range(3):  # each node counted once, however many runs the profile holds
        session.run(None, {"image": np.zeros((1, 3, 32, 32), np.float32)})
    counts = gauges.node_counts(session.end_profiling())
    assert counts == {CPU: len(onnx.load(str(model)).graph.node)} == {CPU: 2}  # ReduceMean, Mul


def test_check_providers_prints_the_table_with_the_real_model(tmp_path, fastdepth):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DEPTHWATCH_"))}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "check", "--model", str(fastdepth), "--profile", "fastdepth-nyu", "--providers"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("provider "))
    assert lines[header].split() == ["provider", "precision", "graph", "share", "load", "per", "frame", "peak", "memory", "maps"]
    row = lines[header + 1].split()
    assert row[:5] == ["CPU", "fp32", "100%", "of", row[4]] and int(row[4]) > 10  # every node on CPU
    assert float(row[5]) > 0 and row[6] == "s"
    assert float(row[7]) > 0 and row[8] == "ms"
    assert float(row[9]) > 0 and row[10] == "MiB"
    assert row[11] == "reference"
    rows = lines[header + 1 : next(i for i, line in enumerate(lines) if line.startswith("contract:"))]
    picked = [r for r in rows if r.endswith("<- auto picks")]
    assert len(picked) == 1
    served = next(line for line in lines if line.startswith("providers: ")).split()[1].rstrip(",")
    assert picked[0].split()[0] == providers.short(served)
    if importlib.util.find_spec("openvino") is not None:  # the openvino extra: measured beside CPU
        assert any(r.split()[:2] == ["OpenVINO", "fp32"] for r in rows), rows
    assert "(auto: measured now)" in next(line for line in lines if line.startswith("providers: "))
    # The model comes quantized: its fp32 variant (the graph as it is) computes in int8, and `check` says so.
    shown = "int8" if picked[0].split()[1] == "fp32" else picked[0].split()[1]
    assert next(line for line in lines if line.startswith("precision: ")).startswith(f"precision: {shown} (auto)")
    assert "providers: measured fastdepth_224_nyu_int8.onnx: CPU fp32 " in done.stderr
    assert lines[-1] == "ok"


def test_coreml_gets_the_symbolic_batch_pinned_and_cpu_keeps_the_graph_as_it_is(tmp_path):
    import onnx as onnx_

    model = tmp_path / "dynamic.onnx"
    graph = onnx_.load(str(brightness_model(model, size=None)))
    graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    onnx_.save(graph, str(model))
    shapes = {}
    for wanted in (("coreml",), ("cpu",)):
        machine = Machine({COREML: 0.0, CPU: 0.0})
        engine = Engine(spec(model, wanted), session_factory=machine, available_providers=machine.available)
        with engine:
            engine.wait_ready(60)
        shapes[wanted[0]] = machine.last.get_inputs()[0].shape
    # Height and width follow the frame's aspect (the profile keeps it), so only the batch is pinned.
    assert shapes == {"coreml": [1, 3, "height", "width"], "cpu": ["batch_size", 3, "height", "width"]}


def test_declared_inputs_are_read_from_the_file_without_loading_it(fastdepth, tmp_path):
    from depthwatch.model import graph_inputs

    assert graph_inputs.declared_inputs(fastdepth) == [("image", [1, 224, 224, 3])]
    assert graph_inputs.fixed_dims(fastdepth, None) == {}  # nothing symbolic to pin
    dynamic = brightness_model(tmp_path / "d.onnx", size=None)
    assert graph_inputs.fixed_dims(dynamic, 256) == {"height": 256, "width": 256}
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 64)
    assert graph_inputs.fixed_dims(tmp_path / "junk.onnx", 256) == {}


def test_an_unwritable_cache_costs_the_cache_not_the_model(tmp_path, caplog):
    model = brightness_model(tmp_path / "m.onnx")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    machine = Machine({COREML: 0.0, CPU: 0.0})
    spec_ = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=("coreml",), coreml_cache=blocked / "coreml")
    with caplog.at_level(logging.WARNING, logger="depthwatch"), Engine(spec_, session_factory=machine, available_providers=machine.available) as engine:
        info = engine.wait_ready(60)
    assert info.providers == (COREML, CPU) and info.compiled is None
    assert any(m.startswith(f"cannot use the compiled-model cache in {blocked / 'coreml'} (") for m in caplog.messages)


def test_check_providers_on_a_busy_machine_remembers_the_choice_as_busy(tmp_path):
    """`check --providers` (and `once`, a farm worker) says a measurement was contended by other processes
    and remembers it as busy, so the next start measures again: kept as a quiet one, a slower engine picked
    under load would serve every later start, never measured again."""
    from onnx_models import slow_model

    model = slow_model(tmp_path / "conv.onnx", layers=6, size=64, channels=16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DEPTHWATCH_"))}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "depthwatch", "check", "--model", str(model), "--profile", "midas-v21-small", "--providers"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert done.returncode == 0, done.stderr
    assert "the measurement ran while other processes kept" in done.stderr, done.stderr[-2000:]
    (record,) = json.loads((tmp_path / "cache" / "depthwatch" / "providers.json").read_text()).values()
    assert record["busy"] is True


def test_a_cache_entry_two_copies_of_a_model_share_stays_when_one_copy_changes(tmp_path):
    """Two projects' copies of one model share its compiled (or int8) entry, which stays while any copy uses
    it: changing one copy leaves it to the other (a marker naming only the last user would remove it, and the
    other's next start would make it again before `ready`, a minute of quantizing for a large model), and it
    goes once no copy is left."""
    root = tmp_path / "int8"
    first, second = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    for path in (first, second):
        path.parent.mkdir()
        brightness_model(path)
    digest = caches.model_digest(first, tmp_path)
    assert caches.model_digest(second, tmp_path) == digest
    shared = caches.open_entry(root, first, digest, "1.0", {}).path
    assert caches.open_entry(root, second, digest, "1.0", {}).path == shared
    (shared / "model.int8.onnx").write_bytes(b"made once")
    brightness_model(second, scale=2.0)  # the second project's copy changed
    changed = caches.model_digest(second, tmp_path)
    assert changed != digest
    caches.open_entry(root, second, changed, "1.0", {})
    assert (shared / "model.int8.onnx").read_bytes() == b"made once"  # still the first copy's
    assert caches.open_entry(root, first, digest, "1.0", {}).existed
    first.unlink()  # no copy left that uses it: removed
    caches.open_entry(root, second, changed, "1.0", {})
    assert not shared.exists()
