"""A measured candidate's figures (`Trial`), and which of several trials wins.

A variant is a provider and a precision. Its trial holds the times, the
memory, and how faithful its maps were to the reference's; `fastest` picks
among the faithful ones, `in_order` says in which order they are measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from depthwatch.model.choosing import precision as precisions

#: A candidate: (provider, precision).
Variant = tuple[str, str]


@dataclass(frozen=True)
class Trial:
    """One variant's figures; `error` says why it was dropped."""

    provider: str
    precision: str = precisions.FP32
    load_s: float | None = None
    run_ms: float | None = None
    runs: int = 0
    peak_mib: float | None = None
    #: Nodes the provider ran in the traced run, and all nodes of that run.
    nodes: int | None = None
    total_nodes: int | None = None
    error: str | None = None
    #: The lowest correlation of its probe maps with the reference's (None: it is the reference).
    agreement: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.run_ms is not None

    @property
    def variant(self) -> Variant:
        return (self.provider, self.precision)

    @property
    def faithful(self) -> bool:
        return self.agreement is None or self.agreement >= precisions.FAITHFUL

    @property
    def eligible(self) -> bool:
        """Fast enough to have figures, and its maps those of the reference."""
        return self.ok and self.faithful

    @property
    def name(self) -> str:
        return f"{self.provider.replace('ExecutionProvider', '')} {self.precision}"

    def refusal(self) -> str:
        """Why this variant was not taken for its maps, in one line."""
        return (
            f"{self.precision} on {self.provider.replace('ExecutionProvider', '')}: its maps correlate "
            f"{self.agreement:.4f} with the reference's (at least {precisions.FAITHFUL} needed)"
        )

    def summary(self) -> str:
        if not self.ok:
            return f"{self.name} dropped ({self.error})"
        text = f"{self.name} {self.run_ms:.1f} ms (load {self.load_s:.2f} s)"
        if not self.faithful:
            text += f" not faithful (correlation {self.agreement:.4f} < {precisions.FAITHFUL})"
        return text


def _rank(variant: Variant) -> tuple[bool, bool]:
    return (variant[1] != precisions.FP32, variant[0] != "CPUExecutionProvider")


#: Providers that run on the CPU's cores (OpenVINO is measured on its CPU device).
_ON_THE_CPU = ("CPUExecutionProvider", "OpenVINO")


def _likely_fast(variant: Variant) -> tuple[bool, bool]:
    return (variant[0] in _ON_THE_CPU, variant[1] == precisions.FP32)


def in_order(variants: Sequence[Variant], then: Variant | None = None, *, fastest_first: bool = False) -> list[Variant]:
    """The order variants are measured in: the reference first, `then` next, fp32 before reduced precisions.

    `fastest_first`: after the reference, the likely fastest first: accelerators,
    then reduced precisions on the CPU, then the CPU's other fp32 engines, so a
    lazy measurement (`Measurement`'s `lazy`) can stop the slower ones early.
    """
    order = sorted(variants, key=_rank)
    if fastest_first:
        order = order[:1] + sorted(order[1:], key=_likely_fast)
    if then in order[1:]:
        order.remove(then)
        order.insert(1, then)
    return order


def reference(variants: Sequence[Variant]) -> Variant:
    """The variant every other is compared with: the CPU provider at fp32 if offered, else the first fp32 one."""
    return in_order(variants)[0]


#: Another variant serves instead of the reference (the first measured: the CPU provider at fp32)
#: only when its median run takes at most this share of the reference's. A lead of a few percent on
#: one frame at a time is within the noise of five runs and does not survive a burst, where the
#: image work shares the cores: on an AVX2 EPYC OpenVINO fp32, at 0.91x ONNX Runtime's time a run,
#: bursts at 0.92x to 1.05x its frames a second from one run of `python -m benchmarks` to the next. A
#: switch also costs a second runtime's memory. int8 where faithful (about 0.5x) and bf16 (0.3x) pass.
SWITCH = 0.85


def fastest_trial(trials: Sequence[Trial]) -> Trial | None:
    """The faithful trial to serve from: the fastest one that is clearly faster than the reference
    (SWITCH), else the reference itself; earlier wins a tie."""
    good = [t for t in trials if t.eligible]
    if not good:
        return None
    if good[0] is not trials[0]:  # no reference to hold to
        return min(good, key=lambda t: t.run_ms)  # type: ignore[arg-type,return-value]
    reference, *others = good
    bar = SWITCH * reference.run_ms  # type: ignore[operator]
    faster = [t for t in others if t.run_ms <= bar]  # type: ignore[operator]
    return min(faster, key=lambda t: t.run_ms) if faster else reference  # type: ignore[arg-type,return-value]


def to_beat(trials: Sequence[Trial]) -> tuple[float, str] | None:
    """The median time a further variant must reach to be chosen over `trials`, and what sets it.

    Under the chosen one's time, or SWITCH of the reference's while the reference is the choice.
    """
    best = fastest_trial(trials)
    if best is None or best.run_ms is None:
        return None
    if best is trials[0]:
        return SWITCH * best.run_ms, f"{SWITCH:.2f} x {best.name}'s {best.run_ms:.1f} ms"
    return best.run_ms, f"{best.name}'s {best.run_ms:.1f} ms"


def fastest(trials: Sequence[Trial]) -> Variant | None:
    """The variant of `fastest_trial`."""
    best = fastest_trial(trials)
    return None if best is None else best.variant


def unfaithful(trials: Sequence[Trial], provider: str) -> list[Trial]:
    """The reduced precisions of `provider` that were measured and refused for their maps."""
    return [t for t in trials if t.provider == provider and t.ok and not t.faithful]
