"""The distribution ships every package of the checkout: ``[tool.setuptools] packages`` lists
each folder with an ``__init__.py`` under ``mpcore/`` and each package-dir mapping (an editable
install finds an unlisted subpackage anyway, so only a built wheel would miss it)."""

from __future__ import annotations

import tomllib
from conftest import REPO_ROOT


def test_every_package_is_listed() -> None:
    setup = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    roots = {"mpcore": "mpcore", **setup["package-dir"]}
    present = set()
    for name, folder in roots.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / folder)
            present.add(".".join([name, *relative.parts]))
    assert present - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - present == set(), "these listed packages have no __init__.py"
