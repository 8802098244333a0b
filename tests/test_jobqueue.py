"""The latest-wins queue, on its own: order, replacement, in-progress outputs, the bound."""

from __future__ import annotations

import threading
from pathlib import Path

from daemon_process import wait_for

from depthwatch.frames.jobqueue import LatestWinsQueue
from depthwatch.frames.job import Job


def job(source: str, output: str, version: int = 0) -> Job:
    return Job(Path(source), Path(output), signature=(version, version, 1))


def test_newer_job_for_an_output_replaces_the_waiting_one_and_order_is_kept():
    q = LatestWinsQueue(10)
    q.put(job("a.jpg", "a_d.jpg", 1))
    q.put(job("b.jpg", "b_d.jpg", 1))
    q.put(job("a.jpg", "a_d.jpg", 2))  # newer version of a
    q.put(job("other.jpg", "b_d.jpg", 1))  # another frame with b's output
    assert q.superseded == 2
    # A replacement takes its arrival time: a (version 2) came before other.
    first, second = q.get(0), q.get(0)
    assert (first.source.name, first.signature) == ("a.jpg", (2, 2, 1))
    assert second.source.name == "other.jpg"
    assert q.get(0) is None


def test_a_newer_job_for_an_output_in_progress_is_handed_out_at_once():
    """The pipeline abandons the older one; the queue does not hold the newer back."""
    q = LatestWinsQueue(10)
    q.put(job("f.jpg", "d.jpg", 1))
    running = q.get(0)
    q.put(job("f.jpg", "d.jpg", 2))
    assert q.get(0).signature == (2, 2, 1)
    assert q.in_progress == 2
    q.done(running)
    assert q.in_progress == 1


def test_the_same_version_is_not_queued_twice():
    q = LatestWinsQueue(10)
    q.put(job("f.jpg", "d.jpg", 1))
    assert q.put(job("f.jpg", "d.jpg", 1))
    assert len(q) == 1 and q.superseded == 0
    running = q.get(0)
    assert q.put(job("f.jpg", "d.jpg", 1))  # already in progress
    assert len(q) == 0
    q.done(running)


def test_a_version_whose_result_is_settled_is_queued_again_before_done():
    """Its map deleted since, a request wants it made again: not folded into the job that has ended."""
    q = LatestWinsQueue(10)
    q.put(job("f.jpg", "d.jpg", 1))
    running = q.get(0)
    q.settled(running)
    assert q.put(job("f.jpg", "d.jpg", 1)) and len(q) == 1
    again = q.get(0)
    q.done(running)  # the older job's done leaves the newer one started
    assert q.put(job("f.jpg", "d.jpg", 1)) and len(q) == 0
    q.done(again)
    assert q.in_progress == 0


def _waiting_on(cond: threading.Condition) -> int:
    """How many threads are blocked in `cond.wait()` (CPython keeps one lock per waiter in
    `_waiters`); read under the condition's lock, so a getter counted here is really waiting."""
    with cond:
        return len(cond._waiters)  # type: ignore[attr-defined]


def test_bounded_and_closing_wakes_a_waiting_getter():
    q = LatestWinsQueue(2)
    assert q.put(job("a", "1")) and q.put(job("b", "2"))
    assert not q.put(job("c", "3")) and q.overflowed
    got = []
    getter = threading.Thread(target=lambda: (q.get(), q.get(), got.append(q.get())))
    getter.start()
    wait_for(lambda: _waiting_on(q._cond), what="the getter to block on the empty queue")
    assert got == [] and getter.is_alive()
    q.close()
    getter.join(10)
    assert got == [None] and not getter.is_alive()


def test_a_newer_version_of_a_started_job_calls_supersede_with_it_and_the_same_version_does_not():
    q = LatestWinsQueue(10)
    told: list[Job] = []
    q.put(job("f.mov", "d.mov", 1))
    running = q.get(0)
    q.put(job("f.mov", "d.mov", 1), supersede=told.append)  # found again (a rescan): nothing
    assert told == [] and len(q) == 0
    q.put(job("f.mov", "d.mov", 2), supersede=told.append)
    assert told == [running] and len(q) == 1
    q.put(job("g.mov", "e.mov", 1), supersede=told.append)  # another output: nothing started for it
    assert told == [running]


def test_the_clip_thread_keeps_latest_wins_in_the_same_queue(tmp_path, monkeypatch):
    """A clip's job goes through the frames' queue: a newer version cancels the one in progress, the same one
    found again is not queued twice, and a full queue turns a clip away (False) for the rescan to find."""
    from depthwatch.clips.job import ClipJob, ClipResult
    from depthwatch.daemon.clipthread import NEWER, ClipRunner

    started, results = threading.Event(), []
    release = threading.Event()

    # The clip's work (make_clip) is what this test is not about: a stand-in blocks until cancelled or released.
    runner = ClipRunner(None, lambda: None, lambda: None, lambda j, r: results.append((j, r)), maxsize=1)  # type: ignore[arg-type]
    calls: list[str | None] = []

    def work(job, engine, settings, cancelled, gate, on_progress) -> ClipResult:
        started.set()
        wait_for(lambda: cancelled() is not None or release.is_set(), what="a cancel or the release")
        calls.append(cancelled())
        return ClipResult(job, error=cancelled())

    monkeypatch.setattr("depthwatch.daemon.clipthread.make_clip", work)
    try:
        runner.start()
        v1 = ClipJob(tmp_path / "a.mov", tmp_path / "a_depth.mov", (1, 1, 1))
        assert runner.submit(v1)
        wait_for(started.is_set, what="the first clip started")
        assert runner.submit(ClipJob(tmp_path / "a.mov", tmp_path / "a_depth.mov", (1, 1, 1)))  # found again
        assert runner.waiting == 0 and calls == []
        v2 = ClipJob(tmp_path / "a.mov", tmp_path / "a_depth.mov", (2, 2, 1))
        assert runner.submit(v2)
        assert not runner.submit(ClipJob(tmp_path / "b.mov", tmp_path / "b_depth.mov", (1, 1, 1)))  # full: one waits
        wait_for(lambda: len(results) >= 1, what="the first version's end")
        assert results[0][0] is v1 and results[0][1].error == NEWER
        release.set()
        wait_for(lambda: len(results) == 2, what="the newer version's end")
        assert results[1][0] is v2 and results[1][1].error is None
    finally:
        release.set()
        assert runner.stop(10)
