"""The benchmark suite's smoke test: every scenario runs at a tiny size and reports sane numbers.

`python -m benchmarks --quick` runs as a real process, with its real children
(two depthwatch daemons, the classic Flask server under Flask and under
gunicorn, the bare-session process); this checks the JSON it writes, that it
cleaned up its temporary folder and that none of its processes outlived it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

for _module in ("flask", "gunicorn", "psutil", "skimage", "onnx"):
    pytest.importorskip(_module, reason="the benchmarks need the bench extra: pip install -e '.[bench]'")

import psutil  # noqa: E402

from benchmarks import realint8  # noqa: E402
from depthwatch.frames.frameline import STAGES  # noqa: E402
from depthwatch.model.choosing import hardware  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = {
    "costs", "ceiling", "classic_flask", "classic_gunicorn", "classic_full", "bare", "burst", "latency", "scrub", "daemon",
    "refine_none", "refine_micro", "predict", "normalise", "bookkeeping",
}


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.timeout(600)
def test_quick_benchmark_runs_every_scenario(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "bench.json"
    env = {**os.environ, "TMPDIR": str(temp)}
    # Its own session, so a hung run can be ended with every process it started.
    # With the openvino extra, depthwatch serves from OpenVINO (precision auto), so the rows that run
    # ONNX Runtime fp32 beside the engine depthwatch picked are covered too, whatever is faster here.
    engine = ["--providers", "openvino"] if importlib.util.find_spec("openvino") is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(out), *engine],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # A guard against a hung run, not a speed limit: about 50 s on a quiet 2-core machine,
        # 100 s beside the rest of the suite, more on a slower CPU.
        stdout, stderr = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the quick benchmark was still running after 540 s (hung?): {stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    s = results["scenarios"]
    assert set(s) >= SCENARIOS

    assert results["machine"]["cores"] >= 1
    assert isinstance(results["machine"]["cpu_features"], list)  # the features every figure ran with
    first = s["first_start"]  # a model never measured: ready, then its first map, then the measurement
    assert _positive(first["ready_s"]) and _positive(first["first_map_s"]) and _positive(first["infer_ms"])
    assert first["measured_after_s"] >= first["ready_s"] and first["model_loads"] == 1
    assert results["derived"]["model_loads"] == 1
    assert results["settings"]["session"]["inter_op_num_threads"] == 1  # depthwatch's own settings

    costs = s["costs"]
    assert _positive(costs["infer_cpu_ms"]) and _positive(costs["image_cpu_ms"])
    assert _positive(results["derived"]["limit_fps"])

    for name in ("ceiling", "classic_flask", "classic_gunicorn", "burst"):
        assert _positive(s[name]["fps"]), name
    # What the daemon's own bookkeeping costs a frame, set against the burst's frame in the same run.
    assert _positive(s["bookkeeping"]["notes_us_per_frame"]) and _positive(s["bookkeeping"]["heartbeat_write_us"])
    assert _positive(results["derived"]["bookkeeping_share_of_burst_frame"])
    assert "bookkeeping (the supervisor's notes, one core):" in stdout
    if not results["machine"]["accelerated"]:
        assert _positive(s["parallel_ceiling"]["fps"])
        # One inference at a time: a run's CPU on the engine's threads, and the bound that leaves,
        # never above the bare loop; the burst is held to the limit with that bound beside it.
        assert _positive(s["ceiling"]["cpu_ms_per_frame"]) and _positive(s["ceiling"]["threads_cpu_ratio"])
        d = results["derived"]
        assert 0 < d["one_run_fps"] <= s["ceiling"]["fps"] and _positive(d["one_run_vs_limit"])
        assert _positive(d["one_run_ort_fps"]) and _positive(d["one_run_ort_vs_limit_ort"])
        assert f"one inference at a time ({results['engine']['chosen']})" in stdout
        limits = [t for t in results["targets"] if t["target"].startswith("burst vs machine limit")]
        assert [t["target"] for t in limits] == [
            f"burst vs machine limit ({e})" for e in dict.fromkeys((results["engine"]["chosen"], "CPU fp32"))
        ]
        assert all("one inference at a time allows" in t["goal"] and t["met"] is not None for t in limits)
        side = s["side_by_side"]  # the limit's two loops, alone and at once
        if results["machine"]["cores"] >= 2:
            for key in ("infer_ms_alone", "infer_ms_beside", "image_cpu_ms_alone", "image_cpu_ms_beside"):
                assert _positive(side[key]), key
            for key in ("side_infer_beside_vs_alone", "side_image_beside_vs_alone"):
                assert _positive(results["derived"][key]), key
            assert "the limit's two loops side by side" in stdout
    for server in ("classic_flask", "classic_gunicorn", "classic_full"):
        assert s[server]["outputs"] == s[server]["requests"] > 0, server
        assert _positive(s[server]["startup_s"])
    # The seed as written writes a map at the model's size; its loop doing depthwatch's job, at the frame's.
    assert s["classic_flask"]["output_size"] == [64, 64]
    assert s["classic_full"]["output_size"] == results["frames"]["size"]

    # The engine auto picked, named in every row; ONNX Runtime fp32 beside it when that is another engine.
    engine = results["engine"]
    assert engine["seed"] == "CPU fp32" and engine["chosen"].split()[1] in ("fp32", "bf16", "fp16", "int8")
    if importlib.util.find_spec("openvino") is not None:
        assert engine["chosen"].startswith("OpenVINO ")
    if engine["chosen"] != "CPU fp32":
        for name in ("burst_ort", "bare_ort", "costs_ort", "ceiling_ort"):
            assert name in s, name
        assert s["burst_ort"]["outputs"] == s["burst_ort"]["frames"] > 0
    for key in ("burst_vs_seed", "burst_ort_vs_seed", "burst_ort_vs_seed_full"):
        assert _positive(results["derived"][key]), key
    assert f"depthwatch burst ({engine['chosen']})" in stdout and "the seed as written, Flask (CPU fp32)" in stdout
    assert "seed's loop, depthwatch's job (CPU fp32)" in stdout

    predict = s["predict"]
    for mode in ("classic", "body"):
        assert predict[mode]["answered"] == predict[mode]["requests"] > 0, mode
        assert 0 < predict[mode]["p50_ms"] <= predict[mode]["p95_ms"]
    # One inference per classic request (warm-up included), though the watcher saw every write.
    assert predict["classic"]["inferences"] == predict["classic"]["requests"] + 2
    assert "depthwatch POST /predict" in stdout

    burst = s["burst"]
    assert burst["outputs"] == burst["frames"] > 0
    assert burst["failed"] == 0 and burst["model_loads"] == 1
    assert all(_positive(t) for t in burst["startup_s"])

    latency = s["latency"]
    assert latency["outputs"] == latency["frames"] > 0 and latency["failed"] == 0
    assert 0 < latency["p50_ms"] <= latency["p95_ms"]
    assert set(latency["daemon_stage_ms"]) >= {*STAGES, "total"}

    scrub = s["scrub"]
    assert scrub["writes"] >= 2
    assert 1 <= scrub["inferences"] <= scrub["writes"]
    assert _positive(scrub["last_map_ms"])

    normalise = s["normalise"]  # output.normalise frame against the default (stable), same run
    assert normalise["burst_frame"]["outputs"] == normalise["burst_frame"]["frames"] > 0
    for mode in ("stable", "frame"):
        assert normalise[f"latency_{mode}"]["outputs"] == normalise[f"latency_{mode}"]["frames"] > 0, mode
    assert normalise["latency_stable"]["cuts"] == 0 and normalise["latency_frame"]["cuts"] == 0  # one shot
    assert _positive(results["derived"]["burst_stable_vs_frame"])
    assert isinstance(results["derived"]["latency_stable_minus_frame_ms"], float)
    assert "output.normalise: burst stable" in stdout

    assert _positive(s["bare"]["peak_rss_bytes"]) and _positive(s["daemon"]["peak_rss_bytes"])
    assert s["daemon"]["model_loads"] == 1 and s["daemon"]["exit_code"] == 0
    assert _positive(results["derived"]["daemon_startup_s"]) and _positive(results["derived"]["bare_startup_s"])

    if importlib.util.find_spec("distributed") is not None:  # the farm extra
        farm = s["farm"]
        assert all(_positive(farm[k]["fps"]) for k in ("local", "workers_1", "workers_2"))
        assert math.isfinite(farm["overhead_ms_per_frame"]) and "once --farm, 2 local workers" in stdout

    if importlib.util.find_spec("av") is not None:  # the video extra: the clip rows
        clip = s["clip_throughput"]
        assert clip["frames"] > 0 and _positive(clip["clip"]["fps"]) and _positive(clip["stills"]["fps"])
        assert _positive(clip["clip_vs_stills"]) and "once CLIP (" in stdout
        memory = s["clip_memory"]
        assert memory["frames"] == 120 and _positive(memory["peak_rss_bytes"]) and memory["samples"] > 0
        assert "daemon RSS over a 120-frame 320x180 clip" in stdout

    # refine: edges (the default, in burst and latency above) against none, in the same run.
    plain = s["refine_none"]
    assert plain["burst"]["outputs"] == plain["burst"]["frames"] > 0 and plain["burst"]["failed"] == 0
    assert plain["latency"]["outputs"] == plain["latency"]["frames"] > 0
    assert _positive(results["derived"]["burst_edges_vs_none"])
    for key in ("1080p_jpeg", "1080p_full", "4K_jpeg", "4K_full"):
        row = s["refine_micro"][key]
        assert _positive(row["refine_ms"]) and _positive(row["render_edges_ms"]) and _positive(row["render_none_ms"]), key
    assert "refine: none (plain upscale)" in stdout

    # Every target was measured, and the table shows each with its figure and verdict.
    assert results["targets"] and all(t["value"] is not None and t["met"] is not None for t in results["targets"])
    for t in results["targets"]:
        assert f"[{'met   ' if t['met'] else 'MISSED'}] {t['target']}: " in stdout, t
    assert "depthwatch burst" in stdout

    # It cleaned up after itself: no temporary folder, no process left running.
    # (onnxruntime itself leaves a small `.ses` file in $TMPDIR; that one is not ours.)
    assert [p.name for p in temp.iterdir() if p.name.startswith("depthwatch-bench-")] == []
    assert _processes_mentioning(str(temp)) == []


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment names `text` (every child of the run does)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or []) or any(text in v for v in p.environ().values()):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def test_the_real_network_made_fp32_goes_through_autos_int8_gate(tmp_path: Path, fastdepth: Path) -> None:
    # On AVX2 alone (no VNNI) int8's u8s8 products saturate: QEMU's Haswell gives this machine's
    # onnxruntime that CPU's kernels, whatever CPU runs the suite (agreements only, not times). An
    # x86 CPU without VNNI or AMX runs those kernels itself: emulating them there checks nothing more
    # (and costs half of this test's 35 s of CPU on such a machine, an AMD EPYC with AVX2 alone).
    x86 = platform.machine() == "x86_64"
    avx2_kernels = x86 and not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(hardware.cpu_features())
    emulate = x86 and not avx2_kernels and shutil.which("qemu-x86_64") is not None
    out = tmp_path / "realint8.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.realint8", "--model", str(fastdepth), "--runtime", "onnxruntime", "--rounds", "1"]
        + ["--json", str(out)]
        + (["--emulate-cpu", "Haswell"] if emulate else []),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    # The fp32 copy is the same network: its maps follow the quantized original's (r 0.989 here).
    assert result["fp32 copy vs the quantized original"] > 0.95
    trials = {(t["engine"], t["precision"]): t for t in result["trials"]}
    int8 = trials[("CPUExecutionProvider", "int8")]
    assert int8["error"] is None and 0.9 < int8["agreement"] <= 1.0 and _positive(int8["run_ms"])
    assert "auto serves " in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["realint8.json"]  # its temporary folder is gone
    # What auto quantizes (8-bit weights, the first and last convolution in fp32) is faithful on
    # this CPU's kernels and on AVX2's: 0.9976 and 0.9975 here, where the whole graph in int8 gives
    # 0.9954 and 0.9904 (saturated), and 7-bit weights (onnxruntime's advice for AVX2) 0.9693.
    found = [result["int8 agreement with fp32"]]
    if emulate:
        assert "error" not in result["emulated"], result["emulated"]
        found.append(result["emulated"]["agreements"])
    for engines in found:
        assert list(engines) == ["onnxruntime CPU"]  # OpenVINO's int8: tests/test_openvino.py
        agreements = engines["onnxruntime CPU"]
        assert list(agreements) == list(realint8.VARIANTS)
        assert all(0.9 < r <= 1.0 for r in agreements.values()), agreements
        assert agreements["depthwatch's: 8-bit weights, first and last conv fp32"] >= result["gate"], agreements
    assert all(_positive(ms) for engine in result["int8 ms a run"].values() for ms in engine.values())
    if x86 and not emulate and not avx2_kernels:
        pytest.skip("int8 on AVX2's kernels not checked: qemu-x86_64 is not installed (apt-get install qemu-user)")


def test_one_inference_at_a_time_is_the_limit_with_what_the_engines_threads_cost() -> None:
    """The bound the burst is reported beside: the limit's run CPU grown by the threads' ratio, never above the bare loop."""
    from benchmarks import report

    results = {
        "machine": {"cores": 2, "accelerated": False},
        "scenarios": {
            "costs": {"infer_cpu_ms": 30.0, "image_cpu_ms": 10.0},
            "ceiling": {"fps": 60.0, "threads_cpu_ratio": 1.1},
        },
    }
    assert report.limit_fps(results, 60.0) == pytest.approx(2000 / 40)
    assert report.one_run_fps(results) == pytest.approx(2000 / (33 + 10))  # below the limit, by the threads' cost
    results["scenarios"]["ceiling"]["fps"] = 40.0
    assert report.one_run_fps(results) == 40.0  # and never above the bare loop
    del results["scenarios"]["ceiling"]["threads_cpu_ratio"]
    assert report.one_run_fps(results) is None  # not measured: no bound claimed
    results["machine"]["accelerated"] = True
    results["scenarios"]["ceiling"]["threads_cpu_ratio"] = 1.1
    assert report.one_run_fps(results) is None  # beside an accelerator the limit is the bare loop itself
