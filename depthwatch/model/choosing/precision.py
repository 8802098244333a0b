"""`model.precision`: which arithmetic a runtime may use, and the check that keeps a map faithful.

Reduced precision (bf16 on CPUs with AVX-512 BF16 or AMX, fp16 on CoreML,
int8 on onnxruntime's CPU provider through a static quantization, see
`quantize`) roughly halves the time per frame on the runtimes that have it,
and on most depth models changes nothing an editor can see. Not on all: a graph that
takes small differences of large numbers loses them in bf16's 8-bit mantissa.
So `auto` tries the reduced precision only where the hardware runs it natively
and keeps it only if, on the probe images below, its maps correlate with the
fp32 maps at least FAITHFUL; otherwise fp32, said in the log and by
`depthwatch check`. An explicit precision is used as given.

The probe images are made here, deterministically, at the model's input size:
a room-like scene (a lit back wall, a floor in perspective with a fading
texture, a few shaded objects, smooth noise), so a model sees something like
a photograph rather than noise (on noise, an int8 model's maps differ between
runtimes by more than any precision does).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np

from depthwatch.model import providers
from depthwatch.model.contract import Contract, model_input_size
from depthwatch.model.profiles import Profile

AUTO, FP32, BF16, FP16, INT8 = "auto", "fp32", "bf16", "fp16", "int8"
CHOICES = (AUTO, FP32, BF16, FP16, INT8)
#: Lowest Pearson correlation, on every probe image, of a reduced-precision map with the fp32 map.
FAITHFUL = 0.995
#: Probe images per check.
PROBES = 3
#: What `auto` tries, as a version in the remembered choice's key (`choice.decision_key`): a choice
#: measured before a new variant, or before a variant was made another way, is measured again.
#: 2: OpenVINO runs the int8 file too; int8 keeps its ends in fp32 and 8-bit weights on every CPU.
TRIED = 2



def can_quantize() -> bool:
    """Whether this install can quantize a model to int8 (`quantize`: onnxruntime's tools need the `onnx` package)."""
    return importlib.util.find_spec("onnx") is not None

def candidates(provider: str, setting: str) -> tuple[list[str], str | None]:
    """The precisions to try on `provider` for this setting, fp32 first; and why a setting does not apply.

    OpenVINO: bf16 and fp16 where the CPU runs them natively, and int8 (auto),
    or as asked. CoreML: fp16 when asked (`auto` leaves CoreML's own choice,
    which `fp32` also keeps). onnxruntime's CPU and CUDA providers run the graph
    as it is, in fp32; the CPU provider also runs the model quantized to int8.
    int8 is the one quantized file (`quantize`), tried where the `onnx` package
    is there to quantize with: OpenVINO runs it with its own int8 kernels, about
    half its fp32 time on the trained FastDepth where onnxruntime's ran 0.9x
    (`python -m benchmarks.realint8`).
    """
    if setting == INT8 and provider not in (providers.CPU, providers.OPENVINO):
        return [FP32], f"int8 runs on onnxruntime's CPU provider and OpenVINO; {providers.short(provider)} runs fp32"
    if setting == INT8 and not can_quantize():
        return [FP32], "int8 needs the onnx package (pip install onnx)"
    quantized = [INT8] if can_quantize() else []
    if provider == providers.OPENVINO:
        if setting == AUTO:
            from depthwatch.model.sessions import openvino

            return [FP32, *openvino.reduced_precisions(), *quantized], None
        return [setting], None
    if provider == providers.COREML:
        if setting == FP16:
            return [FP16], None
        if setting == BF16:
            return [FP32], "CoreML has no bf16; it runs at its own precision"
        return [FP32], None
    if provider == providers.CPU and setting == INT8:
        return [INT8], None
    if provider == providers.CPU and setting == AUTO:
        return [FP32, *quantized], None
    if setting in (BF16, FP16):
        return [FP32], f"{providers.short(provider)} runs the graph in fp32; precision {setting} applies to OpenVINO and CoreML"
    return [FP32], None


def probe_images(size: tuple[int, int], count: int = PROBES) -> list[np.ndarray]:
    """`count` RGB uint8 images of (width, height) `size`, the same on every machine and every call."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    u, v = x / max(w - 1, 1), y / max(h - 1, 1)
    images = []
    for seed in range(count):
        rng = np.random.default_rng(1000 + seed)
        horizon = 0.35 + 0.2 * rng.random()
        wall = rng.uniform(0.35, 0.8, 3) * (0.75 + 0.25 * (1 - v[..., None]))
        # The floor: perspective stripes that fade with distance.
        depth = np.clip((v - horizon) / (1 - horizon), 1e-3, 1)
        stripes = 0.5 + 0.5 * np.sign(np.sin((u - 0.5) / depth * 12 + seed))
        floor = rng.uniform(0.25, 0.6, 3) * (0.6 + 0.4 * depth[..., None]) * (0.85 + 0.15 * stripes[..., None])
        image = np.where((v > horizon)[..., None], floor, wall)
        for _ in range(3 + seed):  # shaded objects standing on the floor
            cx, cy = rng.uniform(0.15, 0.85), rng.uniform(horizon + 0.1, 0.95)
            rx, ry = rng.uniform(0.06, 0.18), rng.uniform(0.1, 0.3)
            inside = ((u - cx) / rx) ** 2 + ((v - cy + ry) / ry) ** 2 < 1
            shade = 0.6 + 0.4 * np.clip(1 - (u - cx + rx / 2) / (2 * rx), 0, 1)
            image = np.where(inside[..., None], rng.uniform(0.2, 1.0, 3) * shade[..., None], image)
        noise = sum(
            np.sin(2 * np.pi * (f * u * np.cos(a) + f * v * np.sin(a)) + p)
            for f, a, p in zip(rng.uniform(2, 9, 4), rng.uniform(0, np.pi, 4), rng.uniform(0, 2 * np.pi, 4))
        )
        image = image * (1 + 0.04 * noise[..., None]) + rng.normal(0, 0.01, image.shape)
        images.append((np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8))
    return images


def probe_tensors(contract: Contract, profile: Profile, count: int = PROBES) -> list[np.ndarray]:
    """The probe images as this model's input tensors (as depthwatch prepares a frame)."""
    side = profile.input_size or 256
    w, h = model_input_size(contract, profile, (side, side))
    tensors = []
    for rgb in probe_images((w, h), count):
        if contract.input_dtype == np.uint8:
            x = rgb
        else:
            x = rgb.astype(np.float32) * np.float32(1 / 255)
            x = (x - np.asarray(profile.mean, np.float32)) / np.asarray(profile.std, np.float32)
            x = x.astype(contract.input_dtype, copy=False)
        if contract.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        tensors.append(np.ascontiguousarray(x[None]))
    return tensors


def agreement(reference: Sequence[np.ndarray], maps: Sequence[np.ndarray]) -> float:
    """The lowest Pearson correlation between each map and its reference (1.0 = the same up to scale)."""
    lowest = 1.0
    for a, b in zip(reference, maps):
        a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        if a64.shape != b64.shape or not np.all(np.isfinite(b64)):
            return 0.0
        sa, sb = a64.std(), b64.std()
        if sa == 0 or sb == 0:
            same = sa == sb and np.allclose(a64, b64)
            lowest = min(lowest, 1.0 if same else 0.0)
            continue
        lowest = min(lowest, float(np.mean((a64 - a64.mean()) * (b64 - b64.mean())) / (sa * sb)))
    return lowest
