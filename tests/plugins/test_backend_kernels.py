"""Reaching a backend's kernels: ``Backend.kernel(name)``, and the kernel sets the registry's
source hands every backend when it is first activated (``Backend`` imports no plugin code)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore.core import backend as backend_module
from mpcore.plugins import manager as plugins


class _Fresh(CpuBackend):
    name = "cpu-kernel-access-test"


def test_kernel_gives_one_kernel_of_the_table() -> None:
    be = _Fresh()
    add = be.kernel("add")  # activates the backend
    assert add is be.kernels()["add"] is be._kernel_table["add"]
    np.testing.assert_array_equal(add(np.array([1.0], np.float32), 2.0), [3.0])


def test_a_missing_kernel_raises_naming_the_backend_or_gives_the_default() -> None:
    be = _Fresh()
    with pytest.raises(KeyError, match=r"cpu-kernel-access-test.*no_such_kernel"):
        be.kernel("no_such_kernel")
    assert be.kernel("no_such_kernel", None) is None
    assert be.kernel("softmax", None) is be.kernels().get("softmax")


def test_the_registry_hands_backends_the_plugins_kernel_sets() -> None:
    assert backend_module._kernel_set_source is plugins.install_kernel_sets


def test_a_backend_takes_its_kernel_sets_from_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "_kernel_set_source", backend_module._kernel_set_source)
    seen: list[Any] = []

    def source(be: mp.Backend, table: dict[str, Any]) -> tuple[mp.KernelSet, ...]:
        seen.append(be)
        kernel_set = mp.KernelSet(provider="test-source", kernels={"exp": lambda x: x})
        table.update(kernel_set.kernels)
        return (kernel_set,)

    backend_module.set_kernel_set_source(source)
    be = _Fresh()
    assert [s.provider for s in be.kernel_sets] == ["test-source"]
    assert seen == [be]
    assert be.kernel("exp")(5) == 5
    backend_module.set_kernel_set_source(None)
    alone = _Fresh()
    assert alone.kernel_sets == ()
    assert alone.kernel("exp") == alone.exp
