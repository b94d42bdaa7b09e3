"""The oneDNN provider's normalization kernels (``batch_norm``, ``batch_norm_grad``,
``layer_norm``, ``layer_norm_grad``): oneDNN's primitives for float32 against a float64
reference (with and without gamma and beta, odd shapes), float64 and empty arrays on the NumPy
kernels, float16 through oneDNN's float32 primitives (the NumPy kernels' values, rounded once),
non-finite inputs as the NumPy kernels give them, a failing primitive falling back
(logged, never fatal), MPCORE_ONEDNN=off and MPCORE_ONEDNN_FLOAT32=off keeping NumPy's, and the
ops (bfloat16 inputs too) through a traced step."""

from __future__ import annotations

import logging
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_onednn.dnnl import DnnlError
from onednn_isa import library_or_skip

import mpcore as mp

pytestmark = pytest.mark.usefixtures("on_cpu")

F32 = np.dtype(np.float32)
EPS = 1e-3
SHAPES = [(64, 7, 7, 16), (3, 5, 7), (2, 1), (5, 33), (1, 4, 3, 2)]


def _kernels(monkeypatch: pytest.MonkeyPatch, float32: str = "on") -> tuple[CpuBackend, Any]:
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", float32)
    backend = CpuBackend()
    kernel = backend.kernels().get("batch_norm")
    if getattr(kernel, "norm", None) is None:
        pytest.skip("the oneDNN provider installed no normalization kernels")
    return backend, kernel.norm  # type: ignore[union-attr]


def _reference(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray | None,
               beta: np.ndarray | None, per_row: bool) -> dict[str, np.ndarray]:
    """The forward and backward results in float64 over the (rows, channels) view."""
    c = x.shape[-1]
    x2, g2 = x.astype(np.float64).reshape(-1, c), dy.astype(np.float64).reshape(-1, c)
    axis = 1 if per_row else 0
    mu = x2.mean(axis, keepdims=True)
    var = x2.var(axis, keepdims=True)
    inv = 1.0 / np.sqrt(var + EPS)
    x_hat = (x2 - mu) * inv
    gh = np.ones(c) if gamma is None else gamma.astype(np.float64)
    bh = np.zeros(c) if beta is None else beta.astype(np.float64)
    n = x2.shape[axis]
    if per_row:
        dyg = g2 * gh
        dx = inv * (dyg - dyg.mean(1, keepdims=True)
                    - x_hat * (dyg * x_hat).mean(1, keepdims=True))
    else:
        db, dg = g2.sum(0), (g2 * x_hat).sum(0)
        dx = gh * inv * (g2 - db / n - x_hat * dg / n)
    return {"y": (x_hat * gh + bh).reshape(x.shape), "mean": mu.reshape(-1),
            "var": var.reshape(-1), "inv": inv.reshape(-1), "dx": dx.reshape(x.shape),
            "dgamma": (g2 * x_hat).sum(0), "dbeta": g2.sum(0)}


def _close(got: np.ndarray, want: np.ndarray, what: str, scale: float = 1.0) -> None:
    assert got.dtype == F32 and got.shape == want.shape, f"{what}: {got.dtype} {got.shape}"
    bound = 64 * float(np.finfo(F32).eps) * (scale + np.abs(want))
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"{what}: worst {np.max(err / bound):.2f}x the bound"


def _operands(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(F32)
    dy = rng.standard_normal(shape).astype(F32)
    gamma = rng.standard_normal(shape[-1]).astype(F32)
    beta = rng.standard_normal(shape[-1]).astype(F32)
    return x, dy, gamma, beta


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("params", [True, False], ids=["gamma-beta", "none"])
def test_batch_norm_matches_float64(monkeypatch: pytest.MonkeyPatch, shape: Any,
                                    params: bool) -> None:
    _, norm = _kernels(monkeypatch)
    x, dy, gamma, beta = _operands(shape)
    g, b = (gamma, beta) if params else (None, None)
    want = _reference(x, dy, g, b, per_row=False)
    y, mean, var, inv = norm.batch_norm(x, g, b, EPS)
    dx, dgamma, dbeta = norm.batch_norm_grad(dy, x, mean, inv, g)
    rows = x.size // shape[-1]
    for name, got, scale in (("y", y, 1), ("mean", mean, 3), ("var", var, 1), ("inv", inv, 1),
                             ("dx", dx, 3), ("dgamma", dgamma, rows), ("dbeta", dbeta, rows)):
        _close(got, want[name], f"batch_norm {shape} {name}", scale)
    assert not norm.failures
    assert len(norm.cache) == 2, "not run by oneDNN"


@pytest.mark.parametrize("shape", [*SHAPES, (2048, 512)], ids=str)
@pytest.mark.parametrize("params", [True, False], ids=["gamma-beta", "none"])
def test_layer_norm_matches_float64(monkeypatch: pytest.MonkeyPatch, shape: Any,
                                    params: bool) -> None:
    _, norm = _kernels(monkeypatch)
    x, dy, gamma, beta = _operands(shape)
    g, b = (gamma, beta) if params else (None, None)
    want = _reference(x, dy, g, b, per_row=True)
    y, mean, inv = norm.layer_norm(x, g, b, EPS)
    dx, dgamma, dbeta = norm.layer_norm_grad(dy, x, mean, inv, g)
    rows = x.size // shape[-1]
    for name, got, scale in (("y", y, 1), ("mean", mean, 3), ("inv", inv, 1), ("dx", dx, 3),
                             ("dgamma", dgamma, rows), ("dbeta", dbeta, rows)):
        _close(got, want[name], f"layer_norm {shape} {name}", scale)
    assert not norm.failures
    assert len(norm.cache) == 2, "not run by oneDNN"


@pytest.mark.parametrize("kind", ["batch", "layer"])
def test_float16_runs_as_float32_on_onednn_and_rounds_once(monkeypatch: pytest.MonkeyPatch,
                                                            kind: str) -> None:
    # no float16 normalization primitive without avx512_fp16: the widened problem runs on the
    # float32 one, and its dx/y are the float32 results rounded once to float16
    backend, norm = _kernels(monkeypatch)
    x32, dy32, gamma, beta = _operands((16, 5, 5, 8))
    x, dy = x32.astype(np.float16), dy32.astype(np.float16)
    forward, backward = getattr(norm, f"{kind}_norm"), getattr(norm, f"{kind}_norm_grad")
    out16 = forward(x, gamma, beta, EPS)
    out32 = forward(x.astype(F32), gamma, beta, EPS)
    assert out16[0].dtype == np.float16
    np.testing.assert_array_equal(out16[0], out32[0].astype(np.float16))
    for a, b in zip(out16[1:], out32[1:]):       # the statistics stay float32
        assert a.dtype == F32
        np.testing.assert_array_equal(a, b)
    mean, inv = out16[1], out16[-1]
    grads16 = backward(dy, x, mean, inv, gamma)
    grads32 = backward(dy.astype(F32), x.astype(F32), mean, inv, gamma)
    assert grads16[0].dtype == np.float16
    np.testing.assert_array_equal(grads16[0], grads32[0].astype(np.float16))
    for a, b in zip(grads16[1:], grads32[1:]):
        np.testing.assert_array_equal(a, b)
    # and within float16's rounding of the NumPy kernel's values
    numpy_y = getattr(CpuBackend, f"{kind}_norm")(backend, x, gamma, beta, EPS)[0]
    np.testing.assert_allclose(out16[0].astype(F32), numpy_y.astype(F32), rtol=2e-3,
                               atol=2e-3)
    assert not norm.failures and len(norm.cache) == 2


def test_float64_and_empty_arrays_take_the_numpy_kernels(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    backend, norm = _kernels(monkeypatch)
    x = np.random.default_rng(0).standard_normal((4, 6))
    got = norm.batch_norm(x, None, None, EPS)
    want = CpuBackend.batch_norm(backend, x, None, None, EPS)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float64
    assert norm.layer_norm(x, None, None, EPS)[0].dtype == np.float64
    empty = np.zeros((0, 3), F32)
    assert norm.batch_norm(empty, None, None, EPS)[0].shape == (0, 3)
    assert len(norm.cache) == 0


def _nonfinite() -> np.ndarray:
    """NaN and infinities in three channels and three rows; the rest finite."""
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(F32)
    x[1, 0] = np.nan
    x[2, 1] = np.inf
    x[4, 2] = -np.inf
    return x


@pytest.mark.parametrize("kind", ["batch", "layer"])
def test_nonfinite_inputs_give_the_numpy_kernels_pattern(monkeypatch: pytest.MonkeyPatch,
                                                         kind: str) -> None:
    backend, norm = _kernels(monkeypatch)
    x = _nonfinite()
    dy = np.ones_like(x)
    dy[5, 3] = np.inf
    g = np.full(4, 2.0, F32)
    fwd, bwd = f"{kind}_norm", f"{kind}_norm_grad"
    got = getattr(norm, fwd)(x, g, None, EPS)
    want = getattr(CpuBackend, fwd)(backend, x, g, None, EPS)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b))
    mean, inv = want[1], want[-1]
    got_g = getattr(norm, bwd)(dy, x, mean, inv, g)
    want_g = getattr(CpuBackend, bwd)(backend, dy, x, mean, inv, g)
    for a, b in zip(got_g, want_g):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b))


def test_a_failing_primitive_falls_back_logged_and_is_not_retried(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    backend, norm = _kernels(monkeypatch)
    calls = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise DnnlError("dnnl_batch_normalization_forward_primitive_desc_create failed: "
                        "dnnl_unimplemented")

    monkeypatch.setattr(norm.cache, "forward", broken)
    x, _, gamma, beta = _operands((4, 3, 5))
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        first = norm.batch_norm(x, gamma, beta, EPS)
        second = norm.batch_norm(x, gamma, beta, EPS)
    assert len(calls) == 1 and len(norm.failures) == 1
    assert "dnnl_unimplemented" in caplog.text and "NumPy" in caplog.text
    want = CpuBackend.batch_norm(backend, x, gamma, beta, EPS)
    for a, b, c in zip(first, second, want):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)


@pytest.mark.parametrize("setting", [("MPCORE_ONEDNN", "off"), ("MPCORE_ONEDNN_FLOAT32", "off")])
def test_off_keeps_the_numpy_kernels(monkeypatch: pytest.MonkeyPatch,
                                     setting: tuple[str, str]) -> None:
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv(*setting)
    kernels = CpuBackend().kernels()
    for name in ("batch_norm", "batch_norm_grad", "layer_norm", "layer_norm_grad"):
        assert getattr(kernels[name], "norm", None) is None, name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ops_in_a_traced_step_use_onednn(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    backend, norm = _kernels(monkeypatch)
    mp.set_backend(backend)
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((8, 5, 5, 6)).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    x = mp.Variable(x0)
    gamma = mp.Variable(np.ones(6, F32))

    def step() -> Any:
        with mp.GradientTape() as tape:
            y, _, _ = mp.ops.batch_norm(x, gamma, None, EPS)
            z = mp.ops.layer_norm(y, gamma, None, EPS)
            loss = mp.ops.sum(mp.ops.square(mp.ops.multiply(z, mp.ops.cast(x, "float32"))))
        return tape.gradient(loss, [x, gamma])

    eager = [np.asarray(g.numpy(), np.float64) for g in step()]
    traced = mp.function(step)
    for _ in range(2):
        got = [np.asarray(g.numpy(), np.float64) for g in traced()]
    for a, b in zip(got, eager):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    assert norm.cache.hits > 0 and not norm.failures
