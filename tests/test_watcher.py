"""The watcher alone, on real files and its real threads: when a dropped file counts as complete.

Each test starts a Watcher on a temporary folder and records what it hands
over (`emit`) and what it reports as unusable (`report`); no daemon, no model.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import wait_for

from depthwatch.config import OutputConfig, WatchConfig
from depthwatch.daemon.watcher import Mode, Watcher, _Settling
from depthwatch.frames.rules import Rules


class Recorder:
    def __init__(self) -> None:
        self.emitted: list[tuple[Path, tuple[int, int, int], str | None]] = []
        self.reported: list[tuple[Path, str]] = []
        self.lock = threading.Lock()

    def emit(self, path: Path, signature: tuple[int, int, int], fmt: str | None) -> None:
        with self.lock:
            self.emitted.append((path, signature, fmt))

    def report(self, path: Path, reason: str) -> None:
        with self.lock:
            self.reported.append((path, reason))


@pytest.fixture
def watch(tmp_path: Path) -> Iterator:
    started: list[Watcher] = []

    def start(**settings) -> tuple[Watcher, Recorder]:
        config = WatchConfig(folders=(tmp_path,), patterns=("*.jpg", "*.tif"), **settings)
        recorder = Recorder()
        watcher = Watcher(Rules(config, OutputConfig(template="{stem}_depth.png")), config, recorder.emit, recorder.report)
        watcher.start()
        started.append(watcher)
        return watcher, recorder

    yield start
    for watcher in started:
        watcher.stop(5)


FRAME = jpeg_bytes(quadrant_frame(64, 48))


def _signature(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def test_a_frame_renamed_in_is_handed_over_once_with_its_format(tmp_path: Path, watch) -> None:
    _, seen = watch()
    write_by_rename(tmp_path / "a.jpg", FRAME)
    wait_for(lambda: seen.emitted, what="the frame")
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)  # events are in order: once this is in, a duplicate would be too
    wait_for(lambda: len(seen.emitted) >= 2, what="the sentinel")
    assert seen.emitted == [
        (tmp_path / "a.jpg", _signature(tmp_path / "a.jpg"), "jpeg"),
        (tmp_path / "sentinel.jpg", _signature(tmp_path / "sentinel.jpg"), "jpeg"),
    ]
    assert seen.reported == []


def test_a_frame_written_in_two_steps_is_handed_over_only_when_its_end_marker_is_there(tmp_path: Path, watch) -> None:
    _, seen = watch()
    path = tmp_path / "slow.jpg"
    with open(path, "wb") as f:  # the first half, closed: a writer that appends later
        f.write(FRAME[: len(FRAME) // 2])
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)
    wait_for(lambda: any(p.name == "sentinel.jpg" for p, _, _ in seen.emitted), what="the sentinel")
    assert [p.name for p, _, _ in seen.emitted] == ["sentinel.jpg"]  # the half file is not a frame yet
    with open(path, "ab") as f:
        f.write(FRAME[len(FRAME) // 2 :])
    wait_for(lambda: any(p == path for p, _, _ in seen.emitted), what="the completed frame")
    assert [(p, s) for p, s, _ in seen.emitted if p == path] == [(path, _signature(path))]


def test_a_file_that_never_completes_is_reported_at_the_timeout(tmp_path: Path, watch) -> None:
    _, seen = watch(incomplete_timeout_s=0.5)
    (tmp_path / "cut.jpg").write_bytes(FRAME[:-200])
    wait_for(lambda: seen.reported, what="the report")
    [(path, reason)] = seen.reported
    assert path == tmp_path / "cut.jpg" and reason.startswith("still incomplete after 0.5 s (no end marker)")
    assert seen.emitted == []


def test_an_empty_file_is_not_a_frame_until_it_stays_empty(tmp_path: Path, watch) -> None:
    # settle_ms far longer than the test: "stays empty" cannot be reached while it takes its steps.
    _, seen = watch(settle_ms=60_000)
    path = tmp_path / "rewritten.jpg"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # truncated for an in-place rewrite...
    os.close(fd)  # ...and closed while empty: the watcher certainly sees it at 0 bytes
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)  # events are checked in order
    wait_for(lambda: any(p.name == "sentinel.jpg" for p, _, _ in seen.emitted), what="the sentinel")
    assert [p.name for p, _, _ in seen.emitted] == ["sentinel.jpg"], "the empty file was taken for a frame"
    fd = os.open(path, os.O_WRONLY)  # ...and then written, unbuffered
    try:
        view = memoryview(FRAME)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    wait_for(lambda: any(p == path for p, _, _ in seen.emitted), what="the rewritten frame")
    assert [s[0] for p, s, _ in seen.emitted if p == path] == [len(FRAME)]  # never taken at 0 bytes


def test_an_empty_file_that_stays_empty_is_handed_over(tmp_path: Path, watch) -> None:
    _, seen = watch()
    write_by_rename(tmp_path / "empty.jpg", b"")  # really empty: handed over once settled (the pipeline says why)
    wait_for(lambda: seen.emitted, what="the empty file")
    assert [(p.name, s[0]) for p, s, _ in seen.emitted] == [("empty.jpg", 0)]


def test_settle_mode_waits_for_the_file_to_stop_changing(tmp_path: Path, watch) -> None:
    """Polling (network volumes) and FSEvents carry no close event: settle_ms decides."""
    watcher, seen = watch(observer="polling", poll_interval_ms=50, settle_ms=200)
    path = tmp_path / "polled.tif"  # TIFF: no end marker, so only settling can tell
    path.write_bytes(b"II*\x00" + bytes(100))
    wait_for(lambda: seen.emitted, what="the settled file")
    assert seen.emitted == [(path, _signature(path), "tiff")]
    watcher.poke(path, Mode.SETTLE)  # the same version again: not handed over twice
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)
    wait_for(lambda: len(seen.emitted) == 2, what="the sentinel")
    assert [p.name for p, _, _ in seen.emitted] == ["polled.tif", "sentinel.jpg"]



def test_an_event_checked_after_the_file_was_written_again_does_not_take_that_version_twice(tmp_path: Path, watch) -> None:
    """On a busy machine a close event can be checked after the next in-place rewrite; that
    rewrite's own event takes the new version, and the late one must not take it as well."""
    watcher, seen = watch()
    path = tmp_path / "frame.jpg"
    write_by_rename(path, FRAME)
    wait_for(lambda: len(seen.emitted) == 1, what="the first version")
    reported = time.time_ns()  # an event reported now...
    time.sleep(0.05)
    path.write_bytes(jpeg_bytes(quadrant_frame(64, 48, "bottom-right")))  # ...then a rewrite, with its own close
    wait_for(lambda: len(seen.emitted) == 2, what="the second version")
    # ...and only now is the earlier event checked (the settle thread was busy).
    watcher._check(path, _Settling(Mode.NOW, due=0.0, since=time.monotonic(), event_ns=reported))
    # The late check left a settle-time stand-in; once it has left the queue, a file moved in
    # afterwards is checked by the same thread after it, so its emission means the stand-in's
    # check has finished.
    wait_for(lambda: path not in watcher._pending, what="the late check's stand-in to be checked")
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)
    wait_for(lambda: any(p.name == "sentinel.jpg" for p, _, _ in seen.emitted), what="the sentinel")
    assert [s for p, s, _ in seen.emitted if p == path] == [seen.emitted[0][1], _signature(path)]


def test_a_late_event_still_takes_a_version_no_other_event_announces(tmp_path: Path, watch) -> None:
    """A file whose mtime is ahead of its event (a clock step, a copied future timestamp): settling takes it."""
    watcher, seen = watch()
    path = tmp_path / "future.jpg"
    write_by_rename(path, FRAME)
    wait_for(lambda: seen.emitted, what="the frame")
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(path, ns=(ahead, ahead))  # no close or move event for this
    watcher.poke(path, Mode.NOW)
    wait_for(lambda: len(seen.emitted) == 2, what="the version with the future mtime")
    assert seen.emitted[1][:2] == (path, _signature(path))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
@pytest.mark.parametrize("observer", ["native", "polling"])
def test_inotify_sends_only_the_events_the_watcher_acts_on(tmp_path: Path, watch, monkeypatch, observer: str) -> None:
    """Reading a frame, writing a map and syncing the folder raise open, modify and close-without-write
    events, which the watcher drops: on inotify they are not asked of the kernel at all, so watchdog's
    threads do not build and queue them (0.8 ms of CPU a frame in a burst). The polling observer
    settles files by their changes, and still gets every event."""
    kinds: list[str] = []
    handle = Watcher.on_event

    def recording(self: Watcher, event) -> None:
        kinds.append(event.event_type)
        handle(self, event)

    monkeypatch.setattr(Watcher, "on_event", recording)
    _, seen = watch(observer=observer, poll_interval_ms=100)
    write_by_rename(tmp_path / "a.jpg", FRAME)
    wait_for(lambda: seen.emitted, what="the frame")
    assert (tmp_path / "a.jpg").read_bytes() == FRAME  # read as the daemon reads it
    (tmp_path / "a_depth.png").write_bytes(b"a map")  # written as a map is (created, modified, closed)
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    write_by_rename(tmp_path / "sentinel.jpg", FRAME)  # events come in order: the ones before it are in
    wait_for(lambda: len(seen.emitted) >= 2, what="the sentinel")
    if observer == "native":
        assert set(kinds) <= {"created", "closed", "moved"}, kinds
        assert {"created", "closed", "moved"} <= set(kinds)
    else:
        assert "modified" in kinds, kinds
    assert [p.name for p, _, _ in seen.emitted] == ["a.jpg", "sentinel.jpg"]
