"""Reductions (sum, mean, max, min, argmax) and their gradients; ``unbroadcast``, the gradient
of broadcasting, which every broadcasting op's gradient uses."""

from __future__ import annotations

import builtins
from typing import Any

from mpcore import ops as _ops
from mpcore.core.tape import Node
from mpcore.core.tensor import Tensor
from mpcore.ops.dispatch import (
    Grads,
    TensorLike,
    as_tensor,
    cast,
    cast_to,
    compute_dtype,
    finish,
    gradient,
)
from mpcore.ops.elementwise import divide, equal, multiply


def normalize_axes(axis: Any, ndim: int, op: str) -> tuple[int, ...] | None:
    """``axis`` (None, an int or a sequence of ints) as sorted non-negative axes, or None for
    every axis; an axis out of range is a ValueError naming ``op``."""
    if axis is None:
        return None
    items = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in items:
        if not isinstance(a, int) or not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"{op}: axis {axis!r} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def one_axis(axis: Any, ndim: int, op: str) -> int:
    """One axis of a rank-``ndim`` tensor, in range (never wrapped around) and non-negative."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    (ax,) = normalize_axes(axis, ndim, op)  # type: ignore[misc]
    return ax


def _reduce(op: str, x: TensorLike, axis: Any, keepdims: bool, float_only: bool = False) -> Tensor:
    x = as_tensor(x)
    ax = normalize_axes(axis, x.ndim, op)
    be = x._backend
    dt = compute_dtype(op, be, x._dtype, float_only)
    if dt == "bool" and op == "sum":
        dt = "int32"  # counting: a sum of bools is an integer
    x = cast_to(x, dt)
    return finish(op, (x,), be.kernels()[op](x._data, ax, keepdims), be, dt,
                  {"axis": ax, "keepdims": keepdims})


def sum(x: TensorLike, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (all axes by default); 16-bit inputs are summed in float32."""
    return _reduce("sum", x, axis, keepdims)


def mean(x: TensorLike, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``; 16-bit inputs are averaged in float32."""
    return _reduce("mean", x, axis, keepdims, float_only=True)


def max(x: TensorLike, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("max", x, axis, keepdims)


def min(x: TensorLike, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("min", x, axis, keepdims)


def argmax(x: TensorLike, axis: int = -1) -> Tensor:
    """Index of the largest value along ``axis`` (int64; not differentiable)."""
    x = as_tensor(x)
    (ax,) = normalize_axes(axis, x.ndim, "argmax") or (0,)
    return Tensor(x._backend.kernels()["argmax"](x._data, ax), x._backend, "int64")


def unbroadcast(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum ``g`` down to ``shape``: the gradient of broadcasting."""
    gs = g.shape
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape)
                                      if d == 1 and gs[i + lead] != 1)
    out = sum(g, axis=axes) if axes else g
    return _ops.shapes.reshape(out, shape)


# --- gradients ---------------------------------------------------------------------------
def _kept_shape(shape: tuple[int, ...], axis: tuple[int, ...] | None) -> tuple[int, ...]:
    if axis is None:
        return (1,) * len(shape)
    return tuple(1 if i in axis else d for i, d in enumerate(shape))


def _expand_reduced(g: Tensor, node: Node) -> Tensor:
    x = node.inputs[0]
    axis, keepdims = node.attrs["axis"], node.attrs["keepdims"]
    if not keepdims:
        g = _ops.shapes.reshape(g, _kept_shape(x.shape, axis))
    return _ops.shapes.broadcast_to(g, x.shape)


@gradient("sum")
def _sum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (_expand_reduced(g, node),)


@gradient("mean")
def _mean(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    axis = node.attrs["axis"]
    count = x.size if axis is None else _prod(x.shape[i] for i in axis)
    return (divide(_expand_reduced(g, node), float(count)),)


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= v
    return out


@gradient("max", "min")
def _max(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    axis = node.attrs["axis"]
    y = node.output
    if not node.attrs["keepdims"]:
        y = _ops.shapes.reshape(y, _kept_shape(x.shape, axis))
    hit = cast(equal(x, y), g.dtype)
    ties = sum(hit, axis=axis, keepdims=True)  # split the gradient among equal maxima
    return (divide(multiply(_expand_reduced(g, node), hit), ties),)
