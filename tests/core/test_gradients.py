"""Gradients of every differentiable op: central finite differences in float64 on the CPU
backend (fused kernels and the composite paths), then every available backend's float32
gradients against those float64 ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore import ops


class NoFusedCpu(CpuBackend):
    """The CPU backend without its fused kernels: the core's composite paths run."""

    name = "cpu-no-fused"
    softmax = None
    log_softmax = None
    sparse_softmax_cross_entropy = None
    relu_grad = None
    bias_add = None
    dropout_mask = None
    all_finite = None


NO_FUSED = NoFusedCpu()


def arr(shape: tuple[int, ...], low: float = -2.0, high: float = 2.0, seed: int = 0,
        away: float = 0.0) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(low, high, shape)
    if away:
        x = np.where(np.abs(x) < away, np.copysign(away, x), x)
    return x


@dataclass
class Case:
    name: str
    fn: Callable[..., mp.Tensor]
    inputs: list[np.ndarray]
    composite: bool = False          # run on the CPU backend without fused kernels
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


def _where(a: mp.Tensor, b: mp.Tensor) -> mp.Tensor:
    return ops.where(ops.greater(a, 0.0), a, b)


def _relu_grad_path(g: mp.Tensor) -> mp.Tensor:
    y = ops.relu(mp.constant(arr((3, 4), seed=9, away=0.1), dtype=g.dtype, backend=g.backend))
    return ops.relu_grad(g, y)


def _sum_then(op: Callable[..., mp.Tensor], **kw: Any) -> Callable[[mp.Tensor], mp.Tensor]:
    return lambda x: op(x, **kw)


S = (3, 4)
CASES: list[Case] = [
    Case("add", ops.add, [arr(S), arr((4,), seed=1)]),
    Case("add-scalar", lambda a: 2.5 + a, [arr(S)]),
    Case("subtract", ops.subtract, [arr(S), arr((3, 1), seed=1)]),
    Case("rsubtract-scalar", lambda a: 1.0 - a, [arr(S)]),
    Case("multiply", ops.multiply, [arr(S), arr((4,), seed=1)]),
    Case("divide", ops.divide, [arr(S), arr((4,), 0.5, 2, seed=1)]),
    Case("rdivide-scalar", lambda a: 3.0 / a, [arr(S, 0.5, 2)]),
    Case("power-both", ops.power, [arr(S, 0.5, 2), arr(S, -1.5, 2, seed=1)]),
    Case("power-scalar-exponent", lambda a: a ** 3.0, [arr(S)]),
    Case("power-scalar-base", lambda b: 2.0 ** b, [arr(S)]),
    Case("maximum", ops.maximum, [arr(S), arr(S, seed=1)]),
    Case("minimum", ops.minimum, [arr(S), arr((4,), seed=1)]),
    Case("maximum-scalar", lambda a: ops.maximum(a, 0.3), [arr(S, away=0.5)]),
    Case("negative", ops.negative, [arr(S)]),
    Case("abs", ops.abs, [arr(S, away=0.1)]),
    Case("exp", ops.exp, [arr(S)]),
    Case("log", ops.log, [arr(S, 0.2, 3)]),
    Case("sqrt", ops.sqrt, [arr(S, 0.2, 3)]),
    Case("square", ops.square, [arr(S)]),
    Case("relu", ops.relu, [arr(S, away=0.1)]),
    Case("relu-composite", ops.relu, [arr(S, away=0.1)], composite=True),
    Case("relu_grad", _relu_grad_path, [arr(S, seed=3)]),
    Case("relu_grad-composite", _relu_grad_path, [arr(S, seed=3)], composite=True),
    Case("sigmoid", ops.sigmoid, [arr(S, -4, 4)]),
    Case("tanh", ops.tanh, [arr(S)]),
    Case("erf", ops.erf, [arr(S)]),
    Case("cos", ops.cos, [arr(S, -4, 4)]),
    Case("sin", ops.sin, [arr(S, -4, 4)]),
    Case("gelu", ops.gelu, [arr(S, -3, 3)]),
    Case("gelu-approximate", lambda x: ops.gelu(x, approximate=True), [arr(S, -3, 3)]),
    Case("reciprocal", ops.reciprocal, [arr(S, 0.5, 2)]),
    Case("rsqrt", ops.rsqrt, [arr(S, 0.5, 2)]),
    Case("where", _where, [arr(S, away=0.1), arr((4,), seed=1)]),
    Case("clip_by_value", lambda x: ops.clip_by_value(x, -0.5, 0.7),
         [np.asarray([[-1.0, -0.2, 0.1, 0.9], [0.3, -0.8, 1.5, 0.0]])]),
    Case("bias_add", ops.bias_add, [arr((2, 3, 4)), arr((4,), seed=1)]),
    Case("bias_add-composite", ops.bias_add, [arr(S), arr((4,), seed=1)], composite=True),
    *[Case(f"{name}-axis{axis}-keep{keep}", _sum_then(getattr(ops, name), axis=axis,
                                                      keepdims=keep), [arr((2, 3, 4))])
      for name in ("sum", "mean", "max", "min")
      for axis in (None, 1, (0, 2), -1) for keep in (False, True)],
    *[Case(f"matmul-ta{ta}-tb{tb}",
           lambda a, b, ta=ta, tb=tb: ops.matmul(a, b, transpose_a=ta, transpose_b=tb),
           [arr((4, 3) if ta else (3, 4)), arr((2, 4) if tb else (4, 2), seed=1)])
      for ta in (False, True) for tb in (False, True)],
    Case("matmul-batched", ops.matmul, [arr((2, 3, 4)), arr((2, 4, 2), seed=1)]),
    Case("matmul-batched-tt", lambda a, b: ops.matmul(a, b, transpose_a=True, transpose_b=True),
         [arr((2, 4, 3)), arr((2, 2, 4), seed=1)]),
    Case("matmul-batched-by-2d", ops.matmul, [arr((2, 3, 4)), arr((4, 2), seed=1)]),
    # broadcast batch axes (NumPy/TF semantics): the gradient sums the broadcast axes back
    Case("matmul-batched-ta-by-2d", lambda a, b: ops.matmul(a, b, transpose_a=True),
         [arr((2, 3, 4)), arr((3, 2), seed=1)]),
    Case("matmul-broadcast-batch", ops.matmul, [arr((2, 1, 3, 4)), arr((3, 4, 2), seed=1)]),
    Case("matmul-2d-by-batched", ops.matmul, [arr((3, 4)), arr((2, 4, 2), seed=1)]),
    Case("matmul-operator", lambda a, b: a @ b, [arr((3, 4)), arr((4, 2), seed=1)]),
    Case("reshape", lambda x: ops.reshape(x, (4, -1)), [arr((2, 3, 4))]),
    Case("transpose", lambda x: ops.transpose(x, (2, 0, 1)), [arr((2, 3, 4))]),
    Case("transpose-default", ops.transpose, [arr(S)]),
    Case("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), [arr((3, 1))]),
    Case("concat", lambda a, b: ops.concat([a, b, a], axis=1), [arr(S), arr((3, 2), seed=1)]),
    Case("stack", lambda a, b: ops.stack([a, b], axis=1), [arr(S), arr(S, seed=1)]),
    Case("take-axis0", lambda x: ops.take(x, [2, 0, 2, 2]), [arr(S)]),
    Case("take-axis1", lambda x: ops.take(x, [[3, 1], [1, 1]], axis=1), [arr(S)]),
    Case("getitem", lambda x: x[1:, ::2], [arr(S)]),
    Case("getitem-int-none-ellipsis", lambda x: x[None, ..., 2], [arr((2, 3, 4))]),
    Case("getitem-gather", lambda x: x[mp.constant([2, 2, 0], backend=x.backend)], [arr(S)]),
    Case("softmax", ops.softmax, [arr(S)]),
    Case("softmax-axis0", lambda x: ops.softmax(x, axis=0), [arr(S)]),
    Case("softmax-composite", ops.softmax, [arr(S)], composite=True),
    Case("log_softmax", ops.log_softmax, [arr(S)]),
    Case("log_softmax-composite", lambda x: ops.log_softmax(x, axis=0), [arr(S)],
         composite=True),
    Case("sparse_softmax_cross_entropy",
         lambda x: ops.sparse_softmax_cross_entropy([3, 0, 2], x), [arr(S)]),
    Case("sparse_softmax_cross_entropy-composite",
         lambda x: ops.sparse_softmax_cross_entropy([3, 0, 2], x), [arr(S)], composite=True),
    Case("expand_dims", lambda x: ops.expand_dims(x, 1), [arr(S)]),
    Case("squeeze", lambda x: ops.squeeze(x, axis=(0, 2)), [arr((1, 3, 1, 4))]),
]


def weights(shape: tuple[int, ...]) -> np.ndarray:
    """Fixed random output weights, so every output element's gradient counts differently."""
    return np.random.default_rng(123).uniform(0.5, 1.5, shape)


def analytic(case: Case, be: Any, dtype: str) -> list[np.ndarray]:
    ts = [mp.constant(x, dtype=dtype, backend=be) for x in case.inputs]
    y0 = case.fn(*ts)
    w = mp.constant(weights(y0.shape), dtype=y0.dtype, backend=be)
    with mp.GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        loss = ops.sum(ops.multiply(case.fn(*ts), w))
    grads = tape.gradient(loss, ts)
    out = []
    for g, t in zip(grads, ts):
        assert g is not None, f"{case.name}: no gradient"
        assert g.dtype == t.dtype and g.shape == t.shape
        out.append(np.asarray(g).astype(np.float64))
    return out


def numeric(case: Case, be: Any, eps: float = 1e-6) -> list[np.ndarray]:
    def loss(values: list[np.ndarray]) -> float:
        y = case.fn(*[mp.constant(v, dtype="float64", backend=be) for v in values])
        return float(np.sum(np.asarray(y) * weights(y.shape)))

    out = []
    for i, x in enumerate(case.inputs):
        g = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            values = [v.copy() for v in case.inputs]
            values[i][j] = x[j] + eps
            up = loss(values)
            values[i][j] = x[j] - eps
            g[j] = (up - loss(values)) / (2 * eps)
        out.append(g)
    return out


def cpu_for(case: Case) -> Any:
    return NO_FUSED if case.composite else mp.get_backend("cpu")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradient_matches_finite_differences_float64(case: Case) -> None:
    be = cpu_for(case)
    got = analytic(case, be, "float64")
    want = numeric(case, be)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=case.name)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradient_float32_on_every_backend(backend: mp.Backend, case: Case) -> None:
    if case.composite and backend.name != "cpu":
        pytest.skip("composite paths are exercised on the CPU backend")
    want = analytic(case, cpu_for(case), "float64")
    got = analytic(case, backend, "float32")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=case.name)


def test_fused_and_composite_cross_entropy_agree() -> None:
    logits = arr((5, 7), -4, 4)
    labels = [0, 6, 3, 3, 1]
    results = []
    for be in (mp.get_backend("cpu"), NO_FUSED):
        x = mp.constant(logits, backend=be)
        with mp.GradientTape() as tape:
            tape.watch(x)
            loss = ops.mean(ops.sparse_softmax_cross_entropy(labels, x))
        results.append((float(loss), tape.gradient(loss, x).numpy()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-7)


def test_max_gradient_splits_ties() -> None:
    x = mp.constant([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    with mp.GradientTape() as tape:
        tape.watch(x)
        y = ops.sum(ops.max(x, axis=1))
    g = tape.gradient(y, x).numpy()
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)


def test_cast_gradient_comes_back_in_the_source_dtype() -> None:
    x = mp.constant([0.5, 1.5, -2.0], dtype="float64")
    with mp.GradientTape() as tape:
        tape.watch(x)
        y = ops.sum(ops.cast(x, "float32") * mp.constant([1.0, 2.0, 3.0]))
    g = tape.gradient(y, x)
    assert g.dtype == "float64"
    assert g.numpy().tolist() == [1.0, 2.0, 3.0]
    with mp.GradientTape() as tape:
        tape.watch(x)
        y = ops.sum(ops.cast(ops.cast(x, "int32"), "float32"))
    assert tape.gradient(y, x) is None  # through an integer: not differentiable


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_float32_variables_read_in_16_bit_get_float32_gradients(backend: mp.Backend,
                                                                low: str) -> None:
    v = mp.Variable([[1.0, -2.0], [0.5, 3.0]])
    x = mp.constant([[1.0, 2.0]], dtype=low)
    with mp.GradientTape() as tape:
        y = ops.matmul(x, v.read_as(low))
        assert y.dtype == low
        loss = ops.sum(ops.square(y))
    g = tape.gradient(loss, v)
    assert g.dtype == "float32" and g.shape == (2, 2)
    yv = np.asarray([[1.0, 2.0]]) @ np.asarray(v.numpy(), np.float64)
    want = np.asarray([[1.0], [2.0]]) @ (2 * yv)
    np.testing.assert_allclose(np.asarray(g), want, rtol=2e-2)
