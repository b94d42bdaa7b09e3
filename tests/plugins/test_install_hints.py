"""Every install hint mpcore prints is a command that works: mpcore is on no package index, so
``pip install "mpcore[cuda]"`` fails; an extra is installed from the checkout (issue 15 item 14)."""

from __future__ import annotations

import doctest
import re

import pytest
import tomllib
from conftest import REPO_ROOT

import mpcore as mp
import mpcore.plugins.extras

ROOT = REPO_ROOT
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
             ["optional-dependencies"])
# a pip command that installs mpcore by name from an index, in any quoting
INDEX_INSTALL = re.compile(r"pip install (-U )?[\"']?mpcore\b")


def extras_named(hint: str) -> list[str]:
    return [e for group in re.findall(r'\.\[([a-z0-9,-]+)\]', hint) for e in group.split(",")]


def test_install_command_doctests() -> None:
    assert doctest.testmod(mpcore.plugins.extras).failed == 0


@pytest.mark.parametrize("backend", mp.backends(), ids=lambda b: b.name)
def test_backend_install_hints_name_real_extras(backend: mp.Backend) -> None:
    if not backend.install_hint:
        return
    assert backend.install_hint.startswith("pip install -e "), backend.install_hint
    named = extras_named(backend.install_hint)
    assert set(named) <= EXTRAS, f"{backend.install_hint!r} names an extra pyproject lacks"
    assert not INDEX_INSTALL.search(backend.install_hint)


def test_no_message_installs_mpcore_from_an_index() -> None:
    sources = [p for folder in ("mpcore", "backends") for p in (ROOT / folder).rglob("*")
               if p.suffix in (".py", ".md")]
    assert sources
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if INDEX_INSTALL.search(line)]
    assert not offenders, offenders
