"""Whether a process is alive, asked of the kernel: the one answer for every layer.

The atomic writer's sweep asks it of a temporary file's maker (only a dead
writer's leftovers are removed), and the status file's readers of the daemon
that wrote it (`depthwatch status`, the second daemon's warning at start).

A pid outlives its process: after a crash or a reboot it is handed to another
program. So a daemon writes its own `start_token` into its status file, and
the readers ask whether the process with that pid has that very start: the
kernel's record of when it started (Linux: clock ticks after boot, which no
clock step moves; elsewhere psutil's start time, which the kernel keeps as it
was), never a comparison with a wall-clock time taken by another process.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time


def start_token(pid: int) -> str | None:
    """What tells this process from a later one given the same pid (None: it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # the name may hold spaces and parentheses
        return f"ticks:{int(fields[19])}"  # field 22, starttime: clock ticks after boot
    except (OSError, IndexError, ValueError):
        pass
    import psutil  # macOS (no /proc): imported only there, and only when asked

    try:
        return f"time:{psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return None


def pid_alive(pid: object, token: str | None = None) -> bool:
    """Whether a process with this pid exists, and, given its `start_token`, is that very process.

    Another user's counts: it is alive, only not ours to signal. Anything that
    is no positive int (a status file's JSON may say anything) is no process.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:  # JSON's true is no pid
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    except OSError:
        return False
    if token is None:
        return True
    now = start_token(pid)
    return now is None or now == token  # another start: the pid was handed to another program


def start_number(pid: int) -> int | None:
    """`start_token` as a number, for a file name: clock ticks after boot (Linux), milliseconds (macOS)."""
    token = start_token(pid)
    if token is None:
        return None
    kind, _, value = token.partition(":")
    return int(value) if kind == "ticks" else int(float(value) * 1000)


@functools.cache
def _own_start() -> int | None:
    return start_number(os.getpid())


def own_tag() -> str:
    """This process as a temporary file's name says it: `PID`, `tSTART` where it can be read, and `hHOST`.

    A pid alone outlives its process: a daemon restarted in a container is pid
    1 each time, so every leftover of the run before would look like its own,
    live writer's, and never be swept. And a pid means something only on the
    machine (and in the container) that gave it: `HOST` says which.
    """
    started = _own_start()
    return (f"{os.getpid()}t{started}" if started is not None else str(os.getpid())) + f"h{own_host()}"


@functools.cache
def own_host() -> str:
    """Six hex digits for this machine (or container): where a temporary file's pid can be asked.

    Two containers sharing a volume, or two hosts sharing a folder over NFS,
    each have a pid 1 (and pids of their own): asked of this machine's
    processes, a writer there would look dead, and its file in flight be removed.
    The host name tells them apart: Docker, Podman and Kubernetes give each
    container its own, kept across its restarts (a pid namespace's number is
    not: a restarted container would take its own leftovers for another's, and
    keep them an hour). Containers sharing the host's name (host networking) are
    asked as this machine's processes are: by pid and start.
    """
    return hashlib.blake2b(os.uname().nodename.encode(), digest_size=3).hexdigest()


#: How long a temporary file written on another machine (or in another container) must lie untouched before it
#: counts as left behind: its writer cannot be asked from here, and a writer at work touches it every frame.
FOREIGN_IDLE_S = 3600


def writer_alive(pid: int, started: int | None) -> bool:
    """Whether the process a temporary file's name names (`own_tag`) is still there: that pid, started then."""
    if not pid_alive(pid):
        return False
    if started is None:  # an older name, or a system that could not say: the pid alone
        return True
    now = _own_start() if pid == os.getpid() else start_number(pid)
    return now is None or now == started


def left_behind(pid: int | None, started: int | None, host: str | None, modified_ns: int) -> bool:
    """Whether a temporary file whose name carries these parts of an `own_tag` was left by a writer that is gone.

    Written here (or named before names said where): its writer is asked.
    Written elsewhere: only when untouched for `FOREIGN_IDLE_S`. No pid: an
    older name that never said, left behind.
    """
    if host is not None and host != own_host():
        return time.time_ns() - modified_ns > FOREIGN_IDLE_S * 1_000_000_000
    return pid is None or not writer_alive(pid, started)
