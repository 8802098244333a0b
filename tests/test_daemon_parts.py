"""The daemon is made of parts that do not reach back: no import cycle inside `depthwatch.daemon`, and
no part imports the lifecycle that builds them (`Daemon`), not even for a type.

Read off the import graph with grimp (what import-linter builds on), TYPE_CHECKING imports
included; and once on a copy with one import back, so the check is shown to be able to fail.
"""

from __future__ import annotations

from pathlib import Path

from test_layers import copy_of_the_package, run_script

REPO = Path(__file__).resolve().parents[1]

_CHECK = """
import sys
import grimp

graph = grimp.build_graph("depthwatch", exclude_type_checking_imports=False)
daemon = sorted(m for m in graph.modules if m.startswith("depthwatch.daemon."))
problems = []
for i, a in enumerate(daemon):
    for b in daemon[i + 1:]:
        if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a):
            problems.append(f"cycle: {a} <-> {b}")
for module in daemon:
    if module != "depthwatch.daemon.lifecycle" and graph.direct_import_exists(importer=module, imported="depthwatch.daemon.lifecycle"):
        problems.append(f"{module} imports depthwatch.daemon.lifecycle")
print("\\n".join(problems))
sys.exit(1 if problems else 0)
"""


def test_no_part_of_the_daemon_reaches_back():
    done = run_script(REPO, _CHECK)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_a_part_that_reaches_back_is_caught(tmp_path):
    accounting = copy_of_the_package(tmp_path) / "daemon" / "accounting.py"
    text = accounting.read_text().replace(
        "from __future__ import annotations\n",
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from depthwatch.daemon.lifecycle import Daemon  # noqa\n",
        1,
    )
    accounting.write_text(text)

    done = run_script(tmp_path, _CHECK)

    assert done.returncode != 0
    assert "depthwatch.daemon.accounting imports depthwatch.daemon.lifecycle" in done.stdout
    assert "cycle: depthwatch.daemon.accounting <-> depthwatch.daemon.lifecycle" in done.stdout
