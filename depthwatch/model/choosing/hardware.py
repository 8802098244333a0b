"""The machine's key: what makes one machine's measured figures its own.

Platform, architecture, CPU model and the ISA features that change which
engine and precision are fastest, core count, host name: a choice measured on
one machine is never read on another (a home folder shared across farm
nodes, the same instance type with other CPU flags).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

#: The ISA features that change which engine and precision are fastest (x86: AVX2 and
#: AVX-512, bf16, VNNI for int8, AMX; Arm: dot product, bf16, int8 matrix multiply, SVE).
FEATURES = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2",
)
#: The same abilities as macOS names them (sysctl hw.optional.*), mapped to the names above.
_MAC_FEATURES = {
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512f",
    "hw.optional.avx512bw": "avx512bw",
    "hw.optional.avx512vnni": "avx512_vnni",
}


def cpu_features(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The FEATURES this CPU has, sorted: from /proc/cpuinfo (or the text given), else macOS's sysctl."""
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = None
    if text is not None:
        flags: set[str] = set()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                flags.update(value.split())
                break  # every core lists the same
        return tuple(sorted(flags.intersection(FEATURES)))
    return tuple(sorted(name for key, name in _MAC_FEATURES.items() if _sysctl(key, integer=True) == "1"))


def _cpu_model(cpuinfo: str | None) -> str:
    for line in (cpuinfo or "").splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return _sysctl("machdep.cpu.brand_string") or ""


def _sysctl(name: str, integer: bool = False) -> str | None:
    """A macOS sysctl value as text (an integer one as its decimal), through libc (no `sysctl` process: the daemon never forks)."""
    if sys.platform != "darwin":
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        size = ctypes.c_size_t(0)
        if libc.sysctlbyname(name.encode(), None, ctypes.byref(size), None, 0) != 0 or not size.value:
            return None
        buf = ctypes.create_string_buffer(size.value)
        if libc.sysctlbyname(name.encode(), buf, ctypes.byref(size), None, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    raw = buf.raw[: size.value]
    if integer:
        return str(int.from_bytes(raw, sys.byteorder))
    return raw.rstrip(b"\0").decode(errors="replace")


def machine(cpuinfo: str | None = None) -> str:
    """What makes one machine's figures its own: platform, architecture, CPU model and the
    features that change the answer, core count, host name.

    A cache measured on a CPU with AVX-512 BF16 must not be read on one with
    AVX2 alone that has the same model name (the same cloud instance type, a
    home folder shared across farm nodes). Read without starting a process.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = None
    features = cpu_features(cpuinfo) if cpuinfo is not None else cpu_features()
    cpu = _cpu_model(cpuinfo)
    return (
        f"{platform.system()} {platform.machine()} {cpu or '-'} [{' '.join(features) or 'no listed features'}] "
        f"{os.cpu_count() or 0} cores {socket.gethostname()}"
    )
