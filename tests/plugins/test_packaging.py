"""The distribution ships every package of the checkout: setup.py finds each folder with an
``__init__.py`` under ``mpcore/`` and under each plugin's folder (an editable install finds a
subpackage anyway, so only a built wheel would miss one), and every plugin of mpcore's own
entry points is one of those packages."""

from __future__ import annotations

import runpy

import tomllib
from conftest import REPO_ROOT


def _setup() -> dict:
    return runpy.run_path(str(REPO_ROOT / "setup.py"), run_name="setup_under_test")


def test_every_package_is_found() -> None:
    setup = _setup()
    found = set(setup["packages"]())
    roots = setup["package_dirs"]()
    assert roots == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"]["package-dir"]
    present = set()
    for name, folder in roots.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / folder)
            present.add(".".join([name, *relative.parts]))
    assert present - found == set(), "setup.py does not find these packages"
    assert found - present == set(), "setup.py finds packages that have no __init__.py"


def test_every_built_in_plugin_is_shipped() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    plugins = set(_setup()["package_dirs"]())
    modules = {value.split(":")[0].split(".")[0]
               for value in project["entry-points"]["mpcore"].values()}
    assert modules <= plugins, sorted(modules - plugins)
    assert "packages" not in tomllib.loads(
        (REPO_ROOT / "pyproject.toml").read_text())["tool"].get("setuptools", {})
