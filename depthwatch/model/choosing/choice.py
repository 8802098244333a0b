"""Measure, then choose: which provider runs this model fastest on this machine.

An accelerator is not always faster, nor is every runtime on the same CPU:
OpenVINO runs some models twice as fast as onnxruntime's CPU provider, and
bf16 halves the time again where the CPU has it. CoreML takes only part of a transformer
(Depth Anything's DINOv2 encoder) in dozens of partitions and runs it several
times slower than the CPU provider, with far more memory. So with `providers:
auto` depthwatch times a few warm runs of each available accelerator and of
CPU, keeps the fastest (the CPU provider at fp32 unless another is clearly faster:
`trials.SWITCH`), and remembers the choice in `providers.json` in the
cache folder, keyed by the model's sha256, the runtimes' versions and the
machine's abilities (platform, architecture, CPU model, the ISA features that
change the answer, core count, host name, and the providers on offer). Later
starts read it and measure nothing. An explicit provider list is never
measured, except for the precisions `precision: auto` may take on it.

The daemon never waits for a measurement: it serves from the remembered
choice, or from the reference when there is none, and measures in idle time
on the inference thread, a step at a time (`measurement.Measurement`, run
by `idle`), so a frame waits for one step at most. A measurement taken while other processes kept the
CPUs busy is remembered as such (`busy`) and made again at the next start.

Each candidate is a variant: a provider and a precision. Besides its speed,
each one's maps on the probe images (see `precision`) are compared with the
reference's, the CPU provider's fp32 maps (or, on an explicit provider, its
own fp32 maps): a variant whose maps correlate less than
`precision.FAITHFUL` is measured but never chosen.

The sessions measured are made and released one at a time by the caller (the
engine, on its inference thread): besides the serving session, at most one
measured session is in memory at any moment, and the daemon serves from
exactly one session.

This module decides (`decide`), reports a measurement's outcome (`report`)
and remembers it (`Decisions`, keyed by `decision_key`); the figures are in
`trials`, the steps in `measurement`, the machine's key in `hardware`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthwatch.errors import ModelError
from depthwatch.model import caches, providers
from depthwatch.model.choosing import quantize
from depthwatch.model.choosing import precision as precisions
from depthwatch.model.failures import first_line
from depthwatch.model.choosing.gauges import give_back_freed_memory
from depthwatch.model.choosing.hardware import machine
from depthwatch.model.spec import ModelSpec
from depthwatch.model.choosing.trials import Trial, Variant, fastest, reference, unfaithful

if TYPE_CHECKING:
    from depthwatch.model.choosing.measurement import Measurement

# The decision's lines come from the engine's logger, where log filters and tests look for them.
log = logging.getLogger("depthwatch.model.engine")

#: Measures a model's variants now, before its first frame (the engine, on its inference thread).
MeasureNow = Callable[[ModelSpec, list[Variant]], "Measurement"]

#: Decisions remembered at most.
MAX_DECISIONS = 64


def decision_key(
    digest: str, runtime_version: str, available: Sequence[str], precision: str = precisions.AUTO, only: str | None = None
) -> str:
    """`runtime_version`: every runtime's version, e.g. "onnxruntime 1.32.0, openvino 2026.4.1".

    `only`: the provider an explicit list serves from, whose precisions alone were measured: a choice of
    its own, never the one `providers: auto` remembers (a list naming CUDA where there is none, falling
    back to the CPU, would otherwise store "CPU" as auto's choice for every later daemon and worker).
    """
    if not runtime_version.startswith("onnxruntime"):
        runtime_version = f"onnxruntime {runtime_version}"
    offered = ",".join(sorted(available))
    parts = [digest, runtime_version, machine(), offered, f"precision {precision}", f"tried {precisions.TRIED}"]
    return " | ".join(parts + ([f"providers {only}"] if only is not None else []))


class Decisions:
    """`providers.json`: the variant measured fastest, per model, runtimes, machine, providers on offer and precision setting."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> dict[str, Any] | None:
        found = caches.read_json(self.path).get(key)
        if isinstance(found, dict) and isinstance(found.get("provider"), str):
            return found
        return None

    def put(self, key: str, model: Path, chosen: Variant, trials: Sequence[Trial], busy: bool = False) -> None:
        """`busy`: other processes kept the CPUs busy while it was measured; the next start measures again."""
        data = caches.read_json(self.path)
        data[key] = {
            "busy": busy,
            "model": str(model),
            "provider": chosen[0],
            "precision": chosen[1],
            "measured": time.strftime("%Y-%m-%d %H:%M"),
            "at": time.time(),
            "trials": [asdict(t) for t in trials],
            # Why a reduced precision was not taken, for `depthwatch check` on a later start.
            "refused": [t.refusal() for t in trials if t.provider == chosen[0] and t.ok and not t.faithful],
        }
        if len(data) > MAX_DECISIONS:
            for old in sorted(data, key=lambda k: data[k].get("at", 0))[: len(data) - MAX_DECISIONS]:
                del data[old]
        caches.write_json(self.path, data)


@dataclass
class Plan:
    """An idle-time measurement to make once the serving session is up: what to measure, where to remember it."""

    spec: ModelSpec
    variants: list[Variant]
    notes: dict[str, str]
    key: str
    decisions: Decisions
    #: Why: "never measured", or "measured on a busy machine".
    why: str


def decide(
    spec: ModelSpec, available: list[str], first: str, mode: str, measure_now: MeasureNow
) -> tuple[Variant, str, list[Trial], list[str], Plan | None]:
    """The variant (provider, precision) to serve from, how it was chosen, the figures, refusals,
    and the idle-time measurement still to make.

    `auto` providers: the variant measured fastest for this model on this
    machine. When nobody has measured it, batch work (`remembered`) measures
    now, before its first frame, and the daemon (`background`) serves from
    the reference at once and plans the measurement for idle time; a choice
    measured on a busy machine serves, and is measured again. An explicit
    list serves from its first available provider, measured only between
    the precisions `precision: auto` may take on it. With one variant on
    offer there is nothing to measure. A remembered choice is found before
    any runtime is asked what it offers, so a start that serves from
    onnxruntime never imports OpenVINO. `mode` is the engine's
    `measure_providers`; `measure_now` measures before the first frame.
    """
    names = providers.auto_candidates(available) if spec.providers == "auto" else [first]
    if names == [providers.CPU] and mode != "always":
        wanted, note = precisions.candidates(providers.CPU, spec.precision)
        if len(wanted) == 1:  # nothing to choose between: no digest, no record
            if note:
                log.warning("precision %s: %s", spec.precision, note)
            return (providers.CPU, wanted[0]), "", [], [], None
    try:
        digest = caches.model_digest(spec.path, spec.state_dir())
    except OSError as exc:
        raise ModelError(f"cannot read model {spec.path}: {exc.strerror or exc}; check the file and its permissions") from None
    only = None if spec.providers == "auto" else first
    key = decision_key(digest, providers.runtimes_version(available), available, spec.precision, only)
    decisions = Decisions(spec.state_dir() / "providers.json")
    known = decisions.get(key) if mode != "always" else None
    remembered: tuple[Variant, str, list[Trial], list[str]] | None = None
    why = "never measured"
    if known is not None and known["provider"] in names:
        chosen = (known["provider"], str(known.get("precision", precisions.FP32)))
        log.info(
            "providers: auto uses %s%s for %s (measured %s%s)",
            chosen[0],
            "" if chosen[1] == precisions.FP32 else f" at {chosen[1]}",
            spec.path.name,
            known.get("measured", "before"),
            ", on a busy machine: measuring again in idle time" if known.get("busy") and mode == "background" else "",
        )
        remembered = chosen, "remembered", [], [str(r) for r in known.get("refused", [])]
        again = bool(known.get("busy")) and mode == "background"
        if again:
            why = "measured on a busy machine"
        if chosen[1] == precisions.INT8 and mode == "background" and not _int8_at_hand(spec):
            # Its int8 file gone from the cache (cleaned, pruned, damaged): quantizing again before `ready` takes a
            # minute for a large model. fp32 on that provider serves now; int8 is measured again in idle time.
            log.info("the int8 model of %s is not in the cache: %s serves at fp32 now, and int8 is measured again in idle time",
                     spec.path.name, providers.short(chosen[0]))
            remembered = (chosen[0], precisions.FP32), "remembered", [], remembered[3]
            again, why = True, "its int8 model was not in the cache"
        if not again:
            return (*remembered, None)
    variants: list[Variant] = []
    notes: dict[str, str] = {}
    for name in names:
        try:
            wanted, note = precisions.candidates(name, spec.precision)
        except Exception as exc:  # the runtime cannot even say what it runs: measured as fp32, where it may fail
            wanted, note = [precisions.FP32], f"cannot read {providers.short(name)}'s precisions: {first_line(exc)}"
        variants += [(name, p) for p in wanted]
        if note:
            notes[name] = note
    if len(variants) == 1 and mode != "always":
        if notes.get(variants[0][0]):
            log.warning("precision %s: %s", spec.precision, notes[variants[0][0]])
        return variants[0], "", [], [], None
    if mode == "background":
        plan = Plan(spec, variants, notes, key, decisions, why)
        if remembered is not None:
            return (*remembered, plan)
        return reference(variants), "", [], [], plan
    measured = measure_now(spec, variants)
    trials = measured.trials or []
    give_back_freed_memory()
    chosen, refused = report(spec, trials, variants, notes)
    if measured.busy:  # remembered as such, as the daemon's own measurement is: measured again by its next start
        log.warning(
            "the measurement ran while other processes kept %.1f cores busy; its choice serves, and the daemon's next "
            "start measures again in idle time", measured.others or 0.0,
        )
    if len(variants) > 1:
        decisions.put(key, spec.path, chosen, trials, busy=measured.busy)
    return chosen, "measured", trials, refused, None


def report(
    spec: ModelSpec, trials: list[Trial], variants: list[Variant], notes: dict[str, str], was: Variant | None = None
) -> tuple[Variant, list[str]]:
    """The variant a measurement chose and the refusals, each logged in one line."""
    chosen = fastest(trials) or (trials[0].variant if trials else (providers.CPU, precisions.FP32))
    refused = [t.refusal() for t in unfaithful(trials, chosen[0])]
    uses = f"; auto uses {chosen[0]}{_at(chosen[1], variants)}"
    if was is not None and chosen != was:
        uses = f"; auto now uses {chosen[0]}{_at(chosen[1], variants)} (was {was[0]}{_at(was[1], variants)})"
    log.info("providers: measured %s: %s%s", spec.path.name, ", ".join(t.summary() for t in trials), uses)
    for line in refused:
        log.warning("precision: auto refused %s; %s runs at %s", line, providers.short(chosen[0]), chosen[1])
    if notes.get(chosen[0]):
        log.warning("precision %s: %s", spec.precision, notes[chosen[0]])
    return chosen, refused


def _at(precision: str, variants: list[Variant]) -> str:
    """" at bf16" where precision was part of the choice; nothing where every variant ran fp32."""
    return "" if all(p == precisions.FP32 for _, p in variants) else f" at {precision}"


def _int8_at_hand(spec: ModelSpec) -> bool:
    """Whether the int8 file of `spec` is in the cache as it was written (see `quantize.cached`)."""
    try:
        return quantize.cached(spec.path, spec.state_dir() / "int8", spec.state_dir()) is not None
    except ModelError:
        return False
