"""Gradient checks shared by the layer tests: tape gradients of ``sum(f(x) * r)`` against
central finite differences in float64, on the current backend."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import mpcore as mp

RNG = np.random.default_rng(1234)


def numeric_grad(f: Callable[[], float], array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(array)
    flat, gflat = array.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


def check_gradients(fn: Callable[..., mp.Tensor], xs: Sequence[np.ndarray],
                    rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """``fn(*tensors)`` differentiated w.r.t. each float64 input by the tape and by finite
    differences (``fn`` takes tensors and returns one)."""
    xs = [np.array(x, dtype=np.float64) for x in xs]
    r = RNG.standard_normal(fn(*[mp.constant(x) for x in xs]).shape)

    def objective() -> float:
        return float((np.asarray(fn(*[mp.constant(x) for x in xs])) * r).sum())

    ts = [mp.constant(x) for x in xs]
    with mp.GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        loss = mp.ops.sum(fn(*ts) * mp.constant(r))
    grads = tape.gradient(loss, ts)
    for i, (x, g) in enumerate(zip(xs, grads)):
        np.testing.assert_allclose(np.asarray(g), numeric_grad(objective, x), rtol=rtol,
                                   atol=atol, err_msg=f"d/d input {i}")
