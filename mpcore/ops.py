"""Ops: device-agnostic functions on tensors (``mp.ops.matmul``, ``mp.ops.softmax`` ...).

Each op (1) finds the backend of its tensor inputs, (2) picks the compute dtype from the op's
mixed precision category (:mod:`mpcore.categories`) and casts its inputs to it, recording the
casts so gradients flow back through them, (3) calls the backend's kernel, and (4) tells active
GradientTapes. Composite ops (softmax, cross-entropy, dropout ...) use a backend's fused kernel
when it has one and are built from primitive ops otherwise.

This is the hot path of every training step: keep it free of per-call allocations that are not
needed, and of host reads.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

from mpcore import dtypes as _dt
from mpcore import random as _random
from mpcore import registry
from mpcore import tape as _tape
from mpcore.categories import Category
from mpcore.tensor import Tensor

_state = _tape._state
_record = _tape.record
_SCALARS = (int, float, bool)
_LOW = _dt.LOW_PRECISION
_FLOATS = _dt.FLOATING_SET
_DENY = Category.DENY

TensorLike = Any  # a Tensor, a Python number or nested list, or a host/native array


# --- creation ---------------------------------------------------------------------------
def _infer_dtype(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return _dt.canonical(dtype)
    kinds: set[type] = set()

    def scan(v: Any) -> None:
        if isinstance(v, (list, tuple)):
            for item in v:
                scan(item)
        else:
            kinds.add(type(v))

    scan(value)
    if any(issubclass(k, float) for k in kinds):
        return "float32"
    if kinds and all(issubclass(k, bool) for k in kinds):
        return "bool"
    if all(issubclass(k, int) for k in kinds):
        return "int32"
    raise TypeError(f"cannot make a tensor from {type(value).__name__} {value!r}; expected "
                    "numbers, nested lists of numbers, arrays or tensors")


def _resolve_backend(backend: Any) -> Any:
    if backend is None:
        return registry.get_backend()
    if isinstance(backend, str):
        return registry.get_backend(backend)
    return backend


def constant(value: TensorLike, dtype: Any = None, backend: Any = None) -> Tensor:
    """A tensor holding ``value`` on ``backend`` (default: the current backend). Python floats
    become float32 and ints int32 (as in TF); arrays keep their dtype unless ``dtype`` is
    given."""
    if isinstance(value, Tensor):
        be = value._backend if backend is None else _resolve_backend(backend)
        dt = value._dtype if dtype is None else _dt.canonical(dtype)
        if be is value._backend:
            if dt == value._dtype:
                if type(value) is Tensor:  # immutable: nothing to copy
                    return value
                # a Variable (or a recorded read of one) is updated in place: snapshot it, as
                # tf.constant(variable) does, or the "constant" would change with training
                return Tensor(be.kernels()["copy"](value._data), be, dt)
            return Tensor(be.kernels()["cast"](value._data, dt), be, dt)
        return Tensor(be.kernels()["asarray"](value.numpy(), dt), be, dt)
    be = _resolve_backend(backend)
    dt = _infer_dtype(value) if dtype is None else _dt.canonical(dtype)
    return Tensor(be.kernels()["asarray"](value, dt), be, dt)


convert_to_tensor = constant


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"a shape is an int or a sequence of ints, got {shape!r}") from None


def full(shape: Any, value: float, dtype: Any = "float32", backend: Any = None) -> Tensor:
    be = _resolve_backend(backend)
    dt = _dt.canonical(dtype)
    return Tensor(be.kernels()["full"](_shape_tuple(shape), value, dt), be, dt)


def zeros(shape: Any, dtype: Any = "float32", backend: Any = None) -> Tensor:
    return full(shape, 0, dtype, backend)


def ones(shape: Any, dtype: Any = "float32", backend: Any = None) -> Tensor:
    return full(shape, 1, dtype, backend)


def zeros_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 0, dtype or x.dtype, x.backend)


def ones_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 1, dtype or x.dtype, x.backend)


def stop_gradient(x: TensorLike) -> Tensor:
    """The same value, invisible to GradientTape."""
    x = _as_tensor(x)
    return Tensor(x._data, x._backend, x._dtype)


# --- helpers ----------------------------------------------------------------------------
def _as_tensor(x: Any, backend: Any = None) -> Tensor:
    return x if isinstance(x, Tensor) else constant(x, backend=backend)


def _mismatch(op: str, a: Tensor, b: Tensor) -> None:
    raise ValueError(f"{op}: operands live on different backends ({a.backend.name!r} and "
                     f"{b.backend.name!r}); move one with mp.constant(x, backend=...)")


def _finish(op: str, inputs: tuple[Any, ...], data: Any, be: Any, dtype: str,
            attrs: dict[str, Any] | None = None, saved: Any = None) -> Tensor:
    out = Tensor(data, be, dtype)
    if _state.tapes:
        _record(op, inputs, out, attrs, saved)
    return out


def _cast_to(x: Tensor, dtype: str) -> Tensor:
    return x if x._dtype == dtype else cast(x, dtype)


def _unary_dtype(op: str, be: Any, dtype: str, float_only: bool) -> str:
    if float_only and dtype not in _FLOATS:
        dtype = "float32"
    if dtype in _LOW and be._categories[op] is _DENY:
        dtype = "float32"
    return dtype


def _common(op: str, xs: Sequence[Any], float_only: bool = False) -> tuple[list[Tensor], Any, str]:
    """Tensors of ``xs`` on one backend, cast to the op's compute dtype."""
    be = None
    for x in xs:
        if isinstance(x, Tensor):
            be = x._backend
            break
    tensors = [x if isinstance(x, Tensor) else constant(x, backend=be) for x in xs]
    be = tensors[0]._backend
    for t in tensors[1:]:
        if t._backend is not be:
            _mismatch(op, tensors[0], t)
    dt = _dt.promote_all([t._dtype for t in tensors])
    dt = _unary_dtype(op, be, dt, float_only)
    return [_cast_to(t, dt) for t in tensors], be, dt


# --- elementwise ------------------------------------------------------------------------
def _make_binary(op: str, result: str | None = None, float_only: bool = False) -> Any:
    def binary(a: TensorLike, b: TensorLike) -> Tensor:
        ta = isinstance(a, Tensor)
        tb = isinstance(b, Tensor)
        if ta:
            be = a._backend
            dt = a._dtype
            if tb:
                if b._backend is not be:
                    _mismatch(op, a, b)
                if b._dtype != dt:
                    dt = _dt.promote(dt, b._dtype)
            elif type(b) in _SCALARS:
                if type(b) is float and dt not in _FLOATS:
                    dt = "float32"
            else:
                return binary(a, constant(b, backend=be))
        elif tb:
            be = b._backend
            dt = b._dtype
            if type(a) in _SCALARS:
                if type(a) is float and dt not in _FLOATS:
                    dt = "float32"
            else:
                return binary(constant(a, backend=be), b)
        else:
            return binary(constant(a), b)
        if float_only and dt not in _FLOATS:
            dt = "float32"
        if dt in _LOW and be._categories[op] is _DENY:
            dt = "float32"
        if ta and a._dtype != dt:
            a = cast(a, dt)
        if tb and b._dtype != dt:
            b = cast(b, dt)
        data = be._kernel_table[op](a._data if ta else a, b._data if tb else b)
        out = Tensor(data, be, result or dt)
        if _state.tapes and result is None:
            _record(op, (a, b), out, None, None)
        return out

    binary.__name__ = binary.__qualname__ = op
    binary.__doc__ = f"Elementwise {op} with broadcasting ({op!r} in the category table)."
    return binary


def _make_unary(op: str, result: str | None = None, float_only: bool = False) -> Any:
    def unary(x: TensorLike) -> Tensor:
        if not isinstance(x, Tensor):
            x = constant(x)
        be = x._backend
        dt = x._dtype
        if (float_only and dt not in _FLOATS) or (dt in _LOW and be._categories[op] is _DENY):
            dt = _unary_dtype(op, be, dt, float_only)
            x = cast(x, dt)
        out = Tensor(be._kernel_table[op](x._data), be, result or dt)
        if _state.tapes and result is None:
            _record(op, (x,), out, None, None)
        return out

    unary.__name__ = unary.__qualname__ = op
    unary.__doc__ = f"Elementwise {op} ({op!r} in the category table)."
    return unary


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide", float_only=True)
power = _make_binary("power", float_only=True)
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
equal = _make_binary("equal", result="bool")
not_equal = _make_binary("not_equal", result="bool")
less = _make_binary("less", result="bool")
less_equal = _make_binary("less_equal", result="bool")
greater = _make_binary("greater", result="bool")
greater_equal = _make_binary("greater_equal", result="bool")
logical_and = _make_binary("logical_and", result="bool")
logical_or = _make_binary("logical_or", result="bool")

negative = _make_unary("negative")
abs = _make_unary("abs")  # noqa: A001 - the op's name
sign = _make_unary("sign")
exp = _make_unary("exp", float_only=True)
log = _make_unary("log", float_only=True)
sqrt = _make_unary("sqrt", float_only=True)
square = _make_unary("square")
relu = _make_unary("relu")
sigmoid = _make_unary("sigmoid", float_only=True)
tanh = _make_unary("tanh", float_only=True)
erf = _make_unary("erf", float_only=True)
logical_not = _make_unary("logical_not", result="bool")
isfinite = _make_unary("isfinite", result="bool")


def reciprocal(x: TensorLike) -> Tensor:
    return divide(1.0, x)


def rsqrt(x: TensorLike) -> Tensor:
    return divide(1.0, sqrt(x))


def gelu(x: TensorLike, approximate: bool = False) -> Tensor:
    """Gaussian error linear unit (exact by default, tanh approximation on request)."""
    x = _as_tensor(x)
    if approximate:
        inner = multiply(add(x, multiply(power(x, 3.0), 0.044715)), math.sqrt(2.0 / math.pi))
        return cast(multiply(multiply(x, 0.5), add(tanh(inner), 1.0)), x.dtype)
    return cast(multiply(multiply(x, 0.5), add(erf(multiply(x, 1.0 / math.sqrt(2.0))), 1.0)),
                x.dtype)


def clip_by_value(x: TensorLike, clip_min: Any, clip_max: Any) -> Tensor:
    return minimum(maximum(x, clip_min), clip_max)


def where(condition: TensorLike, x: TensorLike, y: TensorLike) -> Tensor:
    """``x`` where ``condition`` holds, else ``y`` (broadcasting)."""
    (xt, yt), be, dt = _common("where", [x, y])
    cond = _as_tensor(condition, be)
    if cond._dtype != "bool":
        raise TypeError(f"where: condition must be a bool tensor, got {cond._dtype}")
    return _finish("where", (cond, xt, yt), be._kernel_table["where"](cond._data, xt._data,
                                                                       yt._data), be, dt)


def cast(x: TensorLike, dtype: Any) -> Tensor:
    """``x`` in ``dtype``; differentiable between floating dtypes."""
    x = _as_tensor(x)
    dt = _dt.canonical(dtype) if type(dtype) is not str or dtype not in _dt.ALL else dtype
    if dt == x._dtype:
        return x
    be = x._backend
    return _finish("cast", (x,), be._kernel_table["cast"](x._data, dt), be, dt)


# --- reductions -------------------------------------------------------------------------
def _axes(axis: Any, ndim: int, op: str) -> tuple[int, ...] | None:
    if axis is None:
        return None
    items = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in items:
        if not isinstance(a, int) or not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"{op}: axis {axis!r} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def _one_axis(axis: Any, ndim: int, op: str) -> int:
    """One axis of a rank-``ndim`` tensor, in range (never wrapped around) and non-negative."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    (ax,) = _axes(axis, ndim, op)  # type: ignore[misc]
    return ax


def _reduce(op: str, x: TensorLike, axis: Any, keepdims: bool, float_only: bool = False) -> Tensor:
    x = _as_tensor(x)
    ax = _axes(axis, x.ndim, op)
    be = x._backend
    dt = _unary_dtype(op, be, x._dtype, float_only)
    if dt == "bool" and op == "sum":
        dt = "int32"  # counting: a sum of bools is an integer
    x = _cast_to(x, dt)
    return _finish(op, (x,), be._kernel_table[op](x._data, ax, keepdims), be, dt,
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
    x = _as_tensor(x)
    (ax,) = _axes(axis, x.ndim, "argmax") or (0,)
    return Tensor(x._backend._kernel_table["argmax"](x._data, ax), x._backend, "int64")


# --- matmul -----------------------------------------------------------------------------
def matmul(a: TensorLike, b: TensorLike, transpose_a: bool = False,
           transpose_b: bool = False) -> Tensor:
    """Matrix product over the last two axes (an *allow* op: 16-bit operands are multiplied
    with float32 accumulation). ``transpose_a``/``transpose_b`` transpose an operand's last two
    axes without a copy. A batched ``a`` times a 2-D ``b`` is one 2-D GEMM."""
    (a, b), be, dt = _common("matmul", [a, b])
    sa, sb = a.shape, b.shape
    if len(sa) < 2 or len(sb) < 2:
        raise ValueError(f"matmul needs operands of rank >= 2, got shapes {sa} and {sb}")
    ka = sa[-2] if transpose_a else sa[-1]
    kb = sb[-1] if transpose_b else sb[-2]
    if ka != kb:
        raise ValueError(f"matmul: inner dimensions differ: {sa}{'^T' if transpose_a else ''} "
                         f"@ {sb}{'^T' if transpose_b else ''} ({ka} != {kb})")
    if len(sa) > 2 and len(sb) == 2 and not transpose_a:
        flat = reshape(a, (-1, sa[-1]))
        out = matmul(flat, b, False, transpose_b)
        return reshape(out, (*sa[:-1], out.shape[-1]))
    if sa[:-2] != sb[:-2]:
        # batch axes broadcast as NumPy's (and TF's) matmul; the kernels see equal batch shapes
        # and broadcast_to's gradient sums the broadcast axes back
        batch = _broadcast_batch(sa[:-2], sb[:-2])
        if batch is None:
            raise ValueError(f"matmul: the batch dimensions of {sa} and {sb} do not broadcast "
                             "(each batch axis must be equal or 1)")
        a = broadcast_to(a, (*batch, *sa[-2:]))
        b = broadcast_to(b, (*batch, *sb[-2:]))
    data = be._kernel_table["matmul"](a._data, b._data, transpose_a, transpose_b)
    return _finish("matmul", (a, b), data, be, dt,
                   {"transpose_a": transpose_a, "transpose_b": transpose_b})


def _broadcast_batch(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two batch shapes (right-aligned; each axis equal or 1), or None."""
    n = builtins.max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    if any(x != y and 1 not in (x, y) for x, y in zip(pa, pb)):
        return None
    return tuple(builtins.max(x, y) if 0 not in (x, y) else 0 for x, y in zip(pa, pb))


def bias_add(x: TensorLike, bias: TensorLike) -> Tensor:
    """``x + bias`` over the last axis (a fused kernel where the backend has one)."""
    (x, bias), be, dt = _common("bias_add", [x, bias])
    if bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias_add: bias of shape {bias.shape} does not match the last axis "
                         f"of {x.shape}")
    kernel = be._kernel_table.get("bias_add")
    if kernel is None:
        return add(x, bias)
    return _finish("bias_add", (x, bias), kernel(x._data, bias._data), be, dt)


#: The activations ``dense`` fuses (others run as their own op after it).
DENSE_ACTIVATIONS = (None, "relu")


def dense(x: TensorLike, kernel: TensorLike, bias: TensorLike | None = None,
          activation: str | None = None) -> Tensor:
    """``activation(x @ kernel + bias)`` over the last axis of ``x``: the Dense layer's
    forward pass as one op (an *allow* op, like matmul). A backend's fused ``dense`` kernel
    adds the bias and applies the activation to the float32 GEMM result, so a 16-bit result is
    rounded once instead of after each step; without one it is matmul, bias_add and relu.
    ``activation`` is None or ``"relu"``."""
    if activation not in DENSE_ACTIVATIONS:
        raise ValueError(f"dense: activation must be one of {DENSE_ACTIVATIONS}, got "
                         f"{activation!r}")
    tensors, be, dt = _common("dense", [x, kernel] if bias is None else [x, kernel, bias])
    x, w = tensors[0], tensors[1]
    b = tensors[2] if bias is not None else None
    if x.ndim < 2 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"dense: inputs of shape {x.shape} (rank >= 2) do not match a kernel "
                         f"of shape {w.shape} (in, out)")
    if b is not None and b.shape != w.shape[1:]:
        raise ValueError(f"dense: bias of shape {b.shape} does not match a kernel of shape "
                         f"{w.shape}")
    fused = be._kernel_table.get("dense")
    if fused is None:
        y = matmul(x, w)
        if b is not None:
            y = bias_add(y, b)
        return relu(y) if activation == "relu" else y
    data = fused(x._data, w._data, None if b is None else b._data, activation)
    return _finish("dense", (x, w) if b is None else (x, w, b), data, be, dt,
                   {"activation": activation})


# --- shapes -----------------------------------------------------------------------------
def shape(x: TensorLike) -> tuple[int, ...]:
    return _as_tensor(x).shape


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
    x = _as_tensor(x)
    new = _resolve_shape(x.size, _shape_tuple(shape), x.shape)
    if new == x.shape:
        return x
    be = x._backend
    return _finish("reshape", (x,), be._kernel_table["reshape"](x._data, new), be, x._dtype)


def expand_dims(x: TensorLike, axis: int) -> Tensor:
    x = _as_tensor(x)
    ndim = x.ndim + 1
    if not -ndim <= axis < ndim:
        raise ValueError(f"expand_dims: axis {axis} is out of range for rank {x.ndim}")
    axis %= ndim
    s = x.shape
    return reshape(x, (*s[:axis], 1, *s[axis:]))


def squeeze(x: TensorLike, axis: Any = None) -> Tensor:
    x = _as_tensor(x)
    ax = _axes(axis, x.ndim, "squeeze")
    s = x.shape
    if ax is None:
        ax = tuple(i for i, d in enumerate(s) if d == 1)
    for i in ax:
        if s[i] != 1:
            raise ValueError(f"squeeze: axis {i} of shape {s} is not 1")
    return reshape(x, tuple(d for i, d in enumerate(s) if i not in ax))


def transpose(x: TensorLike, perm: Sequence[int] | None = None) -> Tensor:
    x = _as_tensor(x)
    nd = x.ndim
    p = tuple(range(nd - 1, -1, -1)) if perm is None else tuple(int(i) % builtins.max(nd, 1)
                                                              for i in perm)
    if sorted(p) != list(range(nd)):
        raise ValueError(f"transpose: {perm!r} is not a permutation of the axes of a rank-{nd} "
                         "tensor")
    be = x._backend
    return _finish("transpose", (x,), be._kernel_table["transpose"](x._data, p), be, x._dtype,
                   {"perm": p})


def broadcast_to(x: TensorLike, shape: Any) -> Tensor:
    x = _as_tensor(x)
    target = _shape_tuple(shape)
    s = x.shape
    if len(s) > len(target) or any(a not in (1, b) for a, b in zip(s[::-1], target[::-1])):
        raise ValueError(f"broadcast_to: cannot broadcast {s} to {target}")
    if s == target:
        return x
    be = x._backend
    return _finish("broadcast_to", (x,), be._kernel_table["broadcast_to"](x._data, target), be,
                   x._dtype, {"shape": target})


def concat(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    if not xs:
        raise ValueError("concat needs at least one tensor")
    tensors, be, dt = _common("concat", list(xs))
    nd = tensors[0].ndim
    if not -nd <= axis < nd:
        raise ValueError(f"concat: axis {axis} is out of range for rank {nd}")
    axis %= nd
    ref = tensors[0].shape
    for t in tensors[1:]:
        s = t.shape
        if len(s) != nd or s[:axis] + s[axis + 1:] != ref[:axis] + ref[axis + 1:]:
            raise ValueError(f"concat: shapes {ref} and {s} differ outside axis {axis}")
    data = be._kernel_table["concat"]([t._data for t in tensors], axis)
    return _finish("concat", tuple(tensors), data, be, dt,
                   {"axis": axis, "sizes": tuple(t.shape[axis] for t in tensors)})


def stack(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    tensors = [_as_tensor(x) for x in xs]
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    return concat([expand_dims(t, axis) for t in tensors], axis)


def _index_tensor(indices: Any, be: Any, op: str) -> Tensor:
    idx = indices if isinstance(indices, Tensor) else constant(indices, backend=be)
    if not _dt.is_integer(idx._dtype):
        raise TypeError(f"{op}: indices must be integers, got {idx._dtype}")
    return idx


def take(x: TensorLike, indices: Any, axis: int = 0) -> Tensor:
    """Gather ``indices`` along ``axis`` (an embedding lookup, a batch selection)."""
    x = _as_tensor(x)
    be = x._backend
    idx = _index_tensor(indices, be, "take")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"take: axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    data = be._kernel_table["take"](x._data, idx._data, axis)
    return _finish("take", (x, idx), data, be, x._dtype, {"axis": axis, "shape": x.shape})


def _take_grad(g: Tensor, indices: Tensor, axis: int, shape: tuple[int, ...]) -> Tensor:
    be = g._backend
    data = be._kernel_table["take_grad"](g._data, indices._data, axis, shape)
    return _finish("take_grad", (g, indices), data, be, g._dtype, {"axis": axis})


_BASIC_INDEX = (int, slice, type(None), type(Ellipsis))


def getitem(x: TensorLike, key: Any) -> Tensor:
    """``x[key]`` with basic indexing (ints, slices, None, ...); an integer array or tensor as
    the whole key gathers along the first axis."""
    x = _as_tensor(x)
    if isinstance(key, (Tensor, list)) or hasattr(key, "dtype"):
        return take(x, key, 0)
    k = key if isinstance(key, tuple) else (key,)
    for item in k:
        if not isinstance(item, _BASIC_INDEX) or isinstance(item, bool):
            raise TypeError(f"unsupported index {item!r}: use ints, slices, None, ..., or one "
                            "integer array for the first axis (mp.ops.take for other axes)")
    be = x._backend
    data = be._kernel_table["getitem"](x._data, k)
    return _finish("getitem", (x,), data, be, x._dtype, {"key": k, "shape": x.shape})


def _getitem_grad(g: Tensor, key: tuple[Any, ...], shape: tuple[int, ...]) -> Tensor:
    be = g._backend
    data = be._kernel_table["getitem_grad"](g._data, key, shape)
    return _finish("getitem_grad", (g,), data, be, g._dtype, {"key": key})


def one_hot(indices: Any, depth: int, dtype: Any = "float32") -> Tensor:
    be = indices._backend if isinstance(indices, Tensor) else registry.get_backend()
    idx = _index_tensor(indices, be, "one_hot")
    dt = _dt.canonical(dtype)
    return Tensor(be._kernel_table["one_hot"](idx._data, int(depth), dt), be, dt)


# --- softmax and losses -----------------------------------------------------------------
def softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """Softmax along ``axis``, computed in float32 (a *deny* op)."""
    x = _as_tensor(x)
    be = x._backend
    x = _cast_to(x, _unary_dtype("softmax", be, x._dtype, True))
    axis = _one_axis(axis, x.ndim, "softmax")
    kernel = be._kernel_table.get("softmax")
    if kernel is not None:
        return _finish("softmax", (x,), kernel(x._data, axis), be, x._dtype, {"axis": axis})
    e = exp(subtract(x, stop_gradient(max(x, axis, keepdims=True))))
    return divide(e, sum(e, axis, keepdims=True))


def log_softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """Log of softmax along ``axis``, computed in float32 without overflow."""
    x = _as_tensor(x)
    be = x._backend
    x = _cast_to(x, _unary_dtype("log_softmax", be, x._dtype, True))
    axis = _one_axis(axis, x.ndim, "log_softmax")
    kernel = be._kernel_table.get("log_softmax")
    if kernel is not None:
        return _finish("log_softmax", (x,), kernel(x._data, axis), be, x._dtype, {"axis": axis})
    shifted = subtract(x, stop_gradient(max(x, axis, keepdims=True)))
    return subtract(shifted, log(sum(exp(shifted), axis, keepdims=True)))


def sparse_softmax_cross_entropy(labels: Any, logits: TensorLike) -> Tensor:
    """Per-example ``-log(softmax(logits)[label])`` for integer ``labels`` of shape (N,) and
    ``logits`` of shape (N, C), fused where the backend has the kernel; float32."""
    logits = _as_tensor(logits)
    be = logits._backend
    lab = _index_tensor(labels, be, "sparse_softmax_cross_entropy")
    if logits.ndim != 2 or lab.shape != logits.shape[:1]:
        raise ValueError("sparse_softmax_cross_entropy: expected logits (N, C) and labels (N,), "
                         f"got {logits.shape} and {lab.shape}")
    logits = _cast_to(logits, _unary_dtype("sparse_softmax_cross_entropy", be, logits._dtype,
                                           True))
    kernel = be._kernel_table.get("sparse_softmax_cross_entropy")
    if kernel is not None:
        loss, probs = kernel(logits._data, lab._data)
        return _finish("sparse_softmax_cross_entropy", (logits, lab), loss, be, logits._dtype,
                       None, probs)
    picked = multiply(log_softmax(logits), one_hot(lab, logits.shape[1], logits._dtype))
    return negative(sum(picked, axis=1))


def relu_grad(g: Tensor, y: Tensor) -> Tensor:
    """``g`` where ``y > 0``, else 0: relu's backward pass (fused where available)."""
    be = g._backend
    kernel = be._kernel_table.get("relu_grad")
    if kernel is not None:
        return _finish("relu_grad", (g, y), kernel(g._data, y._data), be, g._dtype)
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
    kernel = be._kernel_table.get("relu_grad_bias")
    if kernel is None or _state.tapes or g.ndim < 2:
        dz = relu_grad(g, y)
        return dz, bias_grad(dz)
    dz, db = kernel(g._data, y._data)
    return Tensor(dz, be, g._dtype), Tensor(db, be, g._dtype)


# --- randomness -------------------------------------------------------------------------
def random_uniform(shape: Any, minval: float = 0.0, maxval: float = 1.0, dtype: Any = "float32",
                   seed: int | None = None, backend: Any = None) -> Tensor:
    """Uniform values in [minval, maxval). ``seed=None`` draws the next seed from
    ``mp.random`` (so ``mp.random.set_seed`` makes runs repeatable)."""
    be = _resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else int(seed)
    return Tensor(be.kernels()["random_uniform"](_shape_tuple(shape), dt, s, float(minval),
                                                 float(maxval)), be, dt)


def random_normal(shape: Any, mean: float = 0.0, stddev: float = 1.0, dtype: Any = "float32",
                  seed: int | None = None, backend: Any = None) -> Tensor:
    be = _resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else int(seed)
    return Tensor(be.kernels()["random_normal"](_shape_tuple(shape), dt, s, float(mean),
                                                float(stddev)), be, dt)


def dropout_mask(shape: Any, rate: float, dtype: Any = "float32", seed: int | None = None,
                 backend: Any = None) -> Tensor:
    """0 with probability ``rate``, else ``1/(1-rate)`` (inverted dropout)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate!r}")
    be = _resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else int(seed)
    kernel = be.kernels().get("dropout_mask")
    if kernel is not None:
        return Tensor(kernel(_shape_tuple(shape), float(rate), dt, s), be, dt)
    keep = greater_equal(random_uniform(shape, dtype="float32", seed=s, backend=be), rate)
    return cast(multiply(cast(keep, "float32"), 1.0 / (1.0 - rate)), dt)


def dropout(x: TensorLike, rate: float, seed: int | None = None) -> Tensor:
    x = _as_tensor(x)
    if rate == 0.0:
        return x
    return multiply(x, dropout_mask(x.shape, rate, x.dtype, seed, x.backend))


# --- loss scaling -----------------------------------------------------------------------
def unscale_and_check(grads: Sequence[Tensor | None],
                      inv_scale: float) -> tuple[list[Tensor | None], Tensor | None]:
    """Every gradient times ``inv_scale``, in float32, and one device flag that is true when
    all of them are finite: one multi-tensor kernel, no host read. None stays None."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads), None
    be = present[0]._backend
    outs, flag = be._kernel_table["unscale_and_check"]([g._data for g in present],
                                                       float(inv_scale))
    it = iter(outs)
    result = [None if g is None else Tensor(next(it), be, "float32") for g in grads]
    return result, Tensor(flag, be, "bool")


def all_finite(xs: Sequence[Tensor]) -> Tensor:
    """A device flag: are all values of all tensors finite?"""
    tensors = [x for x in xs if x is not None]
    if not tensors:
        raise ValueError("all_finite needs at least one tensor")
    be = tensors[0]._backend
    kernel = be._kernel_table.get("all_finite")
    if kernel is not None:
        return Tensor(kernel([t._data for t in tensors]), be, "bool")
    return unscale_and_check(tensors, 1.0)[1]  # type: ignore[return-value]


from mpcore.ops_image import conv2d, max_pool2d  # noqa: E402, F401 - image ops live apart
