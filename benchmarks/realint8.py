"""int8 on a trained depth network: the shared FastDepth, made fp32 again, through `precision: auto`.

The benchmark's stand-in has random weights, and random weights do not survive
int8 (its maps correlate 0.97-0.98 with fp32's, under the 0.995 the gate asks),
so on a CPU without bf16 `auto` serves it in fp32 and the "int8 where
faithful" row of the benchmark cannot show what a trained model would do. The one
trained network here is the shared FastDepth, which comes quantized (ST's int8
build), so `auto` never quantizes it. Its fp32 copy (`fp32_copy`: each
quantized weight multiplied out, each quantize/dequantize pair of activations
dropped) is that trained network in fp32, the way a user's model arrives; this
runs it through the engine's own measurement, and prints each variant's time
and its maps' agreement with fp32 on the probe images, for three ways of
quantizing it (`VARIANTS`): depthwatch's (8-bit weights, the first and last
convolution in fp32), the whole graph with 8-bit weights, and the whole graph
with 7-bit weights (onnxruntime's `reduce_range`, its advice for AVX2 alone).

A CPU's int8 kernels decide the agreement: with VNNI or AMX the products are
exact, on AVX2 alone u8s8 products saturate. `--emulate-cpu Haswell` also runs
the agreements under QEMU's user-mode emulation of that CPU (`qemu-x86_64`,
Debian's `qemu-user`), whose CPUID onnxruntime's kernels are chosen by: an
AVX2 machine's figures on any x86 machine, agreements only (an emulated run's
time means nothing).

    python -m benchmarks.realint8 [--model QDQ.onnx --profile NAME] [--emulate-cpu Haswell] [--runtime onnxruntime openvino]
                                   [--rounds 15] [--json OUT]

Nothing is written beside the model: the fp32 copy, the int8 files and the
engine's cache live in a temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: The shared material, as the tests find it: $DEPTHWATCH_SHARED, else ../shared beside the checkout.
SHARED = Path(os.environ.get("DEPTHWATCH_SHARED") or Path(__file__).resolve().parents[2] / "shared").expanduser()
SHARED_FASTDEPTH = SHARED / "models" / "fastdepth_224_nyu_int8.onnx"
#: The ways of quantizing compared: a label, and `quantize._quantize`'s keywords.
VARIANTS = {
    "depthwatch's: 8-bit weights, first and last conv fp32": {},
    "whole graph, 8-bit weights": {"ends_in_fp32": False},
    "whole graph, 7-bit weights (reduce_range)": {"ends_in_fp32": False, "reduce_range": True},
}
#: The runtimes that run an int8 (QDQ) file here, by the name `--runtime` takes.
RUNTIMES = ("onnxruntime", "openvino")


def fp32_copy(source: Path, target: Path) -> Path:
    """`source` (a QDQ graph) as an fp32 graph: the same network without its quantization.

    A DequantizeLinear of a constant becomes the constant it stands for; every
    other QuantizeLinear and DequantizeLinear is dropped, its consumers reading
    what it was given, so the activations stay float all the way (the ops
    between such pairs, a Transpose or a Reshape, do not care). The graph is
    left as a float export would be, with no Identity nodes in the way of the
    quantizer's patterns. An input that was uint8 with scale 1/255 and zero
    point 0 becomes float in [0, 1], which is what a float input gets from
    depthwatch with a profile's mean 0 and std 1 (any other input scale is
    refused: the copy would take other numbers than the original).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    nodes: list[Any] = []
    folded: dict[str, Any] = {}
    same: dict[str, str] = {}  # a dropped quantize or dequantize's output -> the tensor it passed on
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inputs:
            scale = float(constants[node.input[1]].ravel()[0])
            zero = int(constants[node.input[2]].ravel()[0]) if len(node.input) > 2 and node.input[2] else 0
            if abs(scale * 255 - 1) > 1e-3 or zero != 0:
                raise ValueError(f"{source.name}: its input is scaled by {scale:g} from {zero}, not 1/255 from 0")
        if node.op_type == "DequantizeLinear" and node.input[0] in constants:
            q = constants[node.input[0]].astype(np.float32)
            scale = constants[node.input[1]].astype(np.float32)
            zero = constants[node.input[2]].astype(np.float32) if len(node.input) > 2 and node.input[2] else np.zeros_like(scale)
            if scale.ndim == 1 and q.ndim > 0:  # per channel, along `axis` (1 unless it says)
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                shape = [1] * q.ndim
                shape[axis] = -1
                scale, zero = scale.reshape(shape), zero.reshape(shape)
            folded[node.output[0]] = numpy_helper.from_array(((q - zero) * scale).astype(np.float32), node.output[0])
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.output[0] not in outputs:
            same[node.output[0]] = same.get(node.input[0], node.input[0])
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear"):  # the graph's output keeps its name
            nodes.append(helper.make_node("Identity", [same.get(node.input[0], node.input[0])], [node.output[0]], name=node.name))
        else:
            node.input[:] = [same.get(name, name) for name in node.input]
            nodes.append(node)
    used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name in used and i.name not in folded]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [t for name, t in folded.items() if name in used])
    del graph.value_info[:]  # the int8 types of what are now float tensors
    for value in graph.input:
        value.type.tensor_type.elem_type = TensorProto.FLOAT
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target


def _session(model: Path) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])


def _maps(session: Any, tensors: list[np.ndarray]) -> list[np.ndarray]:
    name = session.get_inputs()[0].name
    return [session.run(None, {name: t})[0] for t in tensors]


def measure(
    source: Path, profile_name: str, work: Path, emulate: str | None = None, rounds: int = 15, runtimes: tuple[str, ...] = RUNTIMES
) -> dict[str, Any]:
    """The fp32 copy's agreement with its source, auto's trials on it, and each int8 variant's agreement.

    `emulate`: a QEMU CPU model to measure the agreements on as well (`_emulated`); `rounds`: of `timings`;
    `runtimes`: those the int8 files run on (auto's own trials take every runtime installed).
    """
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # the engine's measurement and int8 files, here only
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    from depthwatch.model.choosing import hardware, precision, quantize
    from depthwatch.model.contract import read_contract
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    profile = PROFILES[profile_name]
    fp32 = fp32_copy(source, work / (source.stem.replace("_int8", "") + "_fp32.onnx"))
    fp32_session, source_session = _session(fp32), _session(source)
    contract = read_contract(fp32_session)
    tensors = precision.probe_tensors(contract, profile)  # the gate's probes
    calibration = precision.probe_tensors(contract, profile, quantize.CALIBRATION_IMAGES)  # a fast model's
    reference = _maps(fp32_session, tensors)
    original = tensors  # the same images, as the quantized original takes them
    if read_contract(source_session).input_dtype == np.uint8:
        original = [np.clip(t * 255 + 0.5, 0, 255).astype(np.uint8) for t in tensors]
    copy_agreement = precision.agreement(_maps(source_session, original), reference)

    with Engine(ModelSpec(path=fp32, profile=profile, providers="auto", precision="auto")) as engine:
        engine.wait_ready(600)
        info = engine.info
        assert info is not None
    trials = [
        {
            "engine": t.provider,
            "precision": t.precision,
            "run_ms": t.run_ms,
            "agreement": t.agreement,
            "eligible": t.eligible,
            "error": t.error,
        }
        for t in info.trials
    ]
    np.save(work / "probes.npy", np.stack(tensors))
    np.save(work / "reference.npy", np.stack(reference))
    for n, keywords in enumerate(VARIANTS.values()):
        quantize._quantize(fp32, work / f"int8-{n}.onnx", contract.input_name, calibration, **keywords)
    emulated = _emulated(work, emulate, runtimes) if emulate else None
    return {
        "model": source.name,
        "cpu": " ".join(hardware.cpu_features()),
        "fp32 copy vs the quantized original": copy_agreement,
        "served": {"engine": info.providers[0], "precision": info.precision, "chosen_by": info.chosen_by},
        "trials": trials,
        "int8 agreement with fp32": agreements(work, runtimes),
        "int8 ms a run": timings(work, fp32, rounds, runtimes=runtimes),
        "emulated": emulated,
        "gate": precision.FAITHFUL,
    }


def _engines(runtimes: tuple[str, ...] = RUNTIMES) -> dict[str, Callable[[Path], Any]]:
    """Those of `runtimes` installed: onnxruntime's CPU provider, and OpenVINO (f32 outside the int8 nodes)."""
    from depthwatch.model.sessions import openvino

    made: dict[str, Callable[[Path], Any]] = {}
    if "onnxruntime" in runtimes:
        made["onnxruntime CPU"] = _session
    if "openvino" in runtimes and openvino.installed():
        made["OpenVINO"] = lambda path: openvino.OpenVINOSession(path, "fp32")
    return made


def agreements(work: Path, runtimes: tuple[str, ...] = RUNTIMES) -> dict[str, dict[str, float]]:
    """Per runtime, each variant's agreement with fp32 on the probe images, on this CPU's kernels (files from `measure`)."""
    from depthwatch.model.choosing import precision

    tensors = list(np.load(work / "probes.npy"))
    reference = list(np.load(work / "reference.npy"))
    return {
        engine: {label: precision.agreement(reference, _maps(make(work / f"int8-{n}.onnx"), tensors)) for n, label in enumerate(VARIANTS)}
        for engine, make in _engines(runtimes).items()
    }


def timings(work: Path, fp32: Path, rounds: int = 15, runs: int = 10, runtimes: tuple[str, ...] = RUNTIMES) -> dict[str, dict[str, float]]:
    """Per runtime, ms a run of fp32 and of each variant on one probe image (its own threads: every core),
    medians of `rounds` rounds of `runs`, the files taking turns within each round so that a change in the
    machine's speed falls on all of them alike."""
    tensor = np.load(work / "probes.npy")[0]
    files = {"fp32": fp32, **{label: work / f"int8-{n}.onnx" for n, label in enumerate(VARIANTS)}}
    out: dict[str, dict[str, float]] = {}
    for engine, make in _engines(runtimes).items():
        sessions = {label: make(path) for label, path in files.items()}
        feeds = {label: {s.get_inputs()[0].name: tensor} for label, s in sessions.items()}
        times: dict[str, list[float]] = {label: [] for label in files}
        for label, s in sessions.items():
            for _ in range(3):
                s.run(None, feeds[label])
        for _ in range(rounds):
            for label, s in sessions.items():
                start = time.perf_counter()
                for _ in range(runs):
                    s.run(None, feeds[label])
                times[label].append((time.perf_counter() - start) / runs * 1000)
        out[engine] = {label: statistics.median(v) for label, v in times.items()}
    return out


def _emulated(work: Path, cpu: str, runtimes: tuple[str, ...]) -> dict[str, Any]:
    """`agreements` again in a child under QEMU's emulation of `cpu`: that CPU's kernels, on this machine."""
    import shutil
    import subprocess

    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        return {"cpu": cpu, "error": "qemu-x86_64 is not installed (Debian: apt-get install qemu-user)"}
    done = subprocess.run(
        [qemu, "-cpu", cpu, sys.executable, "-m", "benchmarks.realint8", "--agreements-in", str(work), "--runtime", *runtimes],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "warning: TCG" not in line]
        return {"cpu": cpu, "error": (lines or ["exit status %d" % done.returncode])[-1]}
    return {"cpu": cpu, "agreements": json.loads(done.stdout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.realint8", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=SHARED_FASTDEPTH, help="a QDQ (int8) ONNX model; the shared FastDepth by default")
    parser.add_argument("--profile", default="fastdepth-nyu")
    parser.add_argument("--emulate-cpu", metavar="CPU", help="also the agreements under qemu-x86_64 -cpu CPU (Haswell: AVX2 alone)")
    parser.add_argument("--runtime", nargs="+", choices=RUNTIMES, default=list(RUNTIMES), help="what runs the int8 files (default both)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of 10 runs each int8 file is timed in (default 15)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--agreements-in", type=Path, help=argparse.SUPPRESS)  # the emulated child's work
    args = parser.parse_args(argv)
    if args.agreements_in:
        print(json.dumps(agreements(args.agreements_in, tuple(args.runtime))))
        return 0
    if not args.model.is_file():
        print(f"benchmarks.realint8: {args.model} is not here (the shared FastDepth model, or --model)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dw-realint8-") as work:
        result = measure(args.model, args.profile, Path(work), args.emulate_cpu, args.rounds, tuple(args.runtime))
    print(f"{result['model']} made fp32 again; CPU {result['cpu']}")
    print(f"  the fp32 copy's maps against the quantized original's: r {result['fp32 copy vs the quantized original']:.4f}")
    for t in result["trials"]:
        agreement = "reference" if t["agreement"] is None else f"r {t['agreement']:.4f}"
        state = t["error"] or ("faithful" if t["eligible"] else "refused")
        run = "-" if t["run_ms"] is None else f"{t['run_ms']:.2f} ms"
        print(f"  {t['engine']:<22} {t['precision']:<5} {run:>9}  {agreement:<10} {state}")
    served = result["served"]
    print(f"  auto serves {served['engine']} {served['precision']} ({served['chosen_by']})")
    gate = result["gate"]
    rows = {f"this CPU ({result['cpu']})": result["int8 agreement with fp32"]}
    emulated = result["emulated"]
    if emulated and "error" in emulated:
        print(f"  emulated {emulated['cpu']}: {emulated['error']}")
    elif emulated:
        rows[f"emulated {emulated['cpu']} (qemu-x86_64: its kernels; agreement only)"] = emulated["agreements"]
    times = result["int8 ms a run"]
    for where, engines in rows.items():
        print(f"  int8 against fp32 on {where}:")
        emulated_row = where.startswith("emulated")
        for engine, found in engines.items():
            ms = {} if emulated_row else times[engine]  # an emulated run's time means nothing
            print(f"    {engine}" + (f": fp32 {ms['fp32']:.2f} ms a run" if ms else ""))
            for label, r in found.items():
                timed = f"{ms[label]:6.2f} ms ({ms[label] / ms['fp32']:.2f} x fp32's)  " if ms else ""
                print(f"      {label:<56} {timed}r {r:.4f} ({'faithful' if r >= gate else 'refused'} at {gate})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
