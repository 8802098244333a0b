"""The docs keep their shape: layout.md names every module, and pages stay short and free of the work's diary.

Each check is a function over files, run once on the repository and once on a
copy with a fault put in, so every check is shown to be able to fail.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "depthwatch"

MAX_LINES = 400
MAX_CHARS = 400

#: How the work was organised, which a user and the next engineer cannot use:
#: "stop 36", "stops 40-44", "(#34)", "#34", "issue 12", "issue #12". A
#: reference into another project (`Pylons/waitress#343`) is not one of ours.
PAGE_NUMBERS = re.compile(r"\bstops? \d+|(?<![\w/])#\d+\b|\bissues? #?\d+", re.IGNORECASE)
#: A comment's own marker ("#", "#:") is not a number.
_COMMENT_MARKER = re.compile(r"^#+:?")

_CELL_NAME = re.compile(r"`([^`]+)`")


def product_pages(root: Path) -> list[Path]:
    """The pages and hand-edited files a user reads."""
    return [*sorted((root / "docs").glob("*.md")), root / "README.md", root / "config.yaml",
            root / "models" / "catalogue.yaml", root / "models" / "README.md"]


def page_faults(page: Path) -> list[str]:
    """One line per fault in a page: too long, a line too wide, a stop or issue number."""
    lines = page.read_text(encoding="utf-8").splitlines()
    faults = []
    if len(lines) > MAX_LINES:
        faults.append(f"{page.name}: {len(lines)} lines, more than {MAX_LINES}")
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_CHARS:
            faults.append(f"{page.name}:{number}: {len(line)} characters, more than {MAX_CHARS}")
        for found in PAGE_NUMBERS.finditer(line):
            faults.append(f"{page.name}:{number}: names {found.group()!r}")
    return faults


def code_faults(source: Path) -> list[str]:
    """One line per stop or issue number in a Python file's comments and strings (docstrings, help)."""
    text = source.read_text(encoding="utf-8")
    faults = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        text = _COMMENT_MARKER.sub(lambda marker: " " * len(marker.group()), token.string) \
            if token.type == tokenize.COMMENT else token.string
        for found in PAGE_NUMBERS.finditer(text):
            line = token.start[0] + text.count("\n", 0, found.start())
            faults.append(f"{source}:{line}: names {found.group()!r}")
    return faults


def modules(root: Path) -> set[str]:
    """Every module of the package by its path inside it; a package's `__init__.py` is named by its folder."""
    package = root / PACKAGE
    return {path.relative_to(package).as_posix() for path in package.rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def named_in_layout(layout: str) -> set[str]:
    """The modules layout.md's module tables name, each by its path inside the package.

    A section's heading that names one folder (`daemon/`) is the folder its
    rows' modules are in (`lifecycle.py` under it is `daemon/lifecycle.py`);
    one that names none or several is the package itself. A row whose first
    cell names a folder (`stabilise/`, `farm/`) names the modules in that
    folder wherever its text names a file (`motion.py`).
    """
    named: set[str] = set()
    folder = ""
    in_module_table = False
    for line in layout.splitlines():
        if line.startswith("#"):
            folders = [name for name in _CELL_NAME.findall(line) if name.endswith("/")]
            folder = folders[0] if len(folders) == 1 else ""
            in_module_table = False
            continue
        if not line.startswith("|"):
            in_module_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "module":
            in_module_table = True
            continue
        if not in_module_table or set(cells[0]) <= set("-: "):
            continue
        for name in _CELL_NAME.findall(cells[0]):
            if name == "__init__.py":
                continue
            if name.endswith(".py"):
                named.add(folder + name)
            elif name.endswith("/"):
                inner = name if folder == "" or name.startswith(folder) else folder + name
                named.update(inner + found for found in _CELL_NAME.findall(line) if found.endswith(".py")
                             and found != "__init__.py")
    return named


def layout_gaps(root: Path) -> tuple[set[str], set[str]]:
    """The modules layout.md leaves out, and the ones it names that are not there."""
    named = named_in_layout((root / "docs" / "layout.md").read_text(encoding="utf-8"))
    there = modules(root)
    return there - named, named - there


def test_layout_names_every_module():
    missing, _ = layout_gaps(REPO)
    assert not missing, f"docs/layout.md leaves out {sorted(missing)}: give each a line in its package's table"


def test_layout_names_no_module_that_is_not_there():
    _, gone = layout_gaps(REPO)
    assert not gone, f"docs/layout.md names {sorted(gone)}, which are not in {PACKAGE}/"


def test_a_module_left_out_of_layout_is_found(tmp_path):
    layout = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    (tmp_path / "docs").mkdir()
    # A module in a folder table (daemon/), one inside a folder row (imaging/stabilise/),
    # one named inline in a package row (farm/), and one at the top of the package.
    cut = "\n".join(line for line in layout.splitlines() if not line.startswith("| `lifecycle.py`"))
    cut = cut.replace("`motion.py`", "`moving.py`").replace("`clipclient.py`", "`clipcustomer.py`")
    cut = cut.replace("| `errors.py`", "| `error.py`")
    (tmp_path / "docs" / "layout.md").write_text(cut, encoding="utf-8")
    package = tmp_path / PACKAGE
    for module in modules(REPO):
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).touch()
    (package / "daemon" / "newcomer.py").touch()

    missing, gone = layout_gaps(tmp_path)

    assert missing == {"daemon/lifecycle.py", "imaging/stabilise/motion.py", "farm/clipclient.py", "errors.py",
                       "daemon/newcomer.py"}
    assert gone == {"imaging/stabilise/moving.py", "farm/clipcustomer.py", "error.py"}


def test_pages_keep_their_limits():
    faults = [fault for page in product_pages(REPO) for fault in page_faults(page)]
    assert not faults, "\n".join(faults)


def test_a_page_over_its_limits_is_found(tmp_path):
    page = tmp_path / "page.md"
    lines = [f"line {n}" for n in range(MAX_LINES)]
    lines[3] = "x" * (MAX_CHARS + 1)
    lines[5] = "measured in stop 36, dropped in stops 40-44"
    lines[7] = "still open (#34), see issue 12 and Issue #15"
    lines[9] = "a link to [the farm](farm.md#a-farm-managers-own-tasks) and Pylons/waitress#343 is fine"
    page.write_text("\n".join(lines) + "\nthe 401st line\n", encoding="utf-8")

    faults = page_faults(page)

    assert faults == [
        f"page.md: {MAX_LINES + 1} lines, more than {MAX_LINES}",
        f"page.md:4: {MAX_CHARS + 1} characters, more than {MAX_CHARS}",
        "page.md:6: names 'stop 36'", "page.md:6: names 'stops 40'",
        "page.md:8: names '#34'", "page.md:8: names 'issue 12'", "page.md:8: names 'Issue #15'",
    ]


def test_code_names_no_stop_or_issue():
    sources = sorted((REPO / PACKAGE).rglob("*.py")) + sorted((REPO / "benchmarks").rglob("*.py"))
    faults = [fault for source in sources for fault in code_faults(source)]
    assert not faults, "\n".join(faults)


def test_a_stop_or_issue_in_code_is_found(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        '"""A module measured in stop 36.\n\nThe row of #31 it answers."""\n'
        "\n"
        "#: Pylons/waitress#343 is another project's, and the name below is code\n"
        "stop = 3  # see issue 12 (#34)\n"
        "HELP = 'the clips after stop 44'\n",
        encoding="utf-8")

    assert code_faults(source) == [
        f"{source}:1: names 'stop 36'", f"{source}:3: names '#31'",
        f"{source}:6: names 'issue 12'", f"{source}:6: names '#34'",
        f"{source}:7: names 'stop 44'",
    ]
