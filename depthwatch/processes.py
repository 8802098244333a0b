"""Whether a process is alive, asked of the kernel: the one answer for every layer.

The atomic writer's sweep asks it of a temporary file's maker (only a dead
writer's leftovers are removed), and the status file's readers of the daemon
that wrote it (`depthwatch status`, the second daemon's warning at start).

A pid outlives its process: after a crash or a reboot it is handed to another
program. So the one who asks says since when the process it means was there
(`since`: the status's start, the temporary file's last write), and a process
that started after that is not it.
"""

from __future__ import annotations

import os

import psutil

#: Clocks differ by this much at most between a process's start as the kernel keeps it and a
#: time the process itself took (the kernel's boot time is kept to the second).
_SLACK_S = 2.0


def pid_alive(pid: object, since: float | None = None) -> bool:
    """Whether the process with this pid that was there at `since` (epoch seconds) still is.

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
    if since is None:
        return True
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # not ours to look at: alive, as far as can be told
    return started <= since + _SLACK_S  # one that started later took the pid over
