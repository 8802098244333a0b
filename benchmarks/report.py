"""Ratios, targets and the printed table, all computed from one run's results.

The machine's limit on CPU is cores / (CPU seconds per frame of inference +
of the image work), each measured single-threaded in the same run; with an
accelerator the image work runs on the CPU beside the inference, so the limit
is the bare loop (or the CPU's image-work rate, if that is lower).
"""

from __future__ import annotations

import math
from typing import Any

#: The targets depthwatch holds itself to; reported, never asserted.
BURST_VS_LIMIT = 0.95
LATENCY_OVERHEAD_MS = 10.0
SCRUB_INFERENCE_SHARE = 0.5
RSS_VS_BARE = 1.5
#: Against the seed as written (ONNX Runtime's CPU provider, fp32, a map at the model's size).
AUTO_VS_SEED = 1.5
#: The same where the CPU has no bf16 (AVX2 alone): int8 where faithful is what is left.
AUTO_VS_SEED_NO_BF16 = 1.3
#: A first start with a model never measured on the machine: `ready` within this many seconds...
FIRST_READY_S = 3.0
#: ... and the first frame's map within this many runs of the model.
FIRST_MAP_RUNS = 2.0
ORT_VS_SEED = 1.0
#: ... and against the seed's loop doing depthwatch's job (a map at the frame's size, written atomically).
ORT_VS_SEED_FULL = 1.2
#: `once CLIP` against `once` over the same frames as JPEG stills.
CLIP_VS_STILLS = 0.9
#: Resident memory growth while a long clip is mapped: flat, give or take the allocator.
CLIP_RSS_KIB = 16.0
#: refine: edges keeps at least this share of the burst without refinement.
REFINE_BURST_SHARE = 0.95


def _get(results: dict[str, Any], *keys: str) -> Any:
    node: Any = results
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b or (isinstance(b, float) and math.isnan(b)):
        return None
    return float(a) / float(b)


def limit_fps(results: dict[str, Any], ceiling_fps: float | None, costs: str = "costs") -> float | None:
    """The machine's limit for this model and these frames, with the engine whose `costs` are given."""
    cores = results["machine"]["cores"]
    infer, image = _get(results, "scenarios", costs, "infer_cpu_ms"), _get(results, "scenarios", costs, "image_cpu_ms")
    if image is None:
        return None
    if results["machine"]["accelerated"]:
        image_rate = cores * 1000 / image
        return min(ceiling_fps, image_rate) if ceiling_fps else image_rate
    if infer is None:
        return None
    return cores * 1000 / (infer + image)


def one_run_fps(results: dict[str, Any], ceiling: str = "ceiling", costs: str = "costs") -> float | None:
    """On CPU, the most frames a second with one inference at a time (None beside an accelerator).

    Why: the limit counts a run's CPU on one thread, as if runs could go side
    by side, one a core. depthwatch runs one inference at a time on its one
    inference thread, spread over the engine's threads so that a frame alone
    is quick, and a run on several threads costs the engine more CPU than on
    one (its threads wait for each other): the ceiling measures by how much
    (`threads_cpu_ratio`, both in turn). What that leaves is cores / (the
    limit's run CPU x that ratio + the image work's), and never more than the
    bare loop: a burst's share of the limit can be this bound's share at most.
    """
    if results["machine"]["accelerated"]:
        return None
    ratio = _get(results, "scenarios", ceiling, "threads_cpu_ratio")
    infer, image = _get(results, "scenarios", costs, "infer_cpu_ms"), _get(results, "scenarios", costs, "image_cpu_ms")
    bare = _get(results, "scenarios", ceiling, "fps")
    if ratio is None or infer is None or image is None or not bare:
        return None
    return min(bare, results["machine"]["cores"] * 1000 / (infer * ratio + image))


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """The ratios the targets are stated in, within this run."""
    s = results["scenarios"]
    ceiling = _get(s, "ceiling", "fps")
    ceiling_ms = _get(s, "ceiling", "ms_per_frame")
    limit = limit_fps(results, ceiling)
    burst = _get(s, "burst", "fps")
    # ONNX Runtime's CPU provider at fp32 on depthwatch's side too: the burst above when
    # that is what depthwatch picked, else the burst run again with it.
    separate = _get(s, "burst_ort") is not None
    burst_ort = _get(s, "burst_ort", "fps") if separate else burst
    limit_ort = limit_fps(results, _get(s, "ceiling_ort", "fps"), "costs_ort") if _get(s, "costs_ort") else limit
    one_run = one_run_fps(results)
    one_run_ort = one_run_fps(results, "ceiling_ort", "costs_ort") if _get(s, "costs_ort") else one_run
    seed = _get(s, "classic_flask", "fps")
    p50 = _get(s, "latency", "p50_ms")
    daemon_infer = _get(s, "latency", "daemon_stage_ms", "infer")
    rss = max((v for v in (_get(s, "burst", "peak_rss_bytes"), _get(s, "daemon", "peak_rss_bytes")) if v), default=None)
    loads = [v for v in (_get(s, "burst", "model_loads"), _get(s, "daemon", "model_loads")) if v is not None]
    startups = (_get(s, "burst", "startup_s") or []) + (_get(s, "daemon", "startup_s") or [])
    return {
        "limit_fps": limit,
        "burst_vs_limit": _ratio(burst, limit),
        "burst_vs_ceiling": _ratio(burst, ceiling),
        "burst_vs_classic_flask": _ratio(burst, seed),
        "burst_vs_seed": _ratio(burst, seed),
        "burst_ort_fps": burst_ort,
        "burst_ort_vs_seed": _ratio(burst_ort, seed),
        "burst_ort_vs_seed_full": _ratio(burst_ort, _get(s, "classic_full", "fps")),
        "limit_ort_fps": limit_ort,
        "burst_ort_vs_limit_ort": _ratio(burst_ort, limit_ort),
        "one_run_fps": one_run,
        "one_run_vs_limit": _ratio(one_run, limit),
        "one_run_ort_fps": one_run_ort,
        "one_run_ort_vs_limit_ort": _ratio(one_run_ort, limit_ort),
        "seed_full_vs_seed": _ratio(_get(s, "classic_full", "fps"), seed),
        "burst_vs_classic_gunicorn": _ratio(burst, _get(s, "classic_gunicorn", "fps")),
        "classic_flask_vs_limit": _ratio(_get(s, "classic_flask", "fps"), limit),
        "classic_gunicorn_vs_limit": _ratio(_get(s, "classic_gunicorn", "fps"), limit),
        "ceiling_vs_limit": _ratio(ceiling, limit),
        # The limit's two loops at once against each alone (1.00: the cores do not slow each other).
        "side_infer_beside_vs_alone": _ratio(
            _get(s, "side_by_side", "infer_ms_beside"), _get(s, "side_by_side", "infer_ms_alone")
        ),
        "side_image_beside_vs_alone": _ratio(
            _get(s, "side_by_side", "image_cpu_ms_beside"), _get(s, "side_by_side", "image_cpu_ms_alone")
        ),
        "latency_overhead_ms": None if p50 is None or ceiling_ms is None else p50 - ceiling_ms,
        "latency_overhead_vs_own_infer_ms": None if p50 is None or daemon_infer is None else p50 - daemon_infer,
        "scrub_inference_share": _ratio(_get(s, "scrub", "inferences"), _get(s, "scrub", "writes")),
        "daemon_peak_rss_bytes": rss,
        "rss_vs_bare": _ratio(rss, _get(s, "bare", "peak_rss_bytes")),
        "burst_ort_peak_rss_bytes": _get(s, "burst_ort", "peak_rss_bytes"),
        "rss_ort_vs_bare_ort": _ratio(_get(s, "burst_ort", "peak_rss_bytes"), _get(s, "bare_ort", "peak_rss_bytes")),
        "model_loads": max(loads) if loads else None,
        "daemon_startup_s": _median(startups),
        "bare_startup_s": _median(_get(s, "bare", "startup_s") or []),
        "burst_edges_vs_none": _ratio(burst, _get(s, "refine_none", "burst", "fps")),
        # The supervisor's per-frame notes as a share of one burst frame's time (its frames/s inverted).
        "bookkeeping_share_of_burst_frame": _ratio(_get(s, "bookkeeping", "notes_us_per_frame"), _ratio(1e6, burst)),
        "latency_p50_edges_minus_none_ms": None
        if p50 is None or _get(s, "refine_none", "latency", "p50_ms") is None
        else p50 - _get(s, "refine_none", "latency", "p50_ms"),
        # output.normalise: the burst (default, stable) against the same burst with frame,
        # and the latency on a real shot, stable minus frame.
        "burst_stable_vs_frame": _ratio(burst, _get(s, "normalise", "burst_frame", "fps")),
        "latency_stable_minus_frame_ms": _minus(
            _get(s, "normalise", "latency_stable", "p50_ms"), _get(s, "normalise", "latency_frame", "p50_ms")
        ),
    }


def _minus(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else a - b


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured value and whether it was met (None: not measured)."""
    d, s = results["derived"], results["scenarios"]
    accelerated = results["machine"]["accelerated"]
    engine = _get(results, "engine", "chosen") or "?"
    seed = _get(results, "engine", "seed") or "CPU fp32"
    rows = []

    def add(name: str, value: Any, met: bool | None, goal: str) -> None:
        rows.append({"target": name, "goal": goal, "value": value, "met": met})

    def at_least(name: str, value: Any, goal: float) -> None:
        add(name, value, None if value is None else value >= goal, f">= {goal}")

    features = set(_get(results, "machine", "cpu_features") or [])
    auto_goal = AUTO_VS_SEED if features & {"avx512_bf16", "amx_bf16"} else AUTO_VS_SEED_NO_BF16
    at_least(f"burst ({engine}, depthwatch's pick) vs the seed as written ({seed})", d.get("burst_vs_seed"), auto_goal)
    at_least(f"burst ({seed}) vs the seed as written ({seed})", d.get("burst_ort_vs_seed"), ORT_VS_SEED)
    at_least(
        f"burst ({seed}) vs the seed's loop with full-size maps ({seed})", d.get("burst_ort_vs_seed_full"), ORT_VS_SEED_FULL
    )
    if accelerated:
        v = d["burst_vs_ceiling"]
        add(f"burst vs bare loop ({engine}, accelerator)", v, None if v is None else v >= BURST_VS_LIMIT, f">= {BURST_VS_LIMIT}")
    else:
        limits = [(engine, d["burst_vs_limit"], d.get("one_run_vs_limit"))]
        if engine != seed:  # the row for onnxruntime fp32 on both sides, too
            limits.append((seed, d.get("burst_ort_vs_limit_ort"), d.get("one_run_ort_vs_limit_ort")))
        for name, value, bound in limits:
            met = None if value is None else value >= BURST_VS_LIMIT
            add(f"burst vs machine limit ({name})", value, met, f">= {BURST_VS_LIMIT}; one inference at a time allows {_f(bound, '.2f')}")
    v = d["latency_overhead_vs_own_infer_ms"]
    add(
        f"latency overhead beyond the engine's own run, p50 (ms, {engine})",
        v,
        None if v is None else v <= LATENCY_OVERHEAD_MS,
        f"<= {LATENCY_OVERHEAD_MS:g}",
    )
    tail, p50 = _get(s, "scrub", "last_map_ms"), _get(s, "latency", "p50_ms")
    add(
        "scrub: last map after last write (ms)",
        tail,
        None if tail is None or p50 is None else tail <= p50,
        "<= one inference + overhead (latency p50)" + (f" = {p50:.1f}" if p50 is not None else ""),
    )
    v = d["scrub_inference_share"]
    add("scrub: inferences / writes", v, None if v is None else v <= SCRUB_INFERENCE_SHARE, f"<= {SCRUB_INFERENCE_SHARE}")
    v = d["rss_vs_bare"]
    add(f"peak RSS vs a bare session of the same engine ({engine})", v, None if v is None else v <= RSS_VS_BARE, f"<= {RSS_VS_BARE}")
    v = d["model_loads"]
    add("model loads per daemon", v, None if v is None else v == 1, "== 1")
    v = d.get("burst_edges_vs_none")
    add("burst refine: edges vs none", v, None if v is None else v >= REFINE_BURST_SHARE, f">= {REFINE_BURST_SHARE}")
    v = d.get("burst_stable_vs_frame")
    add("burst, normalise stable vs frame", v, None if v is None else v >= 0.95, ">= 0.95")
    v = d.get("latency_stable_minus_frame_ms")
    add("latency p50, normalise stable - frame (ms)", v, None if v is None else v <= 2.0, "<= 2")
    first = s.get("first_start")
    if first:
        what = f"{first['gflops']:.0f} GFLOP, never measured, auto"
        v = first["ready_s"]
        add(f"first start: launch to ready (s; {what})", v, v <= FIRST_READY_S, f"<= {FIRST_READY_S:g}")
        v = first["first_map_in_runs"]
        add(
            f"first start: first map after the drop, in the model's runs ({first['served_first']}, measuring: {first['measuring_at_ready']})",
            v, None if v is None else v <= FIRST_MAP_RUNS, f"<= {FIRST_MAP_RUNS:g}",
        )
    v = _get(s, "clip_throughput", "clip_vs_stills")
    if v is not None:
        add("once CLIP vs once over the same frames as stills", v, v >= CLIP_VS_STILLS, f">= {CLIP_VS_STILLS}")
    v = _get(s, "clip_memory", "bytes_per_frame")
    if v is not None:
        add("clip RSS growth (KiB/frame)", v / 1024, v / 1024 <= CLIP_RSS_KIB, f"<= {CLIP_RSS_KIB:g} (flat)")
    return rows


# -- the printed table ------------------------------------------------------------------


def _f(value: Any, fmt: str = ".1f", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{fmt}}{unit}"


def _mib(value: Any) -> str:
    return "-" if not value else f"{value / 2**20:.0f} MiB"


def loaded(machine: dict[str, Any]) -> bool:
    """Whether the machine was busy with other work when the run began (load average over half its cores)."""
    try:
        return float(machine["load_before"]) > 0.5 * float(machine["cores"])
    except (KeyError, TypeError, ValueError):
        return False


def table(results: dict[str, Any]) -> str:
    m, s, d = results["machine"], results["scenarios"], results["derived"]
    model, frames, knobs = results["model"], results["frames"], results["settings"]
    lines = [
        f"depthwatch benchmark: {m['cores']} cores ({m['cpu']}; {' '.join(m.get('cpu_features') or []) or 'no listed features'}), "
        f"{m['platform']}, load average {m['load_before']} -> {m['load_after']}"
        + (" -- LOADED MACHINE: other work was running, timings are distorted" if loaded(m) else ""),
        f"providers {', '.join(m['providers_applied'])} (available: {', '.join(m['providers_available'])}); "
        f"onnxruntime {m['onnxruntime']}{', openvino ' + m['openvino'] if m.get('openvino') else ''}, OpenCV {m['opencv']}",
        f"engine {_get(results, 'engine', 'chosen') or '?'} (what depthwatch picks with these providers and precision, "
        f"{_get(results, 'engine', 'chosen_by') or 'nothing to choose'}); the seed runs {_get(results, 'engine', 'seed') or '?'}"
        + "".join(f"; refused {r}" for r in _get(results, "engine", "refused") or []),
        f"model {model['name']}{' (%.2f GFLOPs/frame)' % (model['gflops']) if model.get('gflops') else ''}: {model['contract']}",
        f"frames {frames['describe']}",
        f"settings intra_op_threads {knobs['intra_op_threads']} (0 = onnxruntime's choice), workers {knobs['workers']}, "
        f"OpenCV threads {knobs['cv2_threads'] or 'default'}; {knobs['repeats']} repeat(s), medians",
        "",
        f"{'scenario':<46}{'frames/s':>10}{'ms/frame':>10}{'x ceiling':>11}{'x limit':>9}   notes",
    ]

    def row(name: str, fps: Any, notes: str = "") -> None:
        ms = None if not fps else 1000 / fps
        lines.append(
            f"{name:<46}{_f(fps):>10}{_f(ms):>10}{_f(_ratio(fps, _get(s, 'ceiling', 'fps')), '.2f'):>11}"
            f"{_f(_ratio(fps, d['limit_fps']), '.2f'):>9}   {notes}"
        )

    def one_run_row(engine: str, ceiling: str, costs: str, fps: Any) -> None:
        if fps is None:
            return
        row(
            f"one inference at a time ({engine})",
            fps,
            f"a run on the engine's threads takes {_f(_get(s, ceiling, 'threads_cpu_ratio'), '.2f')}x its CPU on one "
            f"({_f(_get(s, ceiling, 'cpu_ms_per_frame'))} against {_f(_get(s, ceiling, 'single_cpu_ms_per_frame'))} ms, "
            "in turn); the limit with that, at most the bare loop",
        )

    c = s.get("costs") or {}
    pc = s.get("parallel_ceiling")
    engine = _get(results, "engine", "chosen") or "?"
    seed = _get(results, "engine", "seed") or "CPU fp32"
    row(f"ceiling: bare run loop ({engine})", _get(s, "ceiling", "fps"), "pre-decoded, pre-resized inputs")
    row(
        f"machine limit ({engine})",
        d["limit_fps"],
        f"{m['cores']} cores / (inference {_f(c.get('infer_cpu_ms'))} + image {_f(c.get('image_cpu_ms'))} ms "
        "CPU per frame, single-threaded)"
        if not m["accelerated"]
        else "bare loop, or the CPU's image-work rate if lower",
    )
    one_run_row(engine, "ceiling", "costs", d.get("one_run_fps"))
    co = s.get("costs_ort")
    if co:
        row(f"ceiling: bare run loop ({seed})", _get(s, "ceiling_ort", "fps"), "the seed's engine")
        row(
            f"machine limit ({seed})",
            d.get("limit_ort_fps"),
            f"{m['cores']} cores / (inference {_f(co.get('infer_cpu_ms'))} + image {_f(co.get('image_cpu_ms'))} ms "
            "CPU per frame, single-threaded)",
        )
        one_run_row(seed, "ceiling_ort", "costs_ort", d.get("one_run_ort_fps"))
    if pc:
        row(
            f"(frames in parallel: {pc['threads']} x session.run, {seed})",
            pc["fps"],
            "one intra-op thread each, one session: not what depthwatch does",
        )
    for key, label in (
        ("classic_flask", f"the seed as written, Flask ({seed})"),
        ("classic_gunicorn", f"the seed under gunicorn -w 1 ({seed})"),
        ("classic_full", f"seed's loop, depthwatch's job ({seed})"),
    ):
        r = s.get(key)
        if r:
            size = r.get("output_size")
            what = "atomically, " if r.get("full_size") else ""
            note = f"request p50 {_f(r['p50_ms'])} ms, p95 {_f(r.get('p95_ms'))} ms; writes {what}a {size[0]}x{size[1]} map" if size else ""
            row(label, r["fps"], note)
    p = s.get("predict")
    if p:
        c = p["classic"]
        row(
            "depthwatch POST /predict, frame.jpg",
            c["fps"],
            f"request p50 {_f(c['p50_ms'])} ms, p95 {_f(c['p95_ms'])} ms; map at the frame's size; "
            f"{c['answered']}/{c['requests']} answered, {_f(c.get('inferences'), '.0f')} inferences in all",
        )
        b = p["body"]
        row(
            "depthwatch POST /predict, image body",
            b["fps"],
            f"request p50 {_f(b['p50_ms'])} ms, p95 {_f(b['p95_ms'])} ms; the map in the answer, nothing written",
        )
    b = s.get("burst")
    for key, label in (("burst", f"depthwatch burst ({engine})"), ("burst_ort", f"depthwatch burst ({seed})")):
        r = s.get(key)
        if r:
            versus = f"{_f(_ratio(r['fps'], _get(s, 'classic_flask', 'fps')), '.2f')} x the seed, " + (
                f"{_f(_ratio(r['fps'], _get(s, 'classic_full', 'fps')), '.2f')} x its full-size loop; " if key == "burst_ort" or not s.get("burst_ort") else ""
            )
            row(
                label,
                r["fps"],
                f"{results['plan']['count']} frames at once; {versus}{r['outputs']}/{r['frames']} maps at the frame's size; "
                f"daemon CPU {_f(r.get('cpu_ms_per_frame'))} ms/frame, "
                f"{_f(100 * r['cores_busy'] if r.get('cores_busy') is not None else None, '.0f')}% of the cores busy",
            )
    if b and b.get("cpu_ms_per_frame_by_thread"):
        split = sorted(b["cpu_ms_per_frame_by_thread"].items(), key=lambda kv: -kv[1])
        costs = s.get("costs") or {}
        lines.append(
            "  burst, daemon CPU by thread (ms/frame): "
            + " ".join(f"{k} {v:.1f}" for k, v in split if v >= 0.05)
            + f"; alone, one thread: inference {_f(costs.get('infer_cpu_ms'))}, image work {_f(costs.get('image_cpu_ms'))}"
        )
    side = s.get("side_by_side") or {}
    if side.get("infer_ms_alone"):
        lines.append(
            "  the limit's two loops side by side (one thread each, at once): "
            f"inference {_f(side['infer_ms_alone'])} ms alone, {_f(side['infer_ms_beside'])} beside the image work "
            f"({_f(d['side_infer_beside_vs_alone'], '.2f')}x); image work {_f(side['image_cpu_ms_alone'])} ms CPU alone, "
            f"{_f(side['image_cpu_ms_beside'])} beside the inference ({_f(d['side_image_beside_vs_alone'], '.2f')}x)"
        )
    if b and b.get("daemon_stage_ms"):
        st = b["daemon_stage_ms"]
        lines.append("  burst, daemon's own stage medians (ms): " + " ".join(f"{k} {v:.1f}" for k, v in st.items()))
    from benchmarks.farm import rows as farm_rows

    for label, fps, note in farm_rows(results):
        row(label, fps, note)
    from benchmarks.clips import rows as clip_rows

    lines += clip_rows(results)
    from benchmarks.farmclips import rows as farm_clip_rows

    lines += farm_clip_rows(results)
    lines.append("")
    lat = s.get("latency")
    if lat:
        st = lat.get("daemon_stage_ms") or {}
        stages = " ".join(f"{k} {v:.1f}" for k, v in st.items())
        lines.append(
            f"latency (one frame at a time, {lat['frames']} frames): p50 {_f(lat['p50_ms'])} ms, p95 {_f(lat['p95_ms'])} ms; "
            f"overhead beyond the ceiling's {_f(_get(s, 'ceiling', 'ms_per_frame'))} ms/frame: {_f(d['latency_overhead_ms'])} ms"
            f" (beyond the daemon's own session.run median: {_f(d['latency_overhead_vs_own_infer_ms'])} ms)"
        )
        if stages:
            lines.append(f"  latency, daemon's own stage medians (ms): {stages}")
    bk = s.get("bookkeeping")
    if bk:
        lines.append(
            f"bookkeeping (the supervisor's notes, one core): {_f(bk['notes_us_per_frame'])} us/frame, "
            f"{_f(d.get('bookkeeping_share_of_burst_frame'), '.2%')} of a burst frame's {_f(_ratio(1000, _get(s, 'burst', 'fps')), '.2f')} ms; "
            f"heartbeat: a {_f(bk['heartbeat_write_us'] / 1000, '.2f')} ms status write every 5 s, "
            f"{_f(bk['heartbeat_core_share'], '.3%')} of a core"
        )
    rn = s.get("refine_none")
    if rn:
        lines.append(
            f"refine: none (plain upscale): burst {_f(_get(rn, 'burst', 'fps'))} frames/s "
            f"(edges: {_f(_get(s, 'burst', 'fps'))}, {_f(d.get('burst_edges_vs_none'), '.2f')}x), "
            f"latency p50 {_f(_get(rn, 'latency', 'p50_ms'))} ms (edges: {_f(_get(s, 'latency', 'p50_ms'))} ms)"
        )
    rm = s.get("refine_micro")
    if rm:
        for key, row in rm.items():
            if isinstance(row, dict):
                lines.append(
                    f"  render on one core, {key} (guide {row['guide']}, prediction {rm['prediction']}): "
                    f"guided filter {_f(row['refine_ms'], '.2f')} ms; render with edges {_f(row['render_edges_ms'], '.2f')} ms, "
                    f"without {_f(row['render_none_ms'], '.2f')} ms"
                )
    sc = s.get("scrub")
    if sc:
        lines.append(
            f"scrub ({sc['writes']} writes in {sc['seconds']:g} s): {_f(sc['inferences'], '.0f')} inferences, "
            f"{_f(sc['superseded'], '.0f')} superseded; last map {_f(sc['last_map_ms'])} ms after the last write"
        )
    if s.get("bare") or d["daemon_peak_rss_bytes"]:
        lines.append(
            f"memory ({engine}): daemon peak RSS {_mib(d['daemon_peak_rss_bytes'])} vs bare session "
            f"{_mib(_get(s, 'bare', 'peak_rss_bytes'))} ({_f(d['rss_vs_bare'], '.2f')}x); "
            f"model loads per daemon {_f(d['model_loads'], '.0f')}"
        )
        if s.get("bare_ort"):
            lines.append(
                f"memory ({seed}): daemon peak RSS {_mib(d.get('burst_ort_peak_rss_bytes'))} vs bare session "
                f"{_mib(_get(s, 'bare_ort', 'peak_rss_bytes'))} ({_f(d.get('rss_ort_vs_bare_ort'), '.2f')}x)"
            )
        lines.append(
            f"start-up to ready: daemon {_f(d['daemon_startup_s'], '.2f')} s, bare session {_f(d['bare_startup_s'], '.2f')} s"
        )
    n = s.get("normalise")
    if n:
        ls, lf = n.get("latency_stable") or {}, n.get("latency_frame") or {}
        lines.append(
            f"output.normalise: burst stable {_f(_get(s, 'burst', 'fps'))} vs frame {_f(_get(n, 'burst_frame', 'fps'))} frames/s "
            f"({_f(d.get('burst_stable_vs_frame'), '.3f')}x); latency on a real shot p50 stable {_f(ls.get('p50_ms'))} vs frame "
            f"{_f(lf.get('p50_ms'))} ms ({_f(d.get('latency_stable_minus_frame_ms'), '+.2f')} ms), normalise stage "
            f"{_f(_get(ls, 'daemon_stage_ms', 'normalise'), '.2f')} vs {_f(_get(lf, 'daemon_stage_ms', 'normalise'), '.2f')} ms"
        )
    lines += ["", "targets (not assertions):"]
    for t in results["targets"]:
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
        value = _f(t["value"], ".2f") if not isinstance(t["value"], int) else str(t["value"])
        lines.append(f"  [{mark}] {t['target']}: {value} (goal {t['goal']})")
    for name, error in results.get("errors", {}).items():
        lines.append(f"  [ERROR ] {name}: {error}")
    return "\n".join(lines)


def sweep_table(results: dict[str, Any]) -> str:
    d = results["derived"]
    c = results["scenarios"].get("costs") or {}
    lines = [
        f"sweep: burst of {results['plan']['count']} frames, machine limit {_f(d['limit_fps'])} frames/s "
        f"({results['machine']['cores']} cores / (inference {_f(c.get('infer_cpu_ms'))} + "
        f"image {_f(c.get('image_cpu_ms'))} ms CPU per frame)), "
        f"load average {results['machine']['load_before']} -> {results['machine']['load_after']}",
        f"{'intra_op':>9}{'workers':>9}{'cv2 thr':>9}{'ceiling':>10}{'burst':>9}{'x limit':>9}{'x ceiling':>11}"
        f"{'CPU ms/frame':>14}{'cores busy':>12}",
    ]
    for r in results.get("sweep", []):
        lines.append(
            f"{r['intra_op_threads']:>9}{r['workers']:>9}{r['cv2_threads'] or 'dflt':>9}{_f(r['ceiling_fps']):>10}"
            f"{_f(r.get('fps')):>9}{_f(_ratio(r.get('fps'), d['limit_fps']), '.2f'):>9}"
            f"{_f(_ratio(r.get('fps'), r['ceiling_fps']), '.2f'):>11}{_f(r.get('cpu_ms_per_frame')):>14}"
            f"{_f(r.get('cores_busy'), '.0%'):>12}" + (f"   error: {r['error']}" if r.get("error") else "")
        )
    return "\n".join(lines)
