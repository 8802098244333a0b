"""`depthwatch check`: is this config usable? Validate it, load the model, run one frame."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from depthwatch.commands.common import add_config_arguments, config_from_args
from depthwatch.model import providers as ep
from depthwatch.model.choosing.trials import Trial
from depthwatch.model.spec import ModelInfo

HELP = "check the config and the model: load it, show its providers and I/O, run one synthetic frame"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--providers",
        action="store_true",
        help="measure every available provider on this model (share of the graph, load time, time per frame, "
        "peak memory) and record the one `providers: auto` picks",
    )


def main(args: argparse.Namespace) -> int:
    import cv2

    from depthwatch.config import check_combinations
    from depthwatch.daemon.listening import address_problem
    from depthwatch.errors import ConfigError
    from depthwatch.frames.rules import template_clashes
    from depthwatch.frames.settings import Settings
    from depthwatch.imaging import codec, render, tensor
    from depthwatch.model import catalogue
    from depthwatch.model.engine import Engine

    config = config_from_args(args)
    check_combinations(config)
    print(f"config:    {config.source or 'built-in defaults'}")
    for folder in config.watch.folders:
        state = "ok" if folder.is_dir() else "missing (created at start if its parent exists)"
        print(f"watch:     {folder} [{state}]")
    for pattern in template_clashes(config.watch.patterns, config.output.template):  # as `run` warns at start
        print(
            f"warning:   watch.patterns {pattern} and output.template {config.output.template} clash: "
            f"every {pattern} file looks like a depth map, so none is mapped; change output.template or the patterns"
        )
    if config.api.enabled:
        problem = address_problem(config.api.host)
        if problem:
            raise ConfigError(problem)
        print(f"api:       {config.api.host}:{config.api.port} (enabled; the address is this machine's)")
    spec = catalogue.resolve(config.model, config.base)
    measuring = bool(getattr(args, "providers", False))
    if measuring:
        if spec.providers != "auto":
            print(f"config:    providers {', '.join(spec.providers)} (an explicit list is used as given; measuring anyway)")
        spec = dataclasses.replace(spec, providers="auto")
    with Engine(spec, measure_providers="always" if measuring else "remembered") as engine:
        info = engine.wait_ready()
        print(f"model:     {spec.path} (profile {info.profile.name}, loaded in {info.load_seconds:.2f} s)")
        how = {"measured": "measured now", "remembered": "measured before"}.get(info.chosen_by, "")
        if how:  # an explicit list measures only its first provider's precisions: not auto's choice
            how = f" (auto: {how})" if spec.providers == "auto" else f" (as listed; its precision {how})"
        print(f"providers: {', '.join(info.providers)}{how}")
        print(f"precision: {precision_line(spec.precision, info)}")
        compiled = _compiled(info)
        if compiled:
            print(f"compiled:  {compiled}")
        if measuring:
            print(provider_table(info.trials, (info.providers[0], info.precision)))
            if info.quantized:
                print("           (the model comes quantized: its fp32 rows run its own int8 graph as it is)")
        print(f"contract:  {info.contract.describe()}")
        # A synthetic 1080p frame through the same steps as a real one: decoded at the
        # daemon's scale, the model, then the render chain for the configured output.
        frame = np.zeros((1080, 1920, 3), np.uint8)
        frame[:, :, :] = np.linspace(0, 255, 1920, dtype=np.uint8)[None, :, None]
        data = cv2.imencode(".jpg", frame)[1].tobytes()
        settings = Settings.from_config(config)
        # check's own frame: daemon.max_megapixels is for the frames editors send, not for this one.
        decoded = codec.decode(data, max_pixels=1920 * 1080, min_size=info.min_frame_size)
        inference = engine.infer(tensor.prepare(decoded, info.contract, info.profile), info.generation).result()
        ext = _output_ext(config.output.template)
        made = render.depth_map(
            inference.prediction,
            info.profile.predicts,
            decoded,
            ext=ext,
            options=settings.render,
            encoding=settings.encoding,
        )
        print(
            f"frame:     1920x1080 synthetic frame -> {len(made.data)} byte {ext} depth map, "
            f"inference {inference.seconds * 1000:.1f} ms"
        )
    print("ok")
    return 0


def _output_ext(template: str) -> str:
    """The extension maps get under `template` (`{ext}`: the frame's own; a JPEG here)."""
    suffix = os.path.splitext(template)[1].lower()
    return ".jpg" if "{" in suffix or not suffix else suffix


def _compiled(info: ModelInfo) -> str:
    """Where CoreML's compiled model came from; empty when CoreML is not running the model."""
    if ep.COREML not in info.providers:
        return ""
    if info.compiled is None:
        return f"afresh at every load (onnxruntime {ep.runtime_version()} keeps no compiled model; 1.21 and later do)"
    origin = "from the cache" if info.compiled.existed else "afresh, now cached"
    return f"{origin} ({info.compiled.path})"


def precision_line(setting: str, info: ModelInfo) -> str:
    """The precision the model runs at, and why, when `auto` refused a reduced one."""
    line = info.arithmetic if setting == "auto" else f"{info.arithmetic} (as configured: {setting})"
    if setting == "auto":
        line += " (auto)"
    if info.arithmetic != info.precision:
        line += "; the model comes quantized and runs as it is"
    for refused in info.refused:
        line += f"; refused {refused}"
    return line


def _share(trial: Trial, cpu: Trial | None) -> str:
    """The share of the graph a provider took, from the nodes each profiled run executed.

    A compiling provider runs each partition as one fused node, so its share is
    the CPU session's node count less the nodes left to CPU, over the former
    (approximate where the two sessions fuse nodes differently).
    """
    if trial.provider == ep.OPENVINO:
        return "100% (one compiled graph)"
    if trial.nodes is None or trial.total_nodes is None:
        return "-"
    if trial.provider == ep.CPU:
        return f"100% of {trial.total_nodes}"
    whole = cpu.total_nodes if cpu is not None and cpu.total_nodes else trial.total_nodes
    on_cpu = trial.total_nodes - trial.nodes
    share = max(0.0, min(1.0, (whole - on_cpu) / whole)) if whole else 0.0
    return f"{share:.0%} ({trial.nodes} on it, {on_cpu} on CPU)"


def provider_table(trials: Sequence[Trial], picked: tuple[str, str]) -> str:
    """One row per variant measured (provider and precision), and which one `auto` picks.

    "maps" is the lowest correlation of the variant's probe maps with the
    reference's (the CPU provider at fp32); below the threshold a variant is
    never picked, however fast.
    """
    from depthwatch.model.choosing.precision import FAITHFUL

    cpu = next((t for t in trials if t.provider == ep.CPU), None)
    rows = [("provider", "precision", "graph share", "load", "per frame", "peak memory", "maps", "")]
    for t in trials:
        name = ep.short(t.provider)
        if not t.ok:
            rows.append((name, t.precision, "-", "-", "-", "-", "-", f"dropped: {t.error}"))
            continue
        memory = "-" if t.peak_mib is None else f"{t.peak_mib:.1f} MiB"
        maps = "reference" if t.agreement is None else f"r {t.agreement:.4f}"
        mark = "<- auto picks" if t.variant == tuple(picked) else ""
        if not t.faithful:
            mark = f"not faithful (r < {FAITHFUL})"
        rows.append((name, t.precision, _share(t, cpu), f"{t.load_s:.2f} s", f"{t.run_ms:.2f} ms", memory, maps, mark))
    widths = [max(len(r[i]) for r in rows) for i in range(7)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + ("  " + r[7] if r[7] else "") for r in rows]
    return "\n".join(line.rstrip() for line in lines)
