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


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, capture_output=True, text=True, timeout=240, check=False,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


def test_the_layers_are_kept():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_an_arrow_back_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "depthwatch", tmp_path / "depthwatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    normalise = tmp_path / "depthwatch" / "imaging" / "normalise.py"
    normalise.write_text(normalise.read_text() + "\nfrom depthwatch.daemon import status  # noqa\n")

    done = _lint(tmp_path)

    assert done.returncode != 0
    assert "depthwatch.imaging is not allowed to import depthwatch.daemon" in done.stdout
