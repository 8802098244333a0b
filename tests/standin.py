"""Recording stand-ins for launchctl, plutil, systemctl and journalctl.

launchd cannot run on Linux and these machines have no systemd user manager,
so the `service` verbs are checked against small executables of the same
names put first on PATH: each appends its argv to a log and answers with a
scripted reply (exit status, stdout, stderr). Nothing else in the tests is a
stand-in.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """\
#!{python}
import json, os, sys
state = {state!r}
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.path.join(state, "calls.jsonl"), "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
verb = next((a for a in args if not a.startswith("-")), "")
path = os.path.join(state, "replies.json")
replies = json.load(open(path)) if os.path.exists(path) else {{}}
queue = replies.get(name + " " + verb) or [{{}}]
reply = queue.pop(0) if len(queue) > 1 else queue[0]
json.dump(replies, open(path, "w"))
sys.stdout.write(reply.get("out", ""))
sys.stderr.write(reply.get("err", ""))
sys.exit(reply.get("rc", 0))
"""


@dataclass
class Standins:
    """The folder to put first on PATH, and what was called."""

    bin: Path
    state: Path

    def reply(self, command: str, *replies: dict[str, object]) -> None:
        """Script the answers to `command` ("launchctl print"): one per call, the last one repeating."""
        path = self.state / "replies.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[command] = list(replies)
        path.write_text(json.dumps(data))

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def clear(self) -> None:
        (self.state / "calls.jsonl").unlink(missing_ok=True)


def make_standins(root: Path, names: tuple[str, ...] = ("launchctl", "plutil", "systemctl", "journalctl")) -> Standins:
    bin_dir, state = root / "bin", root / "state"
    bin_dir.mkdir(parents=True)
    state.mkdir()
    for name in names:
        path = bin_dir / name
        path.write_text(SCRIPT.format(python=sys.executable, state=str(state)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return Standins(bin_dir, state)


def path_with(standins: Standins) -> str:
    return os.pathsep.join([str(standins.bin), os.environ.get("PATH", "")])
