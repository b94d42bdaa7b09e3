"""Shapes and indexing: reshape, transpose, broadcast_to, concat, take, getitem ... and their
gradients. (``shapes``, not ``shape``: ``mp.ops.shape`` is the op that reads a shape.)"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from mpcore.core.tape import Node
from mpcore.core.tensor import Tensor
from mpcore.ops.creation import index_tensor, shape_tuple
from mpcore.ops.dispatch import Grads, TensorLike, as_tensor, common, finish, gradient
from mpcore.ops.reduction import normalize_axes, unbroadcast


def shape(x: TensorLike) -> tuple[int, ...]:
    return as_tensor(x).shape


def _resolve_shape(size: int, new: tuple[int, ...], old: tuple[int, ...]) -> tuple[int, ...]:
    unknown = [i for i, d in enumerate(new) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in new):
        raise ValueError(f"reshape: invalid target shape {new}")
    known = 1
    for d in new:
        if d != -1:
            known *= d
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot reshape {old} (size {size}) to {new}")
        new = tuple(size // known if d == -1 else d for d in new)
    elif known != size:
        raise ValueError(f"reshape: cannot reshape {old} (size {size}) to {new}")
    return new


def reshape(x: TensorLike, shape: Any) -> Tensor:
    x = as_tensor(x)
    new = _resolve_shape(x.size, shape_tuple(shape), x.shape)
    if new == x.shape:
        return x
    be = x._backend
    return finish("reshape", (x,), be.kernels()["reshape"](x._data, new), be, x._dtype)


def expand_dims(x: TensorLike, axis: int) -> Tensor:
    x = as_tensor(x)
    ndim = x.ndim + 1
    if not -ndim <= axis < ndim:
        raise ValueError(f"expand_dims: axis {axis} is out of range for rank {x.ndim}")
    axis %= ndim
    s = x.shape
    return reshape(x, (*s[:axis], 1, *s[axis:]))


def squeeze(x: TensorLike, axis: Any = None) -> Tensor:
    x = as_tensor(x)
    ax = normalize_axes(axis, x.ndim, "squeeze")
    s = x.shape
    if ax is None:
        ax = tuple(i for i, d in enumerate(s) if d == 1)
    for i in ax:
        if s[i] != 1:
            raise ValueError(f"squeeze: axis {i} of shape {s} is not 1")
    return reshape(x, tuple(d for i, d in enumerate(s) if i not in ax))


def transpose(x: TensorLike, perm: Sequence[int] | None = None) -> Tensor:
    x = as_tensor(x)
    nd = x.ndim
    p = tuple(range(nd - 1, -1, -1)) if perm is None else tuple(int(i) % builtins.max(nd, 1)
                                                              for i in perm)
    if sorted(p) != list(range(nd)):
        raise ValueError(f"transpose: {perm!r} is not a permutation of the axes of a rank-{nd} "
                         "tensor")
    be = x._backend
    return finish("transpose", (x,), be.kernels()["transpose"](x._data, p), be, x._dtype,
                  {"perm": p})


def broadcast_to(x: TensorLike, shape: Any) -> Tensor:
    x = as_tensor(x)
    target = shape_tuple(shape)
    s = x.shape
    if len(s) > len(target) or any(a not in (1, b) for a, b in zip(s[::-1], target[::-1])):
        raise ValueError(f"broadcast_to: cannot broadcast {s} to {target}")
    if s == target:
        return x
    be = x._backend
    return finish("broadcast_to", (x,), be.kernels()["broadcast_to"](x._data, target), be,
                  x._dtype, {"shape": target})


def concat(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    if not xs:
        raise ValueError("concat needs at least one tensor")
    tensors, be, dt = common("concat", list(xs))
    nd = tensors[0].ndim
    if not -nd <= axis < nd:
        raise ValueError(f"concat: axis {axis} is out of range for rank {nd}")
    axis %= nd
    ref = tensors[0].shape
    for t in tensors[1:]:
        s = t.shape
        if len(s) != nd or s[:axis] + s[axis + 1:] != ref[:axis] + ref[axis + 1:]:
            raise ValueError(f"concat: shapes {ref} and {s} differ outside axis {axis}")
    data = be.kernels()["concat"]([t._data for t in tensors], axis)
    return finish("concat", tuple(tensors), data, be, dt,
                  {"axis": axis, "sizes": tuple(t.shape[axis] for t in tensors)})


def stack(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    tensors = [as_tensor(x) for x in xs]
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    return concat([expand_dims(t, axis) for t in tensors], axis)


def take(x: TensorLike, indices: Any, axis: int = 0) -> Tensor:
    """Gather ``indices`` along ``axis`` (an embedding lookup, a batch selection). Negative
    indices count from the end. An index out of range raises an IndexError: at once on the
    CPU (NumPy's), at the next host read on OpenCL (the device records it). On CUDA its row
    reads NaN (0 for integers) and its gradient is dropped, as a label out of range gives NaN
    there: raising would need a host read at every take."""
    x = as_tensor(x)
    be = x._backend
    idx = index_tensor(indices, be, "take")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"take: axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    data = be.kernels()["take"](x._data, idx._data, axis)
    return finish("take", (x, idx), data, be, x._dtype, {"axis": axis, "shape": x.shape})


def take_grad(g: Tensor, indices: Tensor, axis: int, shape: tuple[int, ...]) -> Tensor:
    """Zeros of ``shape`` with ``g`` added at ``indices`` along ``axis``: take's gradient."""
    be = g._backend
    data = be.kernels()["take_grad"](g._data, indices._data, axis, shape)
    return finish("take_grad", (g, indices), data, be, g._dtype, {"axis": axis})


_BASIC_INDEX = (int, slice, type(None), type(Ellipsis))


def getitem(x: TensorLike, key: Any) -> Tensor:
    """``x[key]`` with basic indexing (ints, slices, None, ...); an integer array or tensor as
    the whole key gathers along the first axis."""
    x = as_tensor(x)
    if isinstance(key, (Tensor, list)) or hasattr(key, "dtype"):
        return take(x, key, 0)
    k = key if isinstance(key, tuple) else (key,)
    for item in k:
        if not isinstance(item, _BASIC_INDEX) or isinstance(item, bool):
            raise TypeError(f"unsupported index {item!r}: use ints, slices, None, ..., or one "
                            "integer array for the first axis (mp.ops.take for other axes)")
    be = x._backend
    data = be.kernels()["getitem"](x._data, k)
    return finish("getitem", (x,), data, be, x._dtype, {"key": k, "shape": x.shape})


def getitem_grad(g: Tensor, key: tuple[Any, ...], shape: tuple[int, ...]) -> Tensor:
    """Zeros of ``shape`` with ``g`` written at ``key``: getitem's gradient."""
    be = g._backend
    data = be.kernels()["getitem_grad"](g._data, key, shape)
    return finish("getitem_grad", (g,), data, be, g._dtype, {"key": key})


# --- gradients ---------------------------------------------------------------------------
@gradient("reshape")
def _reshape(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (reshape(g, node.inputs[0].shape),)


@gradient("transpose")
def _transpose(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (transpose(g, inverse),)


@gradient("broadcast_to")
def _broadcast_to(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (unbroadcast(g, node.inputs[0].shape),)


@gradient("concat")
def _concat(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    axis, sizes = node.attrs["axis"], node.attrs["sizes"]
    out: list[Tensor | None] = []
    start = 0
    lead = (slice(None),) * axis
    for need, size in zip(needs, sizes):
        out.append(getitem(g, (*lead, slice(start, start + size))) if need else None)
        start += size
    return out


@gradient("take")
def _take(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    _, idx = node.inputs
    return (take_grad(g, idx, node.attrs["axis"], node.attrs["shape"]), None)


@gradient("take_grad")
def _take_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    _, idx = node.inputs
    return (take(g, idx, node.attrs["axis"]), None)


@gradient("getitem")
def _getitem(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (getitem_grad(g, node.attrs["key"], node.attrs["shape"]),)


@gradient("getitem_grad")
def _getitem_grad(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (getitem(g, node.attrs["key"]),)
