"""Normalization ops: ``batch_norm``, the training-mode batch normalization over every axis
but the last (BatchNormalization's forward pass and its batch statistics), and ``layer_norm``,
the normalization of each row over the last axis (LayerNormalization's), with their gradients.

A *deny* op: statistics and arithmetic in float32 (float64 stays float64); a 16-bit input goes
to the fused kernels as it is (they convert as they read, and round the output once to the
input's dtype: no separate conversion passes), and the result has the input's dtype (other
inputs: float32). Where the backend has the fused ``batch_norm`` and ``batch_norm_grad``
kernels, the forward pass is one kernel (statistics and normalization in a few passes over
the input) and the backward pass another, with the closed form of the gradient

    dx = gamma * inv_std * (dy - mean(dy) - x_hat * mean(dy * x_hat))

instead of autodiff through a dozen composite ops; elsewhere, and under a recording outer
tape (a gradient of a gradient), it is composed of recorded ops. ``layer_norm`` is the same
with the statistics of each row: ``layer_norm`` and ``layer_norm_grad`` kernels, and

    dx = inv_std * (dy*gamma - mean_row(dy*gamma) - x_hat * mean_row(dy*gamma * x_hat))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.core import dtypes as _dtypes
from mpcore.core.tape import Node, recording
from mpcore.core.tensor import Tensor
from mpcore.ops.creation import stop_gradient
from mpcore.ops.dispatch import Grads, TensorLike, as_tensor, cast_to, finish, gradient
from mpcore.ops.elementwise import add, multiply, rsqrt, square, subtract
from mpcore.ops.reduction import mean, sum  # noqa: A004 - the ops' names
from mpcore.ops.shapes import reshape

_LOW = _dtypes.LOW_PRECISION


def _stat_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def batch_norm(x: TensorLike, gamma: TensorLike | None, beta: TensorLike | None,
               epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, variance)``: ``y = (x - mean) / sqrt(variance + epsilon) * gamma + beta``
    with the batch's mean and biased variance over every axis but the last (shape (C,));
    ``gamma``/``beta`` (C,) or None. The statistics are constants to autodiff (the moving
    averages are state); ``y`` differentiates with respect to ``x``, ``gamma`` and ``beta``."""
    x, dt = _input(x)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected an input of rank >= 2 (channels last), got "
                         f"shape {x.shape}")
    g, b = _params("batch_norm", x, dt, gamma, beta,
                   f"the {x.shape[-1]} channels of {x.shape}")
    be = x._backend
    kernel = be.kernels().get("batch_norm")
    if kernel is None or be.kernels().get("batch_norm_grad") is None:
        y, mu, var = _composite(cast_to(x, dt), g, b, epsilon)
        return cast_to(y, x._dtype), mu, var
    y, mu, var, inv = kernel(x._data, None if g is None else g._data,
                             None if b is None else b._data, float(epsilon))
    inputs = tuple(t for t in (x, g, b) if t is not None)
    out = finish("batch_norm", inputs, y, be, x._dtype,
                 {"epsilon": float(epsilon), "gamma": g is not None, "beta": b is not None},
                 (mu, inv))
    return out, Tensor(mu, be, dt), Tensor(var, be, dt)


def _input(x: TensorLike) -> tuple[Tensor, str]:
    """The input as the kernels take it (16-bit as it is, anything else in the statistics'
    dtype) and that dtype (float32, or float64)."""
    x = as_tensor(x)
    dt = _stat_dtype(x.dtype)
    return (x if x.dtype in _LOW else cast_to(x, dt)), dt


def _composite(x: Tensor, g: Tensor | None, b: Tensor | None,
               epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    axes = tuple(range(x.ndim - 1))
    mu = mean(x, axes, keepdims=True)
    centered = subtract(x, mu)
    var = mean(square(centered), axes, keepdims=True)
    y = multiply(centered, rsqrt(add(var, epsilon)))
    if g is not None:
        y = multiply(y, g)
    if b is not None:
        y = add(y, b)
    channels = (x.shape[-1],)
    return y, stop_gradient(reshape(mu, channels)), stop_gradient(reshape(var, channels))


def _composite_gradient(x: Tensor, g: Tensor | None, dy: Tensor,
                        epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """The closed-form gradient in recorded ops, the statistics recomputed from ``x`` so
    that they are functions of it too (for gradients of gradients)."""
    axes = tuple(range(x.ndim - 1))
    n = float(x.size // x.shape[-1])
    centered = subtract(x, mean(x, axes, keepdims=True))
    inv = rsqrt(add(mean(square(centered), axes, keepdims=True), epsilon))
    x_hat = multiply(centered, inv)
    dbeta = sum(dy, axes)
    dgamma = sum(multiply(dy, x_hat), axes)
    scale = inv if g is None else multiply(inv, g)
    inner = subtract(subtract(dy, multiply(dbeta, 1.0 / n)), multiply(x_hat,
                                                                      multiply(dgamma, 1.0 / n)))
    return multiply(inner, scale), dgamma, dbeta


def _params(op: str, x: Tensor, dt: str, gamma: TensorLike | None, beta: TensorLike | None,
            axis: str) -> tuple[Tensor | None, Tensor | None]:
    """``gamma`` and ``beta`` (or None) in the statistics' dtype, each the size of the last
    axis of ``x`` (``axis`` says what that axis is, for the error)."""
    out = []
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            p = cast_to(as_tensor(p, x.backend), dt)
            if p.shape != (x.shape[-1],):
                raise ValueError(f"{op}: {name} of shape {p.shape} does not match {axis}")
        out.append(p)
    return out[0], out[1]


def layer_norm(x: TensorLike, gamma: TensorLike | None, beta: TensorLike | None,
               epsilon: float) -> Tensor:
    """``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` with each row's mean and
    biased variance over the last axis; ``gamma``/``beta`` of the last axis's size, or None.
    Computed in float32 (float64 stays float64)."""
    x, dt = _input(x)
    if x.ndim < 1:
        raise ValueError("layer_norm: expected an input of rank >= 1, got a scalar")
    g, b = _params("layer_norm", x, dt, gamma, beta, f"the last axis of {x.shape}")
    be = x._backend
    kernel = be.kernels().get("layer_norm")
    if kernel is None or be.kernels().get("layer_norm_grad") is None:
        return cast_to(_composite_layer_norm(cast_to(x, dt), g, b, epsilon), x._dtype)
    y, mu, inv = kernel(x._data, None if g is None else g._data,
                        None if b is None else b._data, float(epsilon))
    inputs = tuple(t for t in (x, g, b) if t is not None)
    return finish("layer_norm", inputs, y, be, x._dtype,
                  {"epsilon": float(epsilon), "gamma": g is not None, "beta": b is not None},
                  (mu, inv))


def _composite_layer_norm(x: Tensor, g: Tensor | None, b: Tensor | None,
                          epsilon: float) -> Tensor:
    axis = x.ndim - 1
    centered = subtract(x, mean(x, axis, keepdims=True))
    y = multiply(centered, rsqrt(add(mean(square(centered), axis, keepdims=True), epsilon)))
    if g is not None:
        y = multiply(y, g)
    return y if b is None else add(y, b)


def _composite_layer_norm_gradient(x: Tensor, g: Tensor | None, dy: Tensor,
                                   epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    axis = x.ndim - 1
    rows = tuple(range(x.ndim - 1))
    centered = subtract(x, mean(x, axis, keepdims=True))
    inv = rsqrt(add(mean(square(centered), axis, keepdims=True), epsilon))
    x_hat = multiply(centered, inv)
    dyg = dy if g is None else multiply(dy, g)
    inner = subtract(subtract(dyg, mean(dyg, axis, keepdims=True)),
                     multiply(x_hat, mean(multiply(dyg, x_hat), axis, keepdims=True)))
    return multiply(inner, inv), sum(multiply(dy, x_hat), rows), sum(dy, rows)


def _norm_gradient(kind: str, composite: Callable[[Tensor, Tensor | None, Tensor, float],
                                                  tuple[Tensor, Tensor, Tensor]]) -> Any:
    """The gradient of ``kind`` (batch_norm, layer_norm): its ``<kind>_grad`` kernel from the
    saved statistics, or, under a recording outer tape, ``composite`` in recorded ops; dx in
    the input's dtype, dgamma and dbeta in the statistics', each where the op took one."""
    def grad(node: Node, dy: Tensor, needs: tuple[bool, ...]) -> Grads:
        x = node.inputs[0]
        g = node.inputs[1] if node.attrs["gamma"] else None
        be = x.backend
        dy = cast_to(dy, x.dtype)
        sdt = _stat_dtype(x.dtype)
        if recording():   # an outer tape records this backward pass: differentiable ops
            dx, dgamma, dbeta = composite(cast_to(x, sdt), g, cast_to(dy, sdt),
                                          node.attrs["epsilon"])
            dx = cast_to(dx, x.dtype)
        else:
            mu, inv = node.saved
            data = be.kernels()[f"{kind}_grad"](dy._data, x._data, mu, inv,
                                                None if g is None else g._data)
            dx, dgamma, dbeta = (Tensor(data[0], be, x.dtype), Tensor(data[1], be, sdt),
                                 Tensor(data[2], be, sdt))
        return (dx, *([dgamma] if node.attrs["gamma"] else []),
                *([dbeta] if node.attrs["beta"] else []))

    return grad


gradient("batch_norm")(_norm_gradient("batch_norm", _composite_gradient))
gradient("layer_norm")(_norm_gradient("layer_norm", _composite_layer_norm_gradient))
