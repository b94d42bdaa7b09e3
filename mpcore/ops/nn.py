"""Neural-network ops: bias_add, softmax, log_softmax, sparse cross-entropy, relu's backward
pass (with the bias gradient fused in), dropout; and their gradients.

Each uses the backend's fused kernel when it has one (``OPTIONAL_KERNELS`` in
:mod:`mpcore.core.backend`) and is built from primitive ops otherwise. Softmax and cross-entropy are
*deny* ops: they compute in float32 whatever their inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.core import dtypes as _dt
from mpcore.core import random as _random
from mpcore.core.tape import Node, recording
from mpcore.core.tensor import Tensor
from mpcore.core.trace_seeds import given_seed
from mpcore.ops.creation import (
    index_tensor,
    one_hot,
    ones,
    random_uniform,
    resolve_backend,
    shape_tuple,
    stop_gradient,
)
from mpcore.ops.dispatch import (
    Grads,
    TensorLike,
    as_tensor,
    cast,
    cast_to,
    common,
    compute_dtype,
    finish,
    gradient,
    unrecorded,
)
from mpcore.ops.elementwise import (
    add,
    divide,
    exp,
    greater,
    greater_equal,
    log,
    multiply,
    negative,
    subtract,
)
from mpcore.ops.linalg import matmul
from mpcore.ops.reduction import max, one_axis, sum  # noqa: A004 - the ops' names
from mpcore.ops.shapes import expand_dims, reshape


def bias_add(x: TensorLike, bias: TensorLike) -> Tensor:
    """``x + bias`` over the last axis (a fused kernel where the backend has one)."""
    (x, bias), be, dt = common("bias_add", [x, bias])
    if bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias_add: bias of shape {bias.shape} does not match the last axis "
                         f"of {x.shape}")
    kernel = be.kernels().get("bias_add")
    if kernel is None:
        return add(x, bias)
    return finish("bias_add", (x, bias), kernel(x._data, bias._data), be, dt)


def _float32_input(op: str, x: TensorLike) -> Tensor:
    x = as_tensor(x)
    return cast_to(x, compute_dtype(op, x._backend, x._dtype, True))


def _along_axis(op: str, x: TensorLike, axis: int,
                composite: Callable[[Tensor, int], Tensor]) -> Tensor:
    """``op`` along one axis in float32: the backend's fused kernel, else ``composite``."""
    x = _float32_input(op, x)
    be = x._backend
    axis = one_axis(axis, x.ndim, op)
    kernel = be.kernels().get(op)
    if kernel is None:
        return composite(x, axis)
    return finish(op, (x,), kernel(x._data, axis), be, x._dtype, {"axis": axis})


def _shifted(x: Tensor, axis: int) -> Tensor:
    """``x`` minus its maximum along ``axis`` (a constant to autodiff): exp cannot overflow."""
    return subtract(x, stop_gradient(max(x, axis, keepdims=True)))


def _composite_softmax(x: Tensor, axis: int) -> Tensor:
    e = exp(_shifted(x, axis))
    return divide(e, sum(e, axis, keepdims=True))


def _composite_log_softmax(x: Tensor, axis: int) -> Tensor:
    shifted = _shifted(x, axis)
    return subtract(shifted, log(sum(exp(shifted), axis, keepdims=True)))


def softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """Softmax along ``axis``, computed in float32 (a *deny* op)."""
    return _along_axis("softmax", x, axis, _composite_softmax)


def log_softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """Log of softmax along ``axis``, computed in float32 without overflow."""
    return _along_axis("log_softmax", x, axis, _composite_log_softmax)


def sparse_softmax_cross_entropy(labels: Any, logits: TensorLike) -> Tensor:
    """Per-example ``-log(softmax(logits)[label])`` for integer ``labels`` of shape (N,) and
    ``logits`` of shape (N, C), fused where the backend has the kernel; float32."""
    logits = as_tensor(logits)
    be = logits._backend
    lab = index_tensor(labels, be, "sparse_softmax_cross_entropy")
    if logits.ndim != 2 or lab.shape != logits.shape[:1]:
        raise ValueError("sparse_softmax_cross_entropy: expected logits (N, C) and labels (N,), "
                         f"got {logits.shape} and {lab.shape}")
    logits = _float32_input("sparse_softmax_cross_entropy", logits)
    kernel = be.kernels().get("sparse_softmax_cross_entropy")
    if kernel is not None:
        loss, probs = kernel(logits._data, lab._data)
        return finish("sparse_softmax_cross_entropy", (logits, lab), loss, be, logits._dtype,
                      None, probs)
    picked = multiply(log_softmax(logits), one_hot(lab, logits.shape[1], logits._dtype))
    return negative(sum(picked, axis=1))


def relu_grad(g: Tensor, y: Tensor) -> Tensor:
    """``g`` where ``y > 0``, else 0: relu's backward pass (fused where available)."""
    be = g._backend
    kernel = be.kernels().get("relu_grad")
    if kernel is not None:
        return finish("relu_grad", (g, y), kernel(g._data, y._data), be, g._dtype)
    return multiply(g, cast(greater(y, 0), g._dtype))


def bias_grad(g: Tensor) -> Tensor:
    """The gradient of a bias added over the last axis: ``g`` summed over every other axis, as
    the GEMV ``ones @ g``, so a 16-bit ``g`` accumulates in float32 like the GEMMs (and a
    backend that keeps the float32 copy of a 16-bit GEMM operand does not convert it again)."""
    g2 = reshape(g, (-1, g.shape[-1])) if g.ndim > 2 else g
    return reshape(matmul(ones((1, g2.shape[0]), g2._dtype, g2._backend), g2), (g2.shape[-1],))


def relu_grad_bias(g: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``relu_grad(g, y)`` and its :func:`bias_grad`: the backward pass through a dense
    layer's relu and bias, in one pass over ``g`` where the backend fuses them (the bias
    gradient is summed while each block of the result is in cache). Under a recording tape (a
    gradient of a gradient) it is composed of recorded ops instead."""
    be = g._backend
    kernel = be.kernels().get("relu_grad_bias")
    if kernel is None or recording() or g.ndim < 2:
        dz = relu_grad(g, y)
        return dz, bias_grad(dz)
    dz, db = kernel(g._data, y._data)
    return Tensor(dz, be, g._dtype), Tensor(db, be, g._dtype)


def dropout_mask(shape: Any, rate: float, dtype: Any = "float32", seed: int | None = None,
                 backend: Any = None) -> Tensor:
    """0 with probability ``rate``, else ``1/(1-rate)`` (inverted dropout)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate!r}")
    be = resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else given_seed(seed)
    kernel = be.kernels().get("dropout_mask")
    if kernel is not None:
        return Tensor(kernel(shape_tuple(shape), float(rate), dt, s), be, dt)
    keep = greater_equal(random_uniform(shape, dtype="float32", seed=s, backend=be), rate)
    return cast(multiply(cast(keep, "float32"), 1.0 / (1.0 - rate)), dt)


def dropout(x: TensorLike, rate: float, seed: int | None = None) -> Tensor:
    x = as_tensor(x)
    if rate == 0.0:
        return x
    return multiply(x, dropout_mask(x.shape, rate, x.dtype, seed, x.backend))


# --- gradients ---------------------------------------------------------------------------
@gradient("bias_add")
def _bias_add(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x, _ = node.inputs
    return (g if needs[0] else None,
            sum(g, axis=tuple(range(x.ndim - 1))) if needs[1] else None)


@gradient("relu_grad")
def _relu_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (relu_grad(g, node.inputs[1]) if needs[0] else None, None)


@gradient("softmax")
def _softmax(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y, axis = node.output, node.attrs["axis"]
    inner = sum(multiply(g, y), axis=axis, keepdims=True)
    return (multiply(y, subtract(g, inner)),)


@gradient("log_softmax")
def _log_softmax(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y, axis = node.output, node.attrs["axis"]
    return (subtract(g, multiply(exp(y), sum(g, axis=axis, keepdims=True))),)


@gradient("sparse_softmax_cross_entropy")
def _sparse_xent(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    logits, labels = node.inputs
    be = logits.backend
    fused = be.kernels().get("sparse_softmax_cross_entropy_grad")
    if fused is not None and not recording():  # recording tapes need the composite ops
        data = fused(node.saved, labels._data, g._data)
        probs = Tensor(node.saved, be, logits.dtype)
        return (unrecorded("sparse_softmax_cross_entropy_grad", (probs, g), data, be,
                           logits.dtype), None)
    probs = Tensor(node.saved, be, logits.dtype)
    delta = subtract(probs, one_hot(labels, logits.shape[1], logits.dtype))
    return (multiply(delta, expand_dims(g, 1)), None)
