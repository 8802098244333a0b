"""The README's two commands do what the README says: one sets up and runs the daemon, one runs the tests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

tomllib = pytest.importorskip("tomllib")


def _extras(requested: set[str], table: dict[str, list[str]]) -> set[str]:
    """The extras `requested` brings in, those it names through depthwatch[...] included (pip follows them)."""
    found: set[str] = set()
    todo = list(requested)
    while todo:
        extra = todo.pop()
        if extra in found:
            continue
        assert extra in table, f"no extra called {extra!r} in pyproject.toml"
        found.add(extra)
        for requirement in table[extra]:
            named = re.match(r"depthwatch\[([^\]]+)\]", requirement)
            if named:
                todo.extend(name.strip() for name in named.group(1).split(","))
    return found


def _installed_extras(command: str) -> set[str]:
    """The extras of `pip install -e '.[a,b]'` in a shell line (none for `-e .`)."""
    words = shlex.split(command.split("&&")[1])
    target = words[words.index("-e") + 1]
    named = re.fullmatch(r"\.\[([^\]]+)\]", target)
    return {name.strip() for name in named.group(1).split(",")} if named else set()


def _section(text: str, heading: str) -> str:
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_set_up_installs_what_the_readme_offers_and_says_so():
    """Clips and the HTTP API are in the README, so its set-up installs their extras (and says what each is for):
    with a bare `pip install -e .` each would be a refusal, then a second install."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    set_up = _section(readme, "Set up and run the daemon")
    command = next(line for line in set_up.splitlines() if "pip install" in line)
    installed = _extras(_installed_extras(command), table)
    assert {"video", "api", "plates", "timeline"} <= installed, command
    assert "farm" not in installed and "test" not in installed  # the daemon's set-up, not the suite's
    for extra in ("video", "api"):
        assert f"`{extra}`" in set_up, f"the quick start does not say what the {extra} extra is for"


def test_the_test_command_installs_what_ci_installs():
    """The README's test command and `.ci/run` install the same extras, then run the suite the same way."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = next(line for line in _section(readme, "Run the tests").splitlines() if "pip install" in line)
    ci = next(line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines() if "pip install" in line)
    assert _installed_extras(command) == _installed_extras(ci.replace("$compile ", ""))
    assert command.endswith("&& .venv/bin/python -m pytest") and ci.endswith("&& .venv/bin/python -m pytest")
