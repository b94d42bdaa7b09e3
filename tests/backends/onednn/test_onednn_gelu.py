"""oneDNN's eltwise GELU as the CPU backend's gelu/gelu_grad kernels (mpcore_onednn.eltwise):
both forms against math.erf / tanh in float64, float32 and bfloat16 on the primitives, float16
on the float32 primitives (rounded once), float64 on the NumPy kernels, a failing primitive
logged and not retried, and the switch that keeps float32 work off oneDNN."""

from __future__ import annotations

import logging
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_onednn.dnnl import DnnlError
from onednn_isa import library_or_skip

pytestmark = pytest.mark.usefixtures("on_cpu")


def _gelu(monkeypatch: pytest.MonkeyPatch, float32: str = "on") -> tuple[CpuBackend, Any]:
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", float32)
    backend = CpuBackend()
    return backend, getattr(backend.kernels()["gelu"], "eltwise", None)


def _reference(x: np.ndarray, approximate: bool) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    if approximate:
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (
            1 + 3 * 0.044715 * x * x)
    erf = np.vectorize(math.erf)(x / math.sqrt(2))
    return 0.5 * x * (1 + erf), 0.5 * (1 + erf) + x * np.exp(-0.5 * x * x) / math.sqrt(
        2 * math.pi)


@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (ml_dtypes.bfloat16, 1e-2)])
def test_gelu_on_onednn_against_float64(monkeypatch: pytest.MonkeyPatch, approximate: bool,
                                        dtype: Any, tol: float) -> None:
    backend, eltwise = _gelu(monkeypatch)
    assert eltwise is not None
    x = np.linspace(-7, 7, 1001).astype(dtype).reshape(7, 11, 13)
    g = np.cos(np.arange(x.size)).reshape(x.shape).astype(dtype)
    k = backend.kernels()
    runs = eltwise.cache.misses + eltwise.cache.hits
    y, saved = k["gelu"](x, approximate)
    dx = k["gelu_grad"](g, x, saved, approximate)
    assert eltwise.cache.misses + eltwise.cache.hits == runs + 2   # both ran on oneDNN
    assert y.dtype == dx.dtype == np.dtype(dtype) and y.shape == x.shape
    want_y, want_d = _reference(x, approximate)
    np.testing.assert_allclose(y.astype(np.float64), want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx.astype(np.float64), g.astype(np.float64) * want_d,
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("approximate", [False, True])
def test_float16_runs_on_the_float32_primitives_rounded_once(monkeypatch: pytest.MonkeyPatch,
                                                             approximate: bool) -> None:
    backend, eltwise = _gelu(monkeypatch)
    k = backend.kernels()
    x = np.linspace(-7, 7, 1001).astype(np.float16).reshape(7, 11, 13)
    g = np.cos(np.arange(x.size)).reshape(x.shape).astype(np.float16)
    runs = eltwise.cache.misses + eltwise.cache.hits
    y, saved = k["gelu"](x, approximate)
    dx = k["gelu_grad"](g, x, saved, approximate)
    assert eltwise.cache.misses + eltwise.cache.hits == runs + 2   # both ran on oneDNN
    y32, _ = k["gelu"](x.astype(np.float32), approximate)
    dx32 = k["gelu_grad"](g.astype(np.float32), x.astype(np.float32), None, approximate)
    assert y.dtype == dx.dtype == np.float16
    np.testing.assert_array_equal(y, y32.astype(np.float16))
    np.testing.assert_array_equal(dx, dx32.astype(np.float16))
    want_y, _ = _reference(x, approximate)
    np.testing.assert_allclose(y.astype(np.float64), want_y, rtol=2e-3, atol=2e-3)


def test_float64_takes_the_numpy_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, eltwise = _gelu(monkeypatch)
    k = backend.kernels()
    x = np.linspace(-3, 3, 9).astype(np.float64)
    runs = eltwise.cache.misses + eltwise.cache.hits
    y, saved = k["gelu"](x, False)
    dx = k["gelu_grad"](np.ones_like(x), x, saved, False)
    assert eltwise.cache.misses + eltwise.cache.hits == runs
    np.testing.assert_array_equal(y, backend.gelu(x, False)[0])
    np.testing.assert_array_equal(dx, backend.gelu_grad(np.ones_like(x), x,
                                                        backend.gelu(x, False)[1], False))


def test_a_failing_primitive_is_logged_once_and_not_retried(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    backend, eltwise = _gelu(monkeypatch)

    def fail(*args: Any) -> Any:
        raise DnnlError("no primitive")

    monkeypatch.setattr(eltwise.cache, "forward", fail)
    x = np.linspace(-2, 2, 5).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        first = backend.kernels()["gelu"](x, False)[0]
        second = backend.kernels()["gelu"](x, False)[0]
    np.testing.assert_array_equal(first, backend.gelu(x, False)[0])
    np.testing.assert_array_equal(second, first)
    assert sum("oneDNN gelu failed" in r.getMessage() for r in caplog.records) == 1


def test_float32_off_keeps_the_numpy_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    _, eltwise = _gelu(monkeypatch, float32="off")
    assert eltwise is None
