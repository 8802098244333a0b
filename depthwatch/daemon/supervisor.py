"""Liveness, decided in one place: what each long-lived thread does and since when, and whether the daemon is healthy.

Every long-lived thread has a `Slot`: before it works on something it says
what (`working`), and after, that it is idle again; a thread that waits beats
(`beat`) so its record stays fresh. The inference thread's record is the
engine's own (`Engine.running`: the run in progress and since when). The
status file's `state`, `threads` and `heartbeat_at`, `GET /health`, and
systemd's `WATCHDOG=1` are all read off this one record (`verdict`), nowhere
else.

The frames the threads work on are also noted on disk (`blackbox`), one slot
per thread: a frame that ends the process in any stage is named at the next
start and, ended on twice, set aside.

A model run that lasts past the stall bound (`stall_bound`: the larger of
`daemon.stall_timeout_s` and STALL_RUNS times the median of the last runs) is
given up through its RunOptions: its frame fails with one line and is set
aside at once (the model hangs on it; it is not tried again, not even after a
restart), and the next frame is served. A run that does not end within
GIVE_UP_GRACE_S of being given up (one long operator, a driver that does not
come back) makes the daemon `stalled`: `/health` answers 503 with the reason,
and the daemon exits EX_SOFTWARE so the service manager starts it again.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from depthwatch.daemon.blackbox import INFER, BlackBox
from depthwatch.logtext import shown

log = logging.getLogger("depthwatch")

#: An idle daemon rewrites its status (its `heartbeat_at`) this often, so `status` tells idle from stuck.
HEARTBEAT_S = 5.0
#: A status whose heartbeat is older than this, with its process still there, is "not answering".
SILENT_AFTER_S = 30.0
#: The stall bound is at least this many times the median of the last runs.
STALL_RUNS = 20
#: A run given up that has not ended after this long cannot be given up: the daemon is stalled.
GIVE_UP_GRACE_S = 5.0
#: Thread records in the black box: the inference thread's, the clip thread's, then the workers'.
_INFERENCE_SLOT, _CLIP_SLOT, _FIRST_WORKER_SLOT = 0, 1, 2


class Runs(Protocol):
    """What the supervisor reads of the engine (`model.engine.Engine`)."""

    @property
    def running(self) -> tuple[Any, float] | None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    @property
    def run_seconds(self) -> Any: ...

    def give_up_running(self, run: tuple[Any, float], why: str) -> bool: ...


@dataclass
class Doing:
    """One thread's record: what it works on (None: idle), since when and its last beat (monotonic)."""

    what: str | None
    since: float
    beat: float


@dataclass(frozen=True)
class Verdict:
    """What the daemon says of itself: whether it serves, its state for the status file, and why not."""

    serving: bool
    state: str
    reason: str | None = None


class Slot:
    """One thread's record, kept by the thread itself."""

    def __init__(self, supervisor: Supervisor, name: str, box_slot: int | None) -> None:
        self._supervisor = supervisor
        self.name = name
        self._box_slot = box_slot
        now = supervisor.clock()
        self.doing = Doing(None, now, now)

    def working(self, label: Any, stage: str) -> None:
        """This thread begins `stage` of `label` ((path, version) of a frame or clip; None: an image in memory)."""
        now = self._supervisor.clock()
        name = shown(Path(label[0]).name) if label is not None else "an image"
        self.doing = Doing(f"{name} ({stage})", now, now)
        if self._box_slot is not None and label is not None:
            self._supervisor.record.note(label, self._box_slot, stage)

    def idle(self) -> None:
        """This thread has finished what it worked on and waits for more."""
        now = self._supervisor.clock()
        self.doing = Doing(None, now, now)
        if self._box_slot is not None:
            self._supervisor.record.note(None, self._box_slot)

    def beat(self) -> None:
        """Still here (a thread that waits calls this at least every few seconds)."""
        self.doing.beat = self._supervisor.clock()


class Supervisor:
    """The one record of what every thread does; the daemon's health read off it (main loop: `check`, `verdict`)."""

    def __init__(self, record: BlackBox, stall_timeout_s: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        self._stall_timeout_s = stall_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._slots: dict[str, Slot] = {}
        self._workers: dict[int, Slot] = {}
        self._engine: Runs | None = None
        self._on_hung: Callable[[Any], None] = lambda label: None
        #: The run given up, and when (monotonic): it must end within GIVE_UP_GRACE_S.
        self._given_up: tuple[tuple[Any, float], float] | None = None
        #: Why the daemon cannot serve for good (a run that cannot be given up, the inference thread gone).
        self.stalled: str | None = None

    # -- the threads' side -------------------------------------------------------------

    def slot(self, name: str) -> Slot:
        """The record of a thread of its own (settle, scan, clip, api, main); the clip thread's is noted on disk."""
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                slot = self._slots[name] = Slot(self, name, _CLIP_SLOT if name == "clip" else None)
            return slot

    def worker(self, label: Any, stage: str | None) -> None:
        """A worker thread begins `stage` of `label`, or (stage None) is done with it: the pipeline's hook."""
        ident = threading.get_ident()
        slot = self._workers.get(ident)
        if slot is None:
            with self._lock:
                index = len(self._workers)
                slot = self._workers[ident] = Slot(self, f"worker_{index}", _FIRST_WORKER_SLOT + index)
        if stage is None:
            slot.idle()
        else:
            slot.working(label, stage)

    def inference_note(self, label: Any) -> None:
        """The engine's hook: `label` is about to run through the model (None: the run is over)."""
        self.record.note(label, _INFERENCE_SLOT, INFER)

    def slots_on_disk(self, workers: int) -> int:
        """How many black-box slots the daemon's threads need."""
        return _FIRST_WORKER_SLOT + workers

    def watch(self, engine: Runs, on_hung: Callable[[Any], None]) -> None:
        """Time `engine`'s runs; `on_hung(label)` is told of a frame whose run was given up."""
        self._engine = engine
        self._on_hung = on_hung

    # -- the main loop's side ----------------------------------------------------------

    def stall_bound(self) -> float:
        """Seconds a model run may take before it is given up."""
        floor = self._stall_timeout_s()
        engine = self._engine
        seconds = list(engine.run_seconds) if engine is not None else []
        return max(floor, STALL_RUNS * statistics.median(seconds)) if seconds else floor

    def check(self) -> None:
        """Give up a model run past the stall bound; say `stalled` if one given up does not end (main loop)."""
        engine = self._engine
        if engine is None or self.stalled is not None:
            return
        if not engine.alive:
            self.stalled = engine.failure or "the inference thread ended"
            return
        run = engine.running
        now = self.clock()
        if self._given_up is not None:
            given, at = self._given_up
            if run is not given:
                self._given_up = None  # it ended: the next frame is served
            elif now - at >= GIVE_UP_GRACE_S:
                self.stalled = (
                    f"the model has run on {_named(given[0])} for {now - given[1]:.0f} s and did not stop when given up; "
                    "exiting, so that the service manager starts depthwatch again"
                )
                log.error("%s", self.stalled)
            return
        if run is None:
            return
        bound = self.stall_bound()
        if now - run[1] < bound:
            return
        label = run[0]
        why = (
            f"the model ran on it for more than {bound:.0f} s (daemon.stall_timeout_s, or {STALL_RUNS} times its median run) "
            "and was given up; it is set aside until it changes or another model is loaded"
        )
        if label is not None:
            self._on_hung(label)  # before the run is given up: a process that ends now still knows it
        if engine.give_up_running(run, why):
            self._given_up = (run, now)

    def verdict(self, state: str, health_error: str | None, stopping: bool) -> Verdict:
        """Whether the daemon serves, and the state its status says: read off the threads' record."""
        engine = self._engine
        if engine is not None and not engine.alive:  # also before the main loop's next look has said so
            return Verdict(False, state, self.stalled or engine.failure or "the inference thread ended")
        if self.stalled is not None:  # through the stop that follows, too: that is why it stops
            return Verdict(False, "stalled", self.stalled)
        if state != "running" or stopping:
            return Verdict(False, state)
        if health_error is not None:
            return Verdict(False, state, health_error)
        return Verdict(True, state)

    def threads(self) -> dict[str, dict[str, Any]]:
        """Each thread's record for the status file: what it does ("idle") and for how many seconds."""
        now = self.clock()
        out: dict[str, dict[str, Any]] = {}
        engine = self._engine
        if engine is not None:
            run = engine.running
            out["inference"] = (
                {"doing": f"{_named(run[0])} (infer)", "for_s": round(now - run[1], 1)} if run is not None else {"doing": "idle"}
            )
        with self._lock:
            slots = [*self._slots.values(), *self._workers.values()]
        for slot in slots:
            doing = slot.doing
            out[slot.name] = (
                {"doing": doing.what, "for_s": round(now - doing.since, 1)} if doing.what is not None else {"doing": "idle"}
            )
        return out


def _named(label: Any) -> str:
    return shown(Path(label[0]).name) if label is not None else "an image"
