"""The import contract: every arrow points down the layers pyproject.toml names.

It runs import-linter's own command on the package as installed here, and once
on a copy with one arrow back, so the contract is shown to be able to fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_on(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run on the copy of the package at `root`, that copy first on the path, nothing else of this environment."""
    return subprocess.run(
        argv, cwd=root, capture_output=True, text=True, timeout=240, check=False,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


def run_script(root: Path, script: str) -> subprocess.CompletedProcess[str]:
    """A Python script over the import graph, run on the copy of the package at `root` (see `run_on`)."""
    return run_on(root, [sys.executable, "-c", script])


def copy_of_the_package(tmp_path: Path) -> Path:
    """depthwatch and its pyproject.toml copied under `tmp_path`, for a check shown to fail on a change; the copy's package folder."""
    shutil.copytree(REPO / "depthwatch", tmp_path / "depthwatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "depthwatch"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    return run_on(root, [str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"])


def test_the_layers_are_kept():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_an_arrow_back_breaks_the_contract(tmp_path):
    package = copy_of_the_package(tmp_path)
    normalise = package / "imaging" / "normalise.py"
    normalise.write_text(normalise.read_text() + "\nfrom depthwatch.daemon import status  # noqa\n")

    done = _lint(tmp_path)

    assert done.returncode != 0
    assert "depthwatch.imaging is not allowed to import depthwatch.daemon" in done.stdout


_CYCLES = """
import sys
import grimp

graph = grimp.build_graph("depthwatch", exclude_type_checking_imports=False)
imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
# Tarjan's strongly connected components, iteratively: every component of more than one module is a cycle.
index, low, on, stack, cycles, counter = {}, {}, set(), [], [], [0]
for root in imports:
    if root in index:
        continue
    work = [(root, iter(imports[root]))]
    index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
    while work:
        node, edges = work[-1]
        for nxt in edges:
            if nxt not in index:
                index[nxt] = low[nxt] = counter[0]; counter[0] += 1; stack.append(nxt); on.add(nxt)
                work.append((nxt, iter(imports[nxt])))
                break
            if nxt in on:
                low[node] = min(low[node], index[nxt])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop(); on.discard(member); component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(" <-> ".join(sorted(component)))
print("\\n".join(cycles))
sys.exit(1 if cycles else 0)
"""


def test_no_import_cycle_among_the_modules():
    """No module reaches, through any chain of imports (type-only ones too), back to itself."""
    done = run_script(REPO, _CYCLES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_an_import_cycle_is_caught(tmp_path):
    package = copy_of_the_package(tmp_path)
    providers = package / "model" / "providers.py"
    providers.write_text(providers.read_text() + "\nfrom depthwatch.model import spec  # noqa\n")  # spec imports providers

    done = run_script(tmp_path, _CYCLES)

    assert done.returncode != 0
    assert "depthwatch.model.providers" in done.stdout and "depthwatch.model.spec" in done.stdout


_OUTSIDE = """
import sys
import tomllib
import grimp

layers = tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]["contracts"][0]["layers"]
roots = [name.strip() for layer in layers for part in layer.split("|") for name in part.split(":")]
graph = grimp.build_graph("depthwatch", exclude_type_checking_imports=False)
# The package's own __init__ may stay outside the layers only while it imports nothing of ours.
outside = sorted(
    m for m in graph.modules
    if not any(m == root or m.startswith(root + ".") for root in roots)
    and graph.find_modules_directly_imported_by(m)
)
print("\\n".join(outside))
sys.exit(1 if outside else 0)
"""


def test_every_module_is_in_a_layer():
    """A module the contract's layers do not name is checked by nothing: a new module beside `files` must be placed."""
    done = run_script(REPO, _OUTSIDE)
    assert done.returncode == 0, "outside every layer: " + done.stdout[-3000:] + done.stderr[-2000:]


def test_a_module_outside_the_layers_is_caught(tmp_path):
    package = copy_of_the_package(tmp_path)
    (package / "newcomer.py").write_text("from depthwatch.frames import job  # noqa\n")

    done = run_script(tmp_path, _OUTSIDE)

    assert done.returncode != 0
    assert "depthwatch.newcomer" in done.stdout


_CLIP_INTERFACE = """
import sys
import grimp

graph = grimp.build_graph("depthwatch", exclude_type_checking_imports=False)
# What callers may import of clips/: the package (its names) and the modules it hands on for a clip in ranges.
open_to_callers = {"depthwatch.clips", *(f"depthwatch.clips.{m}" for m in ("clipindex", "rangepass", "segments", "timeline"))}
reached = sorted(
    f"{caller} -> {module}"
    for module in graph.find_children("depthwatch.clips")
    if module not in open_to_callers
    for caller in graph.find_modules_that_directly_import(module)
    if not caller.startswith("depthwatch.clips")
)
print("\\n".join(reached))
sys.exit(1 if reached else 0)
"""


def test_the_daemon_once_and_the_farm_reach_clips_through_its_interface():
    """Outside clips/, nothing imports the way's own modules (the job, make, stream, placing, sequence)."""
    done = run_script(REPO, _CLIP_INTERFACE)
    assert done.returncode == 0, "past the clips interface: " + done.stdout[-3000:] + done.stderr[-2000:]


def test_a_caller_reaching_past_the_clips_interface_is_caught(tmp_path):
    package = copy_of_the_package(tmp_path)
    intake = package / "daemon" / "intake.py"
    intake.write_text(intake.read_text() + "\nfrom depthwatch.clips import stream  # noqa\n")

    done = run_script(tmp_path, _CLIP_INTERFACE)

    assert done.returncode != 0
    assert "depthwatch.daemon.intake -> depthwatch.clips.stream" in done.stdout
