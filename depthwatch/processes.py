"""Whether a process is alive, asked of the kernel: the one answer for every layer.

The atomic writer's sweep asks it of a temporary file's maker (only a dead
writer's leftovers are removed), and the status file's readers of the daemon
that wrote it (`depthwatch status`, the second daemon's warning at start).
"""

from __future__ import annotations

import os


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (another user's counts: it is alive, only not ours to signal).

    Anything that is no positive int (a status file's JSON may say anything) is no process.
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
        return True  # another user's process
    except OSError:
        return False
    return True
