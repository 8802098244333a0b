"""Shared by test_launchd.py and test_systemd.py: a project to run as a service,
and starting the real daemon exactly the way its service definition says."""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from conftest import jpeg_bytes, quadrant_frame, write_by_rename
from daemon_process import wait_for
from onnx_models import brightness_model

from depthwatch.daemon.status import read_status
from depthwatch.model import catalogue

#: The repository's config.yaml: the documented default that `service install` writes for a new user.
DOCUMENTED_CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"


def make_project(root: Path, model: Path, **daemon: object) -> Path:
    """A folder with a config (relative paths, as people write them) and its watch folder; the config's path."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "frames").mkdir()
    config = {
        "model": {"path": str(model), "profile": "midas-v21-small", "providers": ["cpu"]},
        "watch": {"folders": ["frames"], "patterns": ["frame.jpg"]},
        "output": {"template": "depth.jpg"},
        "daemon": {"status_file": "status.json", **daemon},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def supervisor_env(home: Path, variables: Mapping[str, str]) -> dict[str, str]:
    """What launchd or systemd hands a user's service: a login's basics plus the definition's
    variables, and nothing inherited from this shell (no VIRTUAL_ENV, no PYTHONPATH)."""
    user = getpass.getuser()
    env = {"HOME": str(home), "USER": user, "LOGNAME": user, "SHELL": "/bin/sh", "TMPDIR": tempfile.gettempdir()}
    env.update(variables)
    return env


def start_like_supervisor(
    argv: Sequence[str], *, cwd: str | Path, env: Mapping[str, str], stdout: Path, stderr: Path
) -> subprocess.Popen[bytes]:
    """Start the program as launchd does: its own session, stdin closed, output appended to the log files."""
    stdout.parent.mkdir(parents=True, exist_ok=True)
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        return subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )


def wait_running(proc: subprocess.Popen[bytes], status_file: Path, log: Path) -> dict[str, object]:
    """Until the daemon's status file says it is watching (or fail with its log if it exited)."""

    def ready() -> dict[str, object] | None:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {proc.returncode} at start:\n{log.read_text()}")
        try:
            status = read_status(status_file)
        except (OSError, ValueError):
            return None
        return status if status.get("state") == "running" else None

    return wait_for(ready, what="the daemon to report running")


def process_one_frame(proc: subprocess.Popen[bytes], frames: Path, log: Path) -> Path:
    """Drop a frame the way a plugin does and wait for its depth map."""
    write_by_rename(frames / "frame.jpg", jpeg_bytes(quadrant_frame()))
    output = frames / "depth.jpg"

    def written() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {proc.returncode}:\n{log.read_text()}")
        return output.exists()

    wait_for(written, what="the depth map")
    return output


def stop_with_sigterm(proc: subprocess.Popen[bytes], stop_timeout_s: int) -> tuple[int, float]:
    """SIGTERM, as the supervisor sends it; the exit status and how long it took."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=stop_timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {stop_timeout_s} s after SIGTERM; the supervisor would SIGKILL it") from None
    return code, time.monotonic() - started


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the daemon did not exit within {timeout:.0f} s") from None


def kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def folder_snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in a folder with its bytes and mtime: to show a folder is left as it was found."""
    if not folder.exists():
        return {}
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def new_user(home: Path, monkeypatch: pytest.MonkeyPatch, fetched: bool = False) -> Path:
    """A user with no config yet (and, if `fetched`, the default config's model in place): where their config will be.

    The model is a stand-in shaped like MiDaS v2.1 small (float NCHW 256x256 in,
    [1, 256, 256] out), so depthwatch recognises it as that model by its graph.
    """
    for name in ("DEPTHWATCH_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    if fetched:
        path = home / ".local/share/depthwatch/models" / catalogue.entry("midas-v21-small").file
        path.parent.mkdir(parents=True)
        brightness_model(path, size=(256, 256))
    return home / ".config/depthwatch/config.yaml"


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes), link (its target) and folder (None) under `folder`: to show an attempt left nothing behind."""
    found: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = b"-> " + os.fsencode(os.readlink(path))
        else:
            found[name] = None if path.is_dir() else path.read_bytes()
    return found
