"""Shared fixtures: tiny generated models, real photographs, frames on disk."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import cv2
import numpy as np
import psutil
import pytest

# onnxruntime's telemetry off in the tests' own processes and everything they start (see
# depthwatch/__init__.py): the tests import onnxruntime before depthwatch. A test that checks
# depthwatch switches it off itself takes the variable out of its daemon's environment.
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

# A suite started in the background by a non-interactive shell (`pytest &` in a script, a CI
# runner) inherits SIGINT ignored, and every program it starts would too: `once` then rightly
# keeps it ignored, as a background job should, and the tests that press Ctrl-C would see exit 0.
# Those tests stand for an editor at a terminal, whose programs start with SIGINT at its default.
# (`service logs -f` takes Ctrl-C whatever it inherits: tests/test_launchd.py checks both ways.)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The test helpers beside this file, and the repository root for `benchmarks` (whose
# daemon harness the tests share), however pytest was started.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from daemon_process import DaemonProcess, machine_factor, wait_for  # noqa: E402
from onnx_models import brightness_model  # noqa: E402

#: The shared material (the real FastDepth model): $DEPTHWATCH_SHARED, else ../shared beside the checkout.
SHARED_ENV = "DEPTHWATCH_SHARED"
SHARED = Path(os.environ.get(SHARED_ENV) or Path(__file__).resolve().parents[2] / "shared").expanduser()
SHARED_MODELS = SHARED / "models"
FASTDEPTH = SHARED_MODELS / "fastdepth_224_nyu_int8.onnx"

T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The soak (marked slow: minutes of one daemon's fsyncs, not of CPU) first.

    With two test processes, it then runs beside all the others from the start,
    instead of alone at the end while the other process has nothing left to do.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)



@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test's time limit (pytest-timeout) stretched by the machine's load as the test starts.

    The limit is there to end a test that hangs, not to time one: the suite beside
    two busy loops runs several times slower, and a fixed limit would fail a
    daemon that is only slow. Runs before pytest-timeout reads the marker.
    """
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        base = item.config.getini("timeout")
    if base:
        factor = machine_factor()
        if factor > 1.0:
            item.add_marker(pytest.mark.timeout(float(base) * factor), append=False)
    yield

@pytest.fixture
def tiny_model(tmp_path: Path, _user_folders_of_its_own: None, _tiny_models_engines: Path) -> Path:
    """A 32x32 float NCHW model whose depth output is the frame's brightness.

    Its engines are remembered as measured, as on a user's machine after the
    model's first run (`_tiny_models_engines`). Tests of the measurement build
    the same model under a name of their own (`brightness_model`), and measure.
    """
    remember(_tiny_models_engines)
    return brightness_model(tmp_path / "tiny.onnx")


@pytest.fixture
def fastdepth() -> Path:
    if not FASTDEPTH.is_file():
        pytest.skip(
            f"the real model {FASTDEPTH} is not here; point ${SHARED_ENV} at the shared folder "
            "(the one holding models/fastdepth_224_nyu_int8.onnx) to run the real-model tests"
        )
    return FASTDEPTH


def quadrant_frame(width: int = 160, height: int = 96, bright: str = "top-left") -> np.ndarray:
    """A BGR frame, dark except one bright quadrant, so flips and transposes show."""
    frame = np.full((height, width, 3), 20, np.uint8)
    h2, w2 = height // 2, width // 2
    rows = slice(0, h2) if "top" in bright else slice(h2, height)
    cols = slice(0, w2) if "left" in bright else slice(w2, width)
    frame[rows, cols] = 235
    return frame


def jpeg_bytes(frame: np.ndarray, quality: int = 95) -> bytes:
    ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def write_by_rename(path: Path, data: bytes) -> None:
    """Drop a file the way a careful plugin does: hidden temp name, then rename."""
    tmp = path.with_name(f".incoming-{threading.get_ident()}-{path.name}")
    tmp.write_bytes(data)
    tmp.replace(path)


def fill_disk(disk: Path) -> Path:
    """Fill the filesystem `disk` is on with one file (returned, to remove for room again)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(65536))
        except OSError:
            pass
        try:  # the last blocks, smaller than the chunk
            while True:
                f.write(bytes(512))
        except OSError:
            pass  # full
    return filler


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real, small filesystem: a 1 MiB tmpfs (needs root, as in CI), for full-disk cases."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def api_daemon(tmp_path: Path, tiny_model: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start real daemons with the HTTP API on a free loopback port; each is closed after the test."""
    started: list[DaemonProcess] = []

    def start(restricted: bool = False, wrapper: tuple[str, ...] = (), **sections) -> DaemonProcess:
        sections["api"] = {"enabled": True, "port": 0, **sections.get("api", {})}
        d = DaemonProcess(tmp_path / f"d{len(started)}", tiny_model, restricted=restricted, wrapper=wrapper, **sections)
        started.append(d)
        d.start()
        d.url = wait_for(lambda: d.status().get("api"), what="the API address in the status file")
        return d

    yield start
    for d in started:
        d.close()


def _measured_once(home: Path, model: Path, profile: str) -> Path:
    """The cache folder a first `depthwatch once` on `model` leaves in `home`: its engines measured, the choice remembered.

    A user's machine measures a model's engines on its first run and
    remembers the choice (and keeps the int8 file it made); every later
    `once` and start reads it. Each test has a cache folder of its own, so
    without a remembered choice every `once` and every daemon on a model
    measures again: 1.5 to 3 s of CPU each on an AVX2 machine (onnxruntime
    and OpenVINO, int8 quantized, the maps checked), over a hundred times in
    the suite.
    """
    frame = home / "probe.jpg"
    frame.write_bytes(jpeg_bytes(quadrant_frame(224, 224)))
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache"), "XDG_STATE_HOME": str(home / "state"),
           "XDG_CONFIG_HOME": str(home / "config"), "XDG_DATA_HOME": str(home / "data")}
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(frame), "-o", str(home / "probe_depth.jpg"),
         "--model", str(model), "--profile", profile],
        capture_output=True, text=True, env=env, cwd=home, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    remembered = list((home / "cache").rglob("providers.json"))
    assert len(remembered) == 1, f"no engine choice remembered for {model.name}: {done.stderr[-2000:]}"
    # Remembered as a first run on a quiet machine remembers it. Measured here at the start of the
    # run, beside the other test processes starting, the choice is often marked as made on a busy
    # machine, and then every daemon started on the model measured its engines again in idle time
    # (up to 6 s of CPU each, in some forty tests that are not about the measurement).
    choices = json.loads(remembered[0].read_text())
    for choice in choices.values():
        choice["busy"] = False
    remembered[0].write_text(json.dumps(choices))
    return remembered[0].parent


def remember(measured: Path) -> None:
    """Give this test's cache folder what `measured` (a `_measured_once` folder) remembers, beside what it has.

    The choices go into its `providers.json`; the files they name (an int8
    model) are copied as they are: their folders are keyed by the model's
    content, not its path.
    """
    from depthwatch import paths

    cache = paths.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    for item in measured.iterdir():
        if item.is_dir():
            shutil.copytree(item, cache / item.name, dirs_exist_ok=True)
    mine = cache / "providers.json"
    known = json.loads(mine.read_text()) if mine.is_file() else {}
    known.update(json.loads((measured / "providers.json").read_text()))
    mine.write_text(json.dumps(known))


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(folder)` once for the whole run, its result shared by every test process (pytest-xdist's workers).

    The first process to ask makes it in a folder beside the workers' own (under the run's
    base temporary folder), the others wait on a lock and take what it made: what is the same
    for every process (the engines measured on this machine) is not made three times over at the
    start of the run, three processes at once on two cores. Without xdist: made here.
    `make`'s result must be JSON (a path is kept as text and given back as a Path).
    """
    import fcntl

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # the run's, shared by its workers
    made = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, also if `make` fails (the next one tries again)
        if not made.is_file():
            folder = root / name
            shutil.rmtree(folder, ignore_errors=True)  # a failed try's
            folder.mkdir()
            result = make(folder)
            made.write_text(json.dumps({"path": str(result)} if isinstance(result, Path) else {"value": result}))
        kept = json.loads(made.read_text())
    return Path(kept["path"]) if "path" in kept else kept["value"]  # type: ignore[return-value]


@pytest.fixture(scope="session", autouse=True)
def _slow_models_calibrated_once_per_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`onnx_models.slow_model`'s calibration measured once per run, shared by the test processes."""
    import onnx_models

    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        onnx_models.SHARED_CALIBRATION = tmp_path_factory.getbasetemp().parent / "layer_seconds.json"


@pytest.fixture(scope="session")
def _real_models_engines(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The real model's engines measured on this machine, once per run (see `_measured_once`, `once_per_run`).

    Tests of the measurement itself use models of their own, or folders of
    their own (`test_providers`, `test_ready_at_once`, `test_openvino`), and
    still start from nothing.
    """
    if not FASTDEPTH.is_file():
        return None
    return once_per_run(tmp_path_factory, "measured", lambda home: _measured_once(home, FASTDEPTH, "fastdepth-nyu"))


@pytest.fixture(scope="session")
def _tiny_models_engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_model`'s engines measured on this machine, once per run (see `_measured_once`, `once_per_run`)."""
    return once_per_run(
        tmp_path_factory, "measured-tiny", lambda home: _measured_once(home, brightness_model(home / "tiny.onnx"), "midas-v21-small")
    )


@pytest.fixture(autouse=True)
def _user_folders_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, _real_models_engines: Path | None
) -> None:
    """No test (nor any daemon it starts) reads the real user config or writes the real state or cache folders.

    The cache folder starts as a user's does after a first run of the real
    model: with its engine choice remembered (`_real_models_engines`).
    """
    home = tmp_path_factory.mktemp("user")
    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, str(home / name.lower()))
    if _real_models_engines is not None:
        remember(_real_models_engines)


#: Processes a module-scoped fixture owns though a test started them (a farm's worker added for
#: the tests after it): that fixture stops them. Everything else a test starts, the test stops.
MODULE_OWNED: set[int] = set()


def owned_by_the_module(pid: int) -> None:
    """Say that the process `pid`, started in a test, is its module fixture's to stop."""
    MODULE_OWNED.add(pid)


@pytest.fixture(autouse=True)
def _no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every process a test starts is gone when it ends, also when it failed: one left is killed, and named.

    Processes of module-scoped fixtures exist before this runs (or are in MODULE_OWNED) and are theirs to stop.
    """
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    owned = set(MODULE_OWNED)
    for pid in list(owned):
        with contextlib.suppress(psutil.Error):
            owned.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    left = [p for p in me.children(recursive=True) if p.pid not in before | owned and _running(p)]
    _, alive = psutil.wait_procs(left, timeout=10)  # one that is stopping right now gets the time to end
    names = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            names.append(" ".join(proc.cmdline())[:200] or proc.name())
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
    assert not names, f"processes left running by {request.node.name}: {names}"


def _running(proc: psutil.Process) -> bool:
    """Not yet ended (a zombie has ended: its Popen reaps it)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Every thread a test starts is joined by the time it ends (watchdog's rule too)."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(10)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"
