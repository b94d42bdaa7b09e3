"""The packages of the distribution, found rather than listed: mpcore's, and those of the
plugins that ship with it, found under the folders pyproject.toml's
``[tool.setuptools.package-dir]`` maps them to: their import names differ from the folders'
(``backends/cpu`` is ``mpcore_cpu``), which ``[tool.setuptools.packages.find]`` cannot express
(and setuptools ignores setup.py's packages when it is there). Everything else is in
pyproject.toml."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent


def package_dirs() -> dict[str, str]:
    """pyproject.toml's [tool.setuptools.package-dir] (read by hand: Python 3.10 has no
    tomllib)."""
    text = (HERE / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^(\w+)\s*=\s*"([^"]+)"', section, re.M))


def packages() -> list[str]:
    found = []
    for name, folder in package_dirs().items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(str(HERE / folder)))]
    return found


if __name__ == "__main__":   # as setuptools runs it (tests read packages() alone)
    setup(packages=packages())
