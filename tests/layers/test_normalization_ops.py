"""``mp.ops.batch_norm`` and ``mp.ops.layer_norm``: the fused kernels (CPU) against the
composites of recorded ops, the forward pass, the closed-form gradients, a gradient of a
gradient (an outer tape records the backward pass), and the statistics batch_norm returns."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore.ops import normalization

RNG = np.random.default_rng(11)


def _grads(fn, x, g, b, outer: bool = False):  # type: ignore[no-untyped-def]
    """What ``fn(x, gamma, beta, 1e-3)`` returns (each output, as host arrays) followed by
    the gradients of ``sum(y * r)`` with respect to x, gamma and beta; and, with ``outer``,
    the gradient of ``sum(dx * dx)`` with respect to x (a gradient of a gradient)."""
    xt, gt, bt = (mp.constant(a) for a in (x, g, b))
    r = mp.constant(np.cos(np.arange(x.size)).reshape(x.shape).astype(x.dtype))
    with mp.GradientTape() as outer_tape:
        outer_tape.watch(xt)
        with mp.GradientTape() as tape:
            for t in (xt, gt, bt):
                tape.watch(t)
            out = fn(xt, gt, bt, 1e-3)
            outs = list(out) if isinstance(out, tuple) else [out]
            loss = mp.ops.sum(outs[0] * r)
        gx, gg, gb = tape.gradient(loss, [xt, gt, bt])
        second = mp.ops.sum(gx * gx)
    gxx = outer_tape.gradient(second, xt) if outer else None
    return [np.asarray(a) for a in (*outs, gx, gg, gb)], gxx


@pytest.mark.parametrize("shape", [(8, 5), (4, 3, 3, 6), (2, 7, 16)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_equals_composite(on_cpu: mp.Backend, shape: tuple[int, ...], dtype: str) -> None:
    assert on_cpu.kernels().get("batch_norm") is not None
    x = (RNG.standard_normal(shape) * 3 + 2).astype(dtype)
    g = RNG.standard_normal(shape[-1]).astype(dtype)
    b = RNG.standard_normal(shape[-1]).astype(dtype)
    fused, _ = _grads(mp.ops.batch_norm, x, g, b)
    comp, _ = _grads(normalization._composite, x, g, b)
    rtol = 2e-5 if dtype == "float32" else 1e-12
    for name, a, c in zip(("y", "mean", "var", "dx", "dgamma", "dbeta"), fused, comp):
        np.testing.assert_allclose(a, c, rtol=rtol, atol=rtol, err_msg=name)
    # the statistics: the batch's mean and biased variance per channel
    flat = x.reshape(-1, shape[-1]).astype(np.float64)
    np.testing.assert_allclose(fused[1], flat.mean(0), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(fused[2], flat.var(0), rtol=rtol, atol=rtol)


def test_gradient_of_gradient_matches_composite(on_cpu: mp.Backend) -> None:
    x = RNG.standard_normal((6, 4))
    g, b = RNG.standard_normal(4), RNG.standard_normal(4)
    _, fused = _grads(mp.ops.batch_norm, x, g, b, outer=True)
    _, comp = _grads(normalization._composite, x, g, b, outer=True)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(comp), rtol=1e-9, atol=1e-12)


def test_batch_norm_errors() -> None:
    with pytest.raises(ValueError, match="rank >= 2"):
        mp.ops.batch_norm(mp.constant([1.0, 2.0]), None, None, 1e-3)
    with pytest.raises(ValueError, match=r"gamma of shape \(3,\) does not match the 4 channels"):
        mp.ops.batch_norm(mp.ops.ones((2, 4)), mp.ops.ones((3,)), None, 1e-3)


def test_without_gamma_and_beta(backend: mp.Backend) -> None:
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    y, _, _ = mp.ops.batch_norm(mp.constant(x), None, None, 0.0)
    want = (x - x.mean(0)) / np.sqrt(x.var(0))
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(8, 5), (2, 7, 16), (3, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_fused_equals_composite(on_cpu: mp.Backend, shape: tuple[int, ...],
                                           dtype: str) -> None:
    assert on_cpu.kernels().get("layer_norm") is not None
    x = (RNG.standard_normal(shape) * 3 + 2).astype(dtype)
    g = RNG.standard_normal(shape[-1]).astype(dtype)
    b = RNG.standard_normal(shape[-1]).astype(dtype)
    fused, _ = _grads(mp.ops.layer_norm, x, g, b)
    comp, _ = _grads(normalization._composite_layer_norm, x, g, b)
    rtol = 2e-5 if dtype == "float32" else 1e-12
    for name, a, c in zip(("y", "dx", "dgamma", "dbeta"), fused, comp):
        np.testing.assert_allclose(a, c, rtol=rtol, atol=rtol, err_msg=name)
    flat = x.reshape(-1, shape[-1]).astype(np.float64)
    want = (flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(fused[0], (want * g + b).reshape(shape), rtol=rtol, atol=rtol)


def test_layer_norm_gradient_of_gradient(on_cpu: mp.Backend) -> None:
    x = RNG.standard_normal((6, 4))
    g, b = RNG.standard_normal(4), RNG.standard_normal(4)
    _, fused = _grads(mp.ops.layer_norm, x, g, b, outer=True)
    _, comp = _grads(normalization._composite_layer_norm, x, g, b, outer=True)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(comp), rtol=1e-9, atol=1e-12)


def test_layer_norm_errors() -> None:
    with pytest.raises(ValueError, match="rank >= 1"):
        mp.ops.layer_norm(mp.constant(1.0), None, None, 1e-3)
    with pytest.raises(ValueError, match=r"beta of shape \(3,\) does not match the last axis"):
        mp.ops.layer_norm(mp.ops.ones((2, 4)), None, mp.ops.ones((3,)), 1e-3)


# --- GELU: the fused kernels against the composite ---------------------------------------
@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_fused_equals_composite_with_second_derivative(on_cpu: mp.Backend,
                                                           approximate: bool) -> None:
    from mpcore.ops import elementwise

    x = RNG.uniform(-4, 4, (5, 7))
    xt = mp.constant(x)
    with mp.GradientTape() as outer:
        outer.watch(xt)
        with mp.GradientTape() as tape:
            tape.watch(xt)
            total = mp.ops.sum(mp.ops.gelu(xt, approximate=approximate))
        dx = tape.gradient(total, xt)
        total_dx = mp.ops.sum(dx)
    d2 = outer.gradient(total_dx, xt)
    want_d = np.asarray(elementwise._gelu_composite_derivative(mp.constant(x), approximate))
    np.testing.assert_allclose(np.asarray(dx), want_d, rtol=1e-12, atol=1e-12)
    eps = 1e-6   # the second derivative by central differences of the first
    hi = np.asarray(elementwise._gelu_composite_derivative(mp.constant(x + eps), approximate))
    lo = np.asarray(elementwise._gelu_composite_derivative(mp.constant(x - eps), approximate))
    np.testing.assert_allclose(np.asarray(d2), (hi - lo) / (2 * eps), rtol=1e-5, atol=1e-7)


def test_gelu_16_bit_is_rounded_once(on_cpu: mp.Backend) -> None:
    import ml_dtypes

    x = mp.constant(RNG.uniform(-4, 4, 64), dtype="bfloat16")
    y = mp.ops.gelu(x)
    assert y.dtype == "bfloat16"
    # the float32 result of the same bfloat16 inputs, rounded once
    y32 = np.asarray(mp.ops.gelu(mp.ops.cast(x, "float32")))
    np.testing.assert_array_equal(np.asarray(y), y32.astype(ml_dtypes.bfloat16))
