"""The engine: one session, made on the inference thread, for any I/O family of model."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import cv2
import numpy as np
import onnxruntime
import pytest
from conftest import jpeg_bytes, quadrant_frame
from daemon_process import wait_for
from onnx import TensorProto
from onnx_models import brightness_model, failing_model, spec_for

from depthwatch.errors import ModelError, Superseded
from depthwatch.frames.job import Job
from depthwatch.frames.pipeline import Pipeline
from depthwatch.frames.settings import Settings
from depthwatch.imaging.levels import Levels
from depthwatch.imaging.render import RenderOptions
from depthwatch.model import providers
from depthwatch.model.engine import Engine
from depthwatch.model.profiles import PROFILES
from depthwatch.model.spec import ModelSpec

FAMILIES = {
    "nchw-float-fixed-1HW": dict(layout="NCHW", size=(32, 32), output="1HW"),
    "nchw-float-fixed-11HW": dict(layout="NCHW", size=(32, 32), output="11HW"),
    "nhwc-uint8-fixed-1HW1": dict(layout="NHWC", dtype=TensorProto.UINT8, size=(32, 32), output="1HW1"),
    "nchw-float-dynamic-1HW": dict(layout="NCHW", size=None, output="1HW"),
    "nhwc-float-dynamic-11HW": dict(layout="NHWC", size=None, output="11HW"),
}


def run_frame(tmp_path: Path, model: Path, frame: np.ndarray, output: str, settings: Settings = Settings()) -> np.ndarray:
    source = tmp_path / "frame.png"
    cv2.imwrite(str(source), frame)
    with Engine(spec_for(model)) as engine:
        pipeline = Pipeline(engine)
        result = pipeline.process(Job(source, tmp_path / output), settings)
        pipeline.close()
    assert result.ok, result.error
    return cv2.imread(str(tmp_path / output), cv2.IMREAD_UNCHANGED)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("output", ["depth.jpg", "depth.png"])
def test_each_io_family_gives_a_map_of_the_frame_the_right_way_up(tmp_path, family, output):
    model = brightness_model(tmp_path / "m.onnx", **FAMILIES[family])
    frame = quadrant_frame(160, 96, bright="top-left")  # not square: a transpose would show
    depth = run_frame(tmp_path, model, frame, output)
    assert depth.shape == (96, 160)
    top = 255 if output.endswith(".jpg") else 65535
    assert depth.dtype == (np.uint8 if top == 255 else np.uint16)
    # The bright quadrant is near (white); its opposite is far (black); full range used.
    assert depth[10:38, 10:70].mean() > 0.95 * top
    assert depth[58:86, 90:150].mean() < 0.05 * top
    assert depth[:48, 80:].mean() < 0.05 * top and depth[48:, :80].mean() < 0.05 * top
    assert depth.min() <= 0.02 * top and depth.max() >= 0.98 * top


def test_invert_makes_near_black(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    depth = run_frame(tmp_path, model, quadrant_frame(), "depth.jpg", Settings(render=RenderOptions(levels=Levels(invert=True))))
    assert depth[10:38, 10:70].mean() < 13 and depth[58:86, 90:150].mean() > 242


def test_sixteen_threads_during_loading_make_exactly_one_session_on_the_inference_thread(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    release = threading.Event()
    calls: list[str] = []

    def recording_factory(*args, **kwargs):
        calls.append(threading.current_thread().name)
        assert release.wait(30), "the test never released the load"
        return onnxruntime.InferenceSession(*args, **kwargs)

    engine = Engine(spec_for(model), session_factory=recording_factory).start()
    tensor = np.zeros((1, 3, 32, 32), np.float32)
    submitted = threading.Semaphore(0)
    results, errors = [], []

    def submit() -> None:
        future = engine.infer(tensor, generation=1)
        submitted.release()  # handed to the engine, while the model is still loading
        try:
            results.append(future.result(60))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for t in threads:
        t.start()
    for _ in threads:
        assert submitted.acquire(timeout=30), "a thread never got its inference queued"
    # All 16 are queued, and the load is still held: it is on the inference thread, nothing has run.
    wait_for(lambda: calls, what="the load to start")
    assert calls == ["depthwatch-inference"] and engine.run_count == 0 and engine.info is None
    release.set()
    for t in threads:
        t.join(60)
    engine.stop()
    assert not errors
    assert len(results) == 16
    assert calls == ["depthwatch-inference"]
    assert engine.load_count == 1 and engine.run_count == 16


def _a_non_cpu_provider() -> str:
    """A provider this onnxruntime build lists besides CPU, to play a GPU; skip on a CPU-only build."""
    others = [p for p in onnxruntime.get_available_providers() if p != providers.CPU]
    if not others:
        pytest.skip("this onnxruntime build lists no provider but CPU to stand in for an accelerator")
    return others[0]


def test_unavailable_provider_falls_back_to_cpu_with_a_warning(tmp_path, caplog):
    model = brightness_model(tmp_path / "m.onnx")
    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=("cuda", "coreml"))
    with caplog.at_level(logging.WARNING, logger="depthwatch"), Engine(spec) as engine:
        info = engine.wait_ready()
    assert info.providers == (providers.CPU,)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "CUDAExecutionProvider is not available in this onnxruntime build; using the next provider" in warnings
    assert "CoreMLExecutionProvider is not available in this onnxruntime build; using the next provider" in warnings


def test_provider_that_fails_to_start_falls_back_to_cpu(tmp_path, caplog):
    """No GPU exists here, so a factory refusing non-CPU providers stands in for a failing one."""
    model = brightness_model(tmp_path / "m.onnx")
    gpu_like = _a_non_cpu_provider()

    def factory(path, sess_options=None, providers=None):
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        if gpu_like in names:
            raise RuntimeError(f"{gpu_like}: device not found")
        return onnxruntime.InferenceSession(path, sess_options=sess_options, providers=providers)

    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=(gpu_like,))
    with caplog.at_level(logging.WARNING, logger="depthwatch"), Engine(spec, session_factory=factory) as engine:
        info = engine.wait_ready()
    assert info.providers == (providers.CPU,)
    assert f"could not start {gpu_like} ({gpu_like}: device not found); falling back to CPU" in caplog.messages


def test_provider_choice_and_coreml_options():
    assert providers.choose("auto", ["CoreMLExecutionProvider", "CPUExecutionProvider"]) == (
        ["CoreMLExecutionProvider", "CPUExecutionProvider"],
        [],
    )
    assert providers.choose("auto", ["CUDAExecutionProvider", "CPUExecutionProvider", "CoreMLExecutionProvider"])[0] == [
        "CoreMLExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    chosen, skipped = providers.choose(["cpu", "cuda"], ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert chosen == ["CPUExecutionProvider", "CUDAExecutionProvider"]  # an explicit order is honoured
    assert skipped == []
    options = providers.options_for(providers.COREML, Path("/cache/coreml/model"), version="1.21.0")
    assert options == {
        "ModelFormat": "MLProgram",
        "MLComputeUnits": "ALL",
        "RequireStaticInputShapes": "1",
        "ModelCacheDirectory": "/cache/coreml/model",
    }
    # 1.17 to 1.20 read only the legacy flags (1.20 refuses keys it does not know) and cache nothing.
    for old in ("1.17.3", "1.20.1"):
        assert providers.options_for(providers.COREML, Path("/cache"), version=old) == {
            "flags": "COREML_FLAG_CREATE_MLPROGRAM|COREML_FLAG_ONLY_ALLOW_STATIC_INPUT_SHAPES"
        }


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist"), (b"this is not a model", "cannot load model")],
)
def test_missing_or_corrupt_model_is_a_model_error(tmp_path, content, message):
    path = tmp_path / "broken.onnx"
    if content is not None:
        path.write_bytes(content)
    engine = Engine(spec_for(path)).start()
    with pytest.raises(ModelError, match=message):
        engine.wait_ready(30)
    with pytest.raises(ModelError):
        engine.infer(np.zeros((1, 3, 32, 32), np.float32), 1).result(30)
    engine.stop()


def test_an_inference_error_fails_that_frame_only(tmp_path):
    model = failing_model(tmp_path / "fails.onnx")
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    cv2.imwrite(str(good), np.full((16, 16, 3), 100, np.uint8))
    cv2.imwrite(str(bad), np.full((16, 16, 3), 255, np.uint8))
    with Engine(spec_for(model)) as engine:
        pipeline = Pipeline(engine)
        first = pipeline.process(Job(bad, tmp_path / "bad_depth.png"), Settings())
        second = pipeline.process(Job(good, tmp_path / "good_depth.png"), Settings())
        pipeline.close()
    assert first.error and first.error.startswith("inference failed:")
    assert not (tmp_path / "bad_depth.png").exists()
    assert second.ok and (tmp_path / "good_depth.png").exists()


def test_reload_swaps_on_the_inference_thread_and_keeps_the_old_model_on_failure(tmp_path):
    small = brightness_model(tmp_path / "a.onnx", size=(32, 32))
    other = brightness_model(tmp_path / "b.onnx", size=(48, 48), scale=2.0)
    with Engine(spec_for(small)) as engine:
        first = engine.wait_ready()
        stale = engine.infer(np.zeros((1, 3, 32, 32), np.float32), first.generation)
        swapped = engine.reload(spec_for(other)).result(30)
        assert stale.result(30).prediction.shape == (32, 32)  # queued before the swap: old model
        assert swapped.generation == first.generation + 1 and swapped.contract.fixed_size == (48, 48)
        with pytest.raises(ModelError):
            engine.reload(spec_for(tmp_path / "missing.onnx")).result(30)
        assert engine.info.spec.path == other  # the failed load left the model in service
        assert engine.load_count == 2


def test_a_frame_that_ends_the_inference_thread_is_named_and_the_frames_behind_it_are_not_failed(tmp_path):
    """The frame at fault gets a line of its own (its error is not lost with the thread), and the
    frames queued behind it are not logged and counted as failed with the engine's error."""
    from depthwatch.errors import FrameError, Stopped

    model = brightness_model(tmp_path / "m.onnx", size=(32, 32))
    with Engine(spec_for(model)) as engine:
        info = engine.wait_ready()
        queued = threading.Event()
        run = engine._run

        def ends_the_thread(session, future, tensor, *rest):  # a fault no per-job handler can catch
            if tensor.max() > 0.5:
                queued.wait(30)
                raise SystemExit("a fault inside the runtime")
            return run(session, future, tensor, *rest)

        engine._run = ends_the_thread  # type: ignore[method-assign]
        culprit = engine.infer(np.ones((1, 3, 32, 32), np.float32), info.generation)
        behind = [engine.infer(np.zeros((1, 3, 32, 32), np.float32), info.generation) for _ in range(3)]
        queued.set()
        with pytest.raises(FrameError, match="the inference thread stopped while running the model on it: .*a fault inside the runtime"):
            culprit.result(30)
        for future in behind:
            with pytest.raises(Stopped, match="not mapped: the inference engine stopped on another frame before it ran"):
                future.result(30)
        assert not engine.alive and "a fault inside the runtime" in (engine.failure or "")


def test_frame_errors_name_the_reason(tmp_path):
    model = brightness_model(tmp_path / "m.onnx")
    cases = {
        "empty.jpg": b"",
        "text.jpg": b"just some words",
        "wrong.jpg": cv2.imencode(".png", quadrant_frame())[1].tobytes(),
        "cut.jpg": jpeg_bytes(quadrant_frame())[:300],
    }
    with Engine(spec_for(model)) as engine:
        pipeline = Pipeline(engine)
        for name, data in cases.items():
            (tmp_path / name).write_bytes(data)
        results = {name: pipeline.process(Job(tmp_path / name, tmp_path / f"{name}.out.jpg"), Settings()) for name in cases}
        missing = pipeline.process(Job(tmp_path / "nowhere.jpg", tmp_path / "x.jpg"), Settings())
        pipeline.close()
    assert "empty" in results["empty.jpg"].error
    assert "not a JPEG, PNG, TIFF, WebP, EXR or DPX" in results["text.jpg"].error
    assert results["wrong.jpg"].error == "is a PNG image but its name says .jpg; rename it"
    assert "cut short" in results["cut.jpg"].error
    assert "vanished" in missing.error
    assert not list(tmp_path.glob("*.out.jpg"))


def test_provider_failing_at_run_time_rebuilds_on_cpu_once(tmp_path, caplog):
    """A session that loads on an accelerator and then fails in run() (no GPU exists here,
    so a wrapper around a real CPU session plays the failing device)."""
    model = brightness_model(tmp_path / "m.onnx")
    gpu_like = _a_non_cpu_provider()

    class FailingDevice:
        def __init__(self, session):
            self.session, self.runs = session, 0

        def get_providers(self):
            return [gpu_like, providers.CPU]

        def get_inputs(self):
            return self.session.get_inputs()

        def get_outputs(self):
            return self.session.get_outputs()

        def run(self, names, feed, options=None):
            self.runs += 1
            if self.runs > 1:  # the warm-up passes; real frames hit a lost device
                raise RuntimeError("device lost")
            return self.session.run(names, feed, options)

    def factory(path, sess_options=None, providers=None):
        session = onnxruntime.InferenceSession(path, sess_options=sess_options, providers=["CPUExecutionProvider"])
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        return FailingDevice(session) if gpu_like in names else session

    spec = ModelSpec(path=model, profile=PROFILES["midas-v21-small"], providers=(gpu_like,))
    tensor = np.zeros((1, 3, 32, 32), np.float32)
    with caplog.at_level(logging.WARNING, logger="depthwatch"), Engine(spec, session_factory=factory) as engine:
        first = engine.wait_ready()
        assert first.providers == (gpu_like, providers.CPU)
        results = [engine.infer(tensor, first.generation).result(30) for _ in range(3)]
        assert engine.info.providers == (providers.CPU,)
        assert engine.load_count == 2  # rebuilt once, not per frame
    assert all(r.prediction.shape == (32, 32) for r in results)
    assert caplog.messages.count(f"{gpu_like} failed at run time (device lost); rebuilding the session on CPU") == 1


def test_once_reports_each_failed_file_on_one_line_and_exits_non_zero(tmp_path, tiny_model):
    import subprocess
    import sys

    frames = tmp_path / "frames"
    frames.mkdir()
    for name in ("a.jpg", "b.jpg"):
        cv2.imwrite(str(frames / name), quadrant_frame())
    (frames / "broken.jpg").write_bytes(b"not an image at all")
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "once", str(frames), "--model", str(tiny_model), "--profile", "midas-v21-small"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"depthwatch: {frames / 'broken.jpg'}: not a JPEG, PNG, TIFF, WebP, EXR or DPX image"
    assert sorted(p.name for p in frames.glob("*_depth.jpg")) == ["a_depth.jpg", "b_depth.jpg"]


def test_workers_yield_to_the_inference_thread(tmp_path, tiny_model):
    """Both workers the same steps behind the inference thread, also the one a worker starts.

    A frame alone has its map's JPEG encoded in two strips, the lower one handed
    to the pool by the first worker: the pool starts the second worker from the
    first, whose niceness it starts with (counted from there, it would end at base + 14).
    """
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread nice is a Linux feature")
    source = tmp_path / "frame.png"
    cv2.imwrite(str(source), cv2.resize(quadrant_frame(), (640, 360)))
    with Engine(spec_for(tiny_model)) as engine:
        earlier = set(threading.enumerate())  # another test's pool in this process is not this one's
        pipeline = Pipeline(engine, workers=2, niceness=7)
        try:
            assert pipeline.process(Job(source, tmp_path / "depth.jpg"), Settings()).ok
            base = os.getpriority(os.PRIO_PROCESS, engine.thread.native_id)
            workers = [t for t in threading.enumerate() if t.name.startswith("depthwatch-worker") and t not in earlier]
            assert len(workers) == 2  # the second started by the first, for the map's lower strip
            assert [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in workers] == [min(19, base + 7)] * 2
        finally:
            pipeline.close()


def test_a_newer_job_for_the_same_output_abandons_the_older_one(tmp_path, tiny_model):
    """Both submitted while the model loads: the older stops at its first step, the newer lands."""
    release = threading.Event()

    def slow_loading(*args, **kwargs):
        assert release.wait(30)
        return onnxruntime.InferenceSession(*args, **kwargs)

    old, new = tmp_path / "old.png", tmp_path / "new.png"
    cv2.imwrite(str(old), quadrant_frame(bright="top-left"))
    cv2.imwrite(str(new), quadrant_frame(bright="bottom-right"))
    output = tmp_path / "depth.png"
    with Engine(spec_for(tiny_model), session_factory=slow_loading) as engine:
        pipeline = Pipeline(engine)
        first = pipeline.submit(Job(old, output), Settings())
        second = pipeline.submit(Job(new, output), Settings())
        release.set()
        older, newer = first.result(30), second.result(30)
        pipeline.close()
    assert older.superseded and not newer.error
    depth = cv2.imread(str(output), cv2.IMREAD_UNCHANGED)
    assert depth[60:, 100:].mean() > depth[:40, :60].mean()  # the newer frame's map



def test_one_version_handed_over_twice_is_mapped_once_but_new_bytes_always_run(tmp_path, tiny_model):
    """The same bytes again end `unchanged`; same size, mtime and inode with other bytes run again."""
    source, output = tmp_path / "frame.tif", tmp_path / "depth.png"
    uncompressed = [cv2.IMWRITE_TIFF_COMPRESSION, 1]  # same dimensions: same size in bytes
    cv2.imwrite(str(source), quadrant_frame(bright="top-left"), uncompressed)
    calls = 0

    def counting(*args, **kwargs):
        session = onnxruntime.InferenceSession(*args, **kwargs)
        run = session.run

        def counted(*a, **k):
            nonlocal calls
            calls += 1
            return run(*a, **k)

        session.run = counted
        return session

    with Engine(spec_for(tiny_model), session_factory=counting) as engine:
        pipeline = Pipeline(engine)
        first = pipeline.process(Job(source, output), Settings())
        assert first.ok and not first.unchanged, first.error
        made, ran = output.stat(), calls  # the engine's warm-up run included
        again = pipeline.process(Job(source, output), Settings())
        assert again.ok and again.unchanged
        assert (calls, output.stat().st_ino, output.stat().st_mtime_ns) == (ran, made.st_ino, made.st_mtime_ns)

        # A rewrite within one clock tick: the signature cannot tell it, the bytes do.
        st = source.stat()
        ok, other = cv2.imencode(".tif", quadrant_frame(bright="bottom-right"), uncompressed)
        assert ok and len(other) == st.st_size
        with open(source, "r+b") as f:
            f.write(other.tobytes())
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (source.stat().st_size, source.stat().st_mtime_ns, source.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
        rewritten = pipeline.process(Job(source, output), Settings())
        assert rewritten.ok and not rewritten.unchanged and calls == ran + 1
        depth = cv2.imread(str(output), cv2.IMREAD_UNCHANGED)
        assert depth[60:, 100:].mean() > depth[:40, :60].mean()  # the new bytes' map

        # Other settings make another map of the same bytes.
        inverted = Settings(render=RenderOptions(levels=Levels(invert=True)))
        assert not pipeline.process(Job(source, output), inverted).unchanged and calls == ran + 2
        pipeline.close()

class _ObservedSession:
    """A real session whose run() says when the inference thread has entered it."""

    def __init__(self, session: onnxruntime.InferenceSession, entered: threading.Event) -> None:
        self._session, self._entered = session, entered

    def run(self, *args, **kwargs):
        self._entered.set()
        return self._session.run(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._session, name)


def test_a_running_inference_is_stopped_when_its_frame_is_superseded(tmp_path):
    from onnx_models import slow_model

    # Half a second a run on a quiet machine, more on a loaded one: the abort lands while it runs.
    model = slow_model(tmp_path / "slow.onnx", seconds=0.5, size=192)
    entered = threading.Event()

    def observed(*args, **kwargs):
        return _ObservedSession(onnxruntime.InferenceSession(*args, **kwargs), entered)

    with Engine(spec_for(model), session_factory=observed) as engine:
        info = engine.wait_ready()
        entered.clear()  # the load's own warm-up run, if any, is not the one to stop
        tensor = np.zeros((1, 3, 192, 192), np.float32)
        running = engine.infer(tensor, info.generation)
        assert entered.wait(60), "the inference thread never ran the model"
        assert engine.busy and not running.done()  # inside session.run for this very future
        queued = engine.infer(tensor, info.generation)
        engine.abort(queued)  # not started: cancelled
        engine.abort(running)  # started: stopped between operators
        with pytest.raises(Superseded, match="a newer version arrived during inference"):
            running.result(60)
        assert queued.cancelled()
        assert engine.run_count == 0  # the run was cut short, not finished
        # The session is fine afterwards.
        assert engine.infer(tensor, info.generation).result(120).prediction.shape == (192, 192)
        assert engine.run_count == 1


def test_a_reload_withdrawn_while_it_loads_never_swaps_in(tmp_path):
    """The config named model B, then went back to A (or on to C) while B loaded: B must not serve.

    Withdrawn while it loads, B's load ends (a load is never cut short, and never two at a time)
    and its session is let go, A staying in service; withdrawn while queued, it never loads;
    withdrawn after its swap, the caller is told so (False) and must ask for its model again.
    """
    model_a, model_b, model_c = (brightness_model(tmp_path / f"{n}.onnx") for n in "abc")
    loading_b, release_b = threading.Event(), threading.Event()
    loads: list[str] = []

    def gated(path, sess_options=None, providers=None):
        loads.append(Path(path).name)
        if Path(path) == model_b:
            loading_b.set()
            assert release_b.wait(30)
        return onnxruntime.InferenceSession(path, sess_options=sess_options, providers=providers)

    tensor = np.zeros((1, 3, 32, 32), np.float32)
    with Engine(spec_for(model_a), session_factory=gated) as engine:
        engine.wait_ready()
        b = engine.reload(spec_for(model_b))
        assert loading_b.wait(30)
        c = engine.reload(spec_for(model_c))  # queued behind B's load
        assert engine.withdraw(c) and c.cancelled()  # queued: dropped, never loaded
        assert engine.withdraw(b)  # loading: let go once loaded
        release_b.set()
        with pytest.raises(Superseded, match="the config no longer names this model"):
            b.result(30)
        assert engine.info.spec.path == model_a
        assert engine.infer(tensor, engine.info.generation).result(30).model.spec.path == model_a
        swapped = engine.reload(spec_for(model_c))
        assert swapped.result(30).spec.path == model_c
        assert not engine.withdraw(swapped)  # too late: C is in service
        assert engine.info.spec.path == model_c
    assert loads.count("c.onnx") >= 1 and "b.onnx" in loads


def test_a_frame_gone_or_dropped_by_a_stop_is_not_said_to_have_a_newer_version(tmp_path, tiny_model):
    """Superseded means a newer version replaced it; a frame deleted before it was read, or dropped by a
    stop out of time, had none: each says what did happen (the daemon logs the first by name, and counts
    neither with the frames replaced)."""
    release = threading.Event()

    def gated(path, sess_options=None, providers=None):
        session = onnxruntime.InferenceSession(path, sess_options=sess_options, providers=providers)

        class Gated:
            def __getattr__(self, name):
                return getattr(session, name)

            def run(self, names, feed, options=None):
                if feed[session.get_inputs()[0].name].any():  # a frame, not the warm-up
                    assert release.wait(30)
                return session.run(names, feed, options)

        return Gated()

    frames = []
    for n in range(3):
        frames.append(tmp_path / f"f{n}.png")
        cv2.imwrite(str(frames[-1]), quadrant_frame())
    engine = Engine(spec_for(tiny_model), session_factory=gated).start()
    try:
        pipeline = Pipeline(engine, workers=1)
        gone = pipeline.submit(Job(tmp_path / "deleted.png", tmp_path / "deleted_depth.png"), Settings()).result(30)
        assert gone.superseded and gone.gone == "vanished" and gone.error == "the file vanished before it could be read"
        held = [pipeline.submit(Job(f, f.with_name(f.stem + "_depth.png")), Settings()) for f in frames]
        wait_for(lambda: engine.busy, what="the first frame in the model")
        engine.stop(timeout=0.5, interrupt=True)  # the stop, out of time: the queued frame dropped, the run stopped
        release.set()
        results = [f.result(30) for f in held]
        pipeline.close(30)
    finally:
        release.set()
        engine.stop()
    dropped = [r for r in results if not r.ok]
    assert dropped and all(r.superseded and r.gone == "stopped" and "the daemon stopped" in r.error for r in dropped), [
        (r.error, r.gone) for r in results
    ]


def test_a_frame_that_straddles_a_model_swap_is_rendered_with_the_model_that_ran_it(tmp_path):
    """Inferred by model A (inverse depth), rendered after B (depth: larger = farther) took over.

    Its map must follow A's convention (bright quadrant near, white) and carry A's
    name; rendering it with B's profile would invert it silently.
    """
    from depthwatch.model.profiles import DEPTH

    model_a = brightness_model(tmp_path / "a.onnx")
    model_b = brightness_model(tmp_path / "b.onnx")
    spec_a = spec_for(model_a)
    spec_b = ModelSpec(path=model_b, profile=spec_a.profile.with_overrides(predicts=DEPTH), providers=("cpu",))
    gate, worker_free = threading.Event(), threading.Event()

    def gated(path, sess_options=None, providers=None):
        session = onnxruntime.InferenceSession(path, sess_options=sess_options, providers=providers)
        if Path(path) != model_a:
            return session

        class Gated:  # A's frames wait at the gate (its warm-up, before the gate is used, does not)
            def __getattr__(self, name):
                return getattr(session, name)

            def run(self, names, feed, options=None):
                if feed[session.get_inputs()[0].name].any():
                    assert gate.wait(30)
                return session.run(names, feed, options)

        return Gated()

    source = tmp_path / "frame.png"
    cv2.imwrite(str(source), quadrant_frame(64, 64, bright="bottom-right"))
    with Engine(spec_a, session_factory=gated) as engine:
        pipeline = Pipeline(engine, workers=1)
        future = pipeline.submit(Job(source, tmp_path / "depth.png"), Settings())
        deadline = threading.Event()
        while not engine.busy:  # A is running the frame, held at the gate
            assert not deadline.wait(0.01) and not future.done()
        # Keep the only worker busy so the frame's render cannot start before the swap is done.
        pipeline._pool.submit(worker_free.wait, 30)
        swap = engine.reload(spec_b)
        gate.set()
        assert swap.result(30).spec.path == model_b  # B is in service now
        worker_free.set()
        result = future.result(30)
        pipeline.close()
    assert result.ok, result.error
    assert result.model == "a.onnx"
    depth = cv2.imread(str(tmp_path / "depth.png"), cv2.IMREAD_UNCHANGED)
    assert depth[40:, 40:].mean() > 0.9 * 65535  # the bright quadrant is near: white, as A says
    assert depth[:24, :24].mean() < 0.1 * 65535


def test_a_live_inference_stops_a_running_clip_inference_which_runs_again_after(tmp_path):
    """Live frames first: a BACKGROUND run (a clip's frame) makes way for a LIVE one and is not lost."""
    from onnx_models import slow_model

    from depthwatch.model.engine import BACKGROUND

    model = slow_model(tmp_path / "slow.onnx", seconds=0.2)
    with Engine(spec_for(model)) as engine:
        info = engine.wait_ready()
        tensor = np.zeros((1, 3, 64, 64), np.float32)
        background = [engine.infer(tensor, info.generation, priority=BACKGROUND) for _ in range(3)]
        pause = threading.Event()
        while not engine.busy:
            pause.wait(0.001)
        runs = engine.run_count
        live = engine.infer(tensor, info.generation)
        live.result(60)
        # The live one ran next: the clip frame that was running was stopped, none finished first.
        assert engine.run_count == runs + 1
        assert not any(f.done() for f in background)
        # And every clip frame still gets its prediction, in its order.
        assert all(f.result(60).prediction.shape == (64, 64) for f in background)
        assert engine.run_count == runs + 4
