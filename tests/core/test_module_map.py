"""docs/architecture.md opens with the module map: every package of mpcore/ (a ``### `pkg/` ``
heading, in the package order of test_package_order.py) and every module (a ``- `pkg/mod.py` ``
line with what it is), and nothing that does not exist. No Python file of the repository is
over 500 lines."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO_ROOT
from test_package_order import ORDER

ROOT = REPO_ROOT / "mpcore"
DOC = REPO_ROOT / "docs" / "architecture.md"


def _map() -> tuple[list[str], set[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    packages = re.findall(r"^### `([\w/]+)/` — \S", section, re.M)
    modules = set(re.findall(r"^- `([\w/]+\.py)` — \S", section, re.M))
    return packages, modules


def test_the_map_comes_first() -> None:
    headings = re.findall(r"^## (.+)$", DOC.read_text(encoding="utf-8"), re.M)
    assert headings[0] == "Module map"


def test_the_map_lists_every_package_in_order() -> None:
    packages, _ = _map()
    present = sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.rglob("*/__init__.py"))
    assert sorted(packages) == present
    top = [p for p in packages if "/" not in p]
    assert top == list(ORDER), "list the packages in test_package_order.ORDER's order"


def test_the_map_lists_every_module_and_nothing_else() -> None:
    _, modules = _map()
    present = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
               if p.name != "__init__.py" or p.parent == ROOT}
    assert present - modules == set(), "add these to docs/architecture.md's module map"
    assert modules - present == set(), "the module map lists files that do not exist"


def test_no_python_file_is_over_500_lines() -> None:
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    long = {f: n for f in files if (REPO_ROOT / f).is_file()
            and (n := len((REPO_ROOT / f).read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}, f"split these by subject: {long}"
