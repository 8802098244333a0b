"""int8: a static quantization of the model, made once per model and machine, kept beside the compiled models.

On a CPU without bf16 (AVX2 alone, most laptops and many cloud machines) the
one precision left to gain speed is int8: a MiDaS-sized model runs 1.6x
faster quantized on one thread, where OpenVINO's fp32 is no faster than
onnxruntime's. Whether a model stays faithful in int8 depends on the model, so
`precision: auto` measures the quantized model beside fp32 and keeps it only
if its maps pass the same check as bf16 (see `precision`).

The quantization is onnxruntime's own post-training static quantization
(`onnxruntime.quantization.quantize_static`): the QDQ format, activations
uint8 and weights int8 per channel with all 8 bits, MinMax ranges calibrated
on the built-in probe images; in a graph of ENDS_FROM convolutions or more the
first (it reads the frame's pixels) and the last (it writes the map) stay in
fp32. Measured on the one trained network here, the shared FastDepth made fp32
again (`python -m benchmarks.realint8`; the AVX2 rows under QEMU's Haswell
CPU, whose kernels are AVX2's): whole int8 kept r 0.9954 with VNNI and 0.9904
on AVX2 alone, where u8s8 products saturate; with 7-bit weights (onnxruntime's
`reduce_range`, its advice there) 0.9693,
refused; with both ends in fp32, 8-bit weights: 0.9976 with VNNI, 0.9975 on
AVX2, and no slower (the ends, 3 channels in and 1 out, gain nothing in
int8). So one file for every x86 CPU, faithful on both. It runs in this
process on the inference thread, like every other session; it needs the
`onnx` package, which it imports only here.

The quantized file lives under the cache folder's `int8/`, one folder per
(model contents, onnxruntime version, quantization settings), pruned as
CoreML's compiled models are (see `caches`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from depthwatch import processes
from depthwatch.errors import ModelError
from depthwatch.model import caches, graph_ops, providers
from depthwatch.model.choosing.precision import can_quantize
from depthwatch.model.sessions import ort

log = logging.getLogger("depthwatch.model.engine")

#: The quantized model's file name inside its cache folder.
FILE = "model.int8.onnx"
#: Probe images the activation ranges are calibrated on, at most (a slow model gets fewer).
CALIBRATION_IMAGES = 8
#: Seconds of calibration runs aimed at: a model slower than this per run gets fewer images.
CALIBRATION_S = 2.0
#: A graph with at least this many convolutions keeps its first and last in fp32 (see above); a
#: shallower one is quantized whole, or little of it would be int8.
ENDS_FROM = 4


def calibration_count(run_seconds: float | None) -> int:
    """How many probe images to calibrate on, for a model that takes `run_seconds` a run."""
    if not run_seconds or run_seconds <= 0:
        return CALIBRATION_IMAGES
    return max(2, min(CALIBRATION_IMAGES, int(CALIBRATION_S / run_seconds)))


def _settings() -> dict[str, Any]:
    """What the quantized file is made with: part of its cache key, so new settings make a new file."""
    return {
        "format": "QDQ",
        "activations": "uint8",
        "weights": "int8 per channel, 8 bits",
        "fp32": f"the first and last convolution, from {ENDS_FROM}",
        "calibration": "probe images",
        # Raised with each change to how the file is made, so a file made otherwise is made again. 3: the
        # tools' preparation runs (without sympy), 8-bit weights on every CPU, the ends in fp32 (`ENDS_FROM`).
        "scheme": 3,
    }


def _target(model: Path, cache_root: Path, state_dir: Path) -> Path:
    try:
        digest = caches.model_digest(model, state_dir)
        entry = caches.open_entry(cache_root, model, digest, providers.runtime_version(), _settings())
    except OSError as exc:
        raise ModelError(f"cannot use the int8 cache in {cache_root}: {exc.strerror or exc}") from None
    return entry.path / FILE


def cached(model: Path, cache_root: Path, state_dir: Path) -> Path | None:
    """The int8 model of `model` made earlier with today's settings, as it was written; or None.

    A file that is not the one written (a disk error, a copy or a sync cut
    short, a hand's edit) is removed, with one line: served, a damaged file
    that still parses gives maps correlating 0.45 with the good ones, said
    "ok", and one that does not sends the engine to the CPU at fp32 for good,
    said "did not take the model". Its size and sha256 are kept beside
    it when it is written (`_DIGEST`); a file from before that is trusted once
    and its digest kept from then on.
    """
    if not can_quantize():
        raise ModelError("int8 needs the onnx package (pip install onnx)")
    target = _target(model, cache_root, state_dir)
    if not target.is_file():
        return None
    try:
        st = os.stat(target)
    except OSError:
        return None
    seen = (st.st_size, st.st_mtime_ns, st.st_ino)
    if _VERIFIED.get(str(target)) == seen:  # checked already by this process, unchanged since: not hashed again
        return target
    with _entry_locked(target.parent):  # never between another's rename of the file and the write of its digest
        why = _damaged(target)
        if why is None:
            _VERIFIED[str(target)] = seen
            return target
        log.warning("int8: %s in the cache is damaged (%s); removed, made again", target, why)
        for path in (target, target.with_name(_DIGEST)):
            with contextlib.suppress(OSError):
                path.unlink()
    return None


#: The int8 files this process found as written: (size, mtime_ns, inode) when checked.
_VERIFIED: dict[str, tuple[int, int, int]] = {}


@contextlib.contextmanager
def _entry_locked(folder: Path) -> Iterator[None]:
    """The cache entry's folder locked (flock on it): a file and its digest are replaced, and read, as one."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield  # cannot lock: goes on unlocked
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


#: Beside the int8 file: its size and sha256 when it was written.
_DIGEST = FILE + ".json"


def _file_digest(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return {"size": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def _damaged(target: Path) -> str | None:
    """Why the int8 file at `target` is not the one written, or None."""
    kept = caches.read_json(target.with_name(_DIGEST))
    try:
        if not kept:  # from before digests were kept, or its digest lost: trusted, and kept from now on
            caches.write_json(target.with_name(_DIGEST), _file_digest(target))
            return None
        size = os.stat(target).st_size
        if size != kept.get("size"):
            return f"{size} bytes where {kept.get('size')} were written"
        if _file_digest(target) != kept:
            return "its sha256 is not the one written"
    except OSError as exc:
        return f"it cannot be read: {exc.strerror or exc}"
    return None


def int8_model(
    model: Path, cache_root: Path, state_dir: Path, input_name: str, tensors: list[np.ndarray], check: Callable[[], None] | None = None
) -> Path:
    """The int8 model of `model`: from the cache, or quantized now on `tensors` (its input, one frame each).

    Raises ModelError with one line when it cannot be made (a graph that is
    already quantized, a graph the tools cannot read); the caller drops the
    int8 variant and serves fp32. `check()` is called between the steps of a
    quantization and before each calibration image: what it raises (a stop,
    a frame waiting) ends the quantization, temporaries removed, and goes up
    as it is.
    """
    target = cached(model, cache_root, state_dir) or _target(model, cache_root, state_dir)
    if target.is_file():
        return target
    if already_quantized(model):
        raise ModelError("the model is quantized already")
    _sweep(target.parent)
    log.info("quantizing %s to int8 on %d probe images (once; kept in %s)", model.name, len(tensors), target.parent)
    _quantize(model, target, input_name, tensors, check=check)
    return target


#: A quantization's temporary files: `.int8-<processes.own_tag>-<random>...dwtmp` (an older depthwatch's: `.int8-<random>...`).
_TEMPORARY = re.compile(r"\.int8-(?:(\d+)(?:t(\d+))?(?:h([0-9a-f]{6}))?-)?[^.]+\..*\.dwtmp")


def _sweep(folder: Path) -> None:
    """Remove the temporaries of quantizations whose process is gone (killed, or stopped mid-way).

    Each is as large as the model: a few interrupted starts (a logout, a lid
    closed) would fill the cache with hidden copies nothing removes.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None:
            continue
        pid, started, host = match.groups()
        with contextlib.suppress(OSError):
            modified = os.stat(folder / name, follow_symlinks=False).st_mtime_ns
            if not processes.left_behind(int(pid) if pid else None, int(started) if started else None, host, modified):
                continue
            os.unlink(folder / name)
            log.info("int8: removed %s, left by a quantization that did not finish", name)


def already_quantized(model: Path) -> bool:
    """Whether `model` comes quantized (FastDepth int8, say): see `graph_ops`."""
    try:
        return graph_ops.quantized(model)
    except (OSError, ValueError, EOFError) as exc:
        raise ModelError(f"cannot read the graph of {model.name}: {exc}") from None


class _QuantizerChatter(logging.Filter):
    """onnxruntime's quantizer logs its advice through the root logger: not lines for a daemon's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "/onnxruntime/quantization/" not in record.pathname.replace("\\", "/")


def _quantize(
    model: Path, target: Path, input_name: str, tensors: list[np.ndarray], *, reduce_range: bool = False, ends_in_fp32: bool = True,
    check: Callable[[], None] | None = None,
) -> None:
    """`model` quantized into `target`; the keywords are depthwatch's choice, other values for benchmarks.realint8.

    `check` (see `int8_model`): a whole quantization takes 12 s of a 41 MB model,
    past the shutdown's timeout, and leaves model-sized temporaries if killed,
    so a stop (and, in idle time, a frame) ends it between its steps.
    """
    ort.runtime()  # its calibration's sessions log to stderr as onnxruntime's default logger says
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ended: list[BaseException] = []  # what `check` raised: it goes up as it is, not as a failed quantization

    def look() -> None:
        if check is not None:
            try:
                check()
            except BaseException as exc:
                ended.append(exc)
                raise

    class Probes(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds = iter([{input_name: t} for t in tensors])

        def get_next(self) -> dict[str, Any] | None:
            look()
            return next(self._feeds, None)

    # Written under temporary names in the entry's folder, then renamed: another
    # depthwatch reading the cache never takes half a model.
    temporaries = []
    for suffix in (".pre.onnx.dwtmp", ".onnx.dwtmp"):
        fd, name = tempfile.mkstemp(prefix=f".int8-{processes.own_tag()}-", suffix=suffix, dir=target.parent)
        os.close(fd)
        temporaries.append(name)
    prepared, temporary = temporaries
    chatter = _QuantizerChatter()
    logging.getLogger().addFilter(chatter)
    try:
        # The tools' own preparation (graph fusions, ONNX shape inference), which the quantizer
        # advises; a graph it cannot prepare is quantized as it is. Without it a Pad before a
        # Conv, say, stays a node of its own between quantize and dequantize pairs: the real
        # FastDepth network in fp32 runs 1.2-1.35x slower in int8 unprepared (benchmarks.realint8).
        # The symbolic shape inference is left out: it needs sympy (tens of MB, not a dependency
        # here), without which the whole preparation fails; it serves graphs with dynamic shapes
        # that ONNX's own inference cannot follow, and the quantizer does without it.
        source = str(model)
        try:
            quant_pre_process(str(model), prepared, skip_symbolic_shape=True)
            source = prepared
        except Exception as exc:  # the preparation is advice, not a need
            log.debug("int8: %s quantized without the preparation step (%s)", model.name, exc)
        look()
        source, kept = _ends(source, prepared) if ends_in_fp32 else (source, [])
        look()
        # Its calibration model goes to a temporary folder of its own, removed when it returns.
        quantize_static(
            source,
            temporary,
            Probes(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            nodes_to_exclude=kept,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        digest = _file_digest(Path(temporary))
        with _entry_locked(target.parent):
            os.replace(temporary, target)
            caches.write_json(target.with_name(_DIGEST), digest)  # without it, the file is trusted as it is (see `cached`)
    except ModelError:
        raise
    except Exception as exc:  # onnxruntime and onnx raise many types for graphs they cannot take
        if ended:
            raise ended[0] from None
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:200]
        raise ModelError(f"could not quantize {model.name} to int8: {text}") from None
    finally:
        logging.getLogger().removeFilter(chatter)
        for name in (*temporaries, _inferred(prepared)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


def _inferred(prepared: str) -> str:
    """The shape-inferred copy the tools' preparation writes beside `prepared` (`x.onnx.dwtmp` -> `x.onnx-inferred.dwtmp`)."""
    stem, dot, suffix = prepared.rpartition(".")
    return f"{stem}-inferred{dot}{suffix}"


def _ends(source: str, scratch: str) -> tuple[str, list[str]]:
    """The first and last convolution of `source` by name (none under ENDS_FROM), and the model that names them.

    The quantizer excludes nodes by name; a node without one is named here and
    the model saved to `scratch` (the preparation's temporary file) to quantize.
    """
    import onnx

    loaded = onnx.load(source)
    convs = [n for n in loaded.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    if len(convs) < ENDS_FROM:
        return source, []
    ends = [convs[0], convs[-1]]  # an ONNX graph lists its nodes in topological order
    if not all(n.name for n in ends):
        taken = {n.name for n in loaded.graph.node}
        for i, node in enumerate(ends):
            if not node.name:
                name = f"depthwatch_fp32_end_{i}"
                while name in taken:
                    name += "_"
                node.name = name
                taken.add(name)
        onnx.save(loaded, scratch)
        source = scratch
    return source, [n.name for n in ends]
