"""Operating-system names for depthwatch's threads, so `top -H`, `ps -L` and a profiler tell them apart.

Python names its threads only for itself (before 3.14): the kernel shows every
one of them as `python`, and a busy daemon cannot say which thread spends the
CPU. A native thread takes its creator's name when it is made, so the
inference thread, named before it loads the model, also names the engine's own
pool (OpenVINO's and onnxruntime's operator threads); a worker named before its
first OpenCV call names OpenCV's pool with it. The benchmarks read these names
to split the daemon's CPU time between the model and the image work.

`yield_to_inference` is the other thing a helper thread does as it starts (a
frame worker, the clip thread): it names itself and steps back behind the
inference thread.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

#: The kernel keeps 15 bytes of a thread's name (Linux's TASK_COMM_LEN less the NUL).
MAX_LENGTH = 15


def os_name(name: str) -> str:
    """`depthwatch-worker_0` -> `dw-worker_0`: short enough for the kernel to keep whole."""
    if name.startswith("depthwatch-"):
        name = "dw-" + name[len("depthwatch-") :]
    return name.encode("ascii", "replace")[:MAX_LENGTH].decode("ascii")


def name_this_thread(name: str | None = None) -> None:
    """Give the calling thread `name` (default: its Python name) in the operating system; best effort."""
    text = os_name(name or threading.current_thread().name)
    try:
        if sys.platform.startswith("linux"):
            with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w", encoding="ascii") as f:
                f.write(text)
        elif sys.platform == "darwin":  # only a thread's own name can be set there
            ctypes.CDLL(None).pthread_setname_np(text.encode("ascii"))  # libSystem, already loaded
    except (OSError, AttributeError):
        pass  # a name is a convenience: never a reason for a thread not to start


def yield_to_inference(niceness: int) -> None:
    """Make this worker thread `niceness` steps nicer than the inference thread.

    On a CPU-only machine the image work and the model's operator threads share
    the cores; when both want one the model should win, and decoding and
    encoding should fill the gaps its parallel sections leave (measured: burst
    throughput 21 -> 25 frames/s on two cores at niceness 10; see docs/benchmarks.md).
    Linux applies nice to single threads; elsewhere this does nothing. The
    thread gets its name in the operating system too (see `threadnames`).

    The steps count from the process's own niceness (its first thread's, which
    the inference thread is started with), not from the thread that starts
    this one: a thread pool starts a worker from whichever thread hands it
    work, another worker included, and a thread starts with its creator's
    niceness, so counting from there would put the second worker at 19.
    """
    name_this_thread()
    if not sys.platform.startswith("linux") or niceness <= 0:
        return
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # on Linux: the first thread's alone
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + niceness))
    except OSError:
        pass
