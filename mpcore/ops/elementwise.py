"""Elementwise ops with broadcasting, and their gradients.

Binary ops take a Python scalar for either operand without making a tensor of it (the kernel
receives the scalar); a float scalar makes an integer tensor's op compute in float32.

``cos`` and ``sin`` (Keras 3's ``keras.ops.cos``/``sin``) are each backend's own function
(NumPy's and CuPy's, OpenCL C's built-in): fast on tensors of any size and within a few ulps of
the exact value, but not the same bits everywhere (NumPy may take a SIMD routine, PoCL its own
library). They are *deny* ops, computed in float32 for 16-bit inputs, as TF's graph rewrite
keeps ops of no list: a periodic function of a 16-bit argument keeps no digit of it beyond a
few periods. The learning-rate schedules need a cosine that is the same bits on the host and
on every device; they use their own, of IEEE basic operations
(:mod:`mpcore.optimizers.cosine_math`), not these.
"""

from __future__ import annotations

import math
from typing import Any

from mpcore import ops as _ops
from mpcore.core import dtypes as _dt
from mpcore.core import tape as _tape
from mpcore.core.tape import Node, record, recording
from mpcore.core.tensor import Tensor
from mpcore.ops import dispatch as _d
from mpcore.ops.creation import constant, ones_like, zeros_like
from mpcore.ops.dispatch import (
    Grads,
    TensorLike,
    as_tensor,
    cast,
    common,
    finish,
    gradient,
    unrecorded,
)

_tapes = _tape.state
_SCALARS = (int, float, bool)
_FLOATS = _dt.FLOATING_SET


def _make_binary(op: str, result: str | None = None, float_only: bool = False) -> Any:
    compute_dtype = _d.compute_dtype

    def binary(a: TensorLike, b: TensorLike) -> Tensor:
        ta = isinstance(a, Tensor)
        tb = isinstance(b, Tensor)
        if _d.autocast_dtype is not None:
            a, b = _d.autocast_variable(a) if ta else a, _d.autocast_variable(b) if tb else b
        if ta:
            be = a._backend
            dt = a._dtype
            if tb:
                if b._backend is not be:
                    _d.mismatch(op, a, b)
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
        dt = compute_dtype(op, be, dt, float_only)
        if ta and a._dtype != dt:
            a = _d.input_cast(a, dt)
        if tb and b._dtype != dt:
            b = _d.input_cast(b, dt)
        data = be.kernels()[op](a._data if ta else a, b._data if tb else b)
        out = Tensor(data, be, result or dt)
        if _d.numerics_check is not None:
            _d.numerics_check(op, (a, b), out)
        if _tapes.tapes and result is None:
            record(op, (a, b), out, None, None)
        return out

    binary.__name__ = binary.__qualname__ = op
    binary.__doc__ = f"Elementwise {op} with broadcasting ({op!r} in the category table)."
    return binary


def _make_unary(op: str, result: str | None = None, float_only: bool = False) -> Any:
    compute_dtype = _d.compute_dtype

    def unary(x: TensorLike) -> Tensor:
        if not isinstance(x, Tensor):
            x = constant(x)
        elif _d.autocast_dtype is not None:
            x = _d.autocast_variable(x)
        be = x._backend
        dt = compute_dtype(op, be, x._dtype, float_only)
        if dt != x._dtype:
            x = _d.input_cast(x, dt)
        out = Tensor(be.kernels()[op](x._data), be, result or dt)
        if _d.numerics_check is not None:
            _d.numerics_check(op, (x,), out)
        if _tapes.tapes and result is None:
            record(op, (x,), out, None, None)
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
cos = _make_unary("cos", float_only=True)
sin = _make_unary("sin", float_only=True)
logical_not = _make_unary("logical_not", result="bool")
isfinite = _make_unary("isfinite", result="bool")


def reciprocal(x: TensorLike) -> Tensor:
    return divide(1.0, x)


def rsqrt(x: TensorLike) -> Tensor:
    return divide(1.0, sqrt(x))


def gelu(x: TensorLike, approximate: bool = False) -> Tensor:
    """Gaussian error linear unit (exact by default, tanh approximation on request), in
    ``x``'s dtype. One kernel where the backend has ``gelu`` and ``gelu_grad`` (16-bit inputs
    computed in float32 and rounded once), else composed of recorded ops."""
    x = as_tensor(x)
    be = x._backend
    kernel = be.kernels().get("gelu")
    if (kernel is not None and be.kernels().get("gelu_grad") is not None
            and x._dtype in _FLOATS):
        y, saved = kernel(x._data, bool(approximate))
        return finish("gelu", (x,), y, be, x._dtype, {"approximate": bool(approximate)},
                      saved)
    if approximate:
        inner = multiply(add(x, multiply(power(x, 3.0), 0.044715)), math.sqrt(2.0 / math.pi))
        return cast(multiply(multiply(x, 0.5), add(tanh(inner), 1.0)), x.dtype)
    return cast(multiply(multiply(x, 0.5), add(erf(multiply(x, 1.0 / math.sqrt(2.0))), 1.0)),
                x.dtype)


def clip_by_value(x: TensorLike, clip_min: Any, clip_max: Any) -> Tensor:
    return minimum(maximum(x, clip_min), clip_max)


def where(condition: TensorLike, x: TensorLike, y: TensorLike) -> Tensor:
    """``x`` where ``condition`` holds, else ``y`` (broadcasting)."""
    (xt, yt), be, dt = common("where", [x, y])
    cond = as_tensor(condition, be)
    if cond._dtype != "bool":
        raise TypeError(f"where: condition must be a bool tensor, got {cond._dtype}")
    return finish("where", (cond, xt, yt), be.kernels()["where"](cond._data, xt._data, yt._data),
                  be, dt)


# --- gradients ---------------------------------------------------------------------------
def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, Tensor) else ()


def _unbroadcast(g: Tensor, x: Any) -> Tensor:
    return _ops.reduction.unbroadcast(g, _shape(x))


@gradient("add")
def _add(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (_unbroadcast(g, a) if needs[0] else None, _unbroadcast(g, b) if needs[1] else None)


@gradient("subtract")
def _subtract(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (_unbroadcast(g, a) if needs[0] else None,
            _unbroadcast(negative(g), b) if needs[1] else None)


@gradient("multiply")
def _multiply(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return (_unbroadcast(multiply(g, b), a) if needs[0] else None,
            _unbroadcast(multiply(g, a), b) if needs[1] else None)


@gradient("divide")
def _divide(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ga = _unbroadcast(divide(g, b), a) if needs[0] else None
    gb = None
    if needs[1]:
        gb = _unbroadcast(negative(divide(multiply(g, node.output), b)), b)
    return ga, gb


@gradient("power")
def _power(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    ga = gb = None
    if needs[0]:
        ga = _unbroadcast(multiply(multiply(g, b), power(a, subtract(b, 1.0))
                                   if isinstance(b, Tensor) else power(a, b - 1.0)), a)
    if needs[1]:
        # d(a^b)/db = a^b log a, defined for a > 0 (0 elsewhere, as TF)
        a_t = a if isinstance(a, Tensor) else constant(a, dtype=node.output.dtype,
                                                       backend=node.output.backend)
        positive = greater(a_t, 0)
        safe_log = log(where(positive, a_t, ones_like(a_t)))
        gb = _unbroadcast(multiply(multiply(g, node.output), safe_log), b)
    return ga, gb


def _select_grad(node: Node, g: Tensor, needs: tuple[bool, ...], pick_first: Tensor) -> Grads:
    a, b = node.inputs
    zero = zeros_like(g)
    return (_unbroadcast(where(pick_first, g, zero), a) if needs[0] else None,
            _unbroadcast(where(pick_first, zero, g), b) if needs[1] else None)


@gradient("maximum")
def _maximum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _select_grad(node, g, needs, greater_equal(a, b))


@gradient("minimum")
def _minimum(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _select_grad(node, g, needs, less_equal(a, b))


@gradient("negative")
def _negative(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (negative(g),)


@gradient("abs")
def _abs(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (multiply(g, sign(node.inputs[0])),)


@gradient("sign")
def _sign(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (zeros_like(g),)


@gradient("exp")
def _exp(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (multiply(g, node.output),)


@gradient("log")
def _log(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (divide(g, node.inputs[0]),)


@gradient("sqrt")
def _sqrt(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (divide(g, multiply(node.output, 2.0)),)


@gradient("square")
def _square(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (multiply(g, multiply(node.inputs[0], 2.0)),)


@gradient("relu")
def _relu(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (_ops.nn.relu_grad(g, node.output),)


@gradient("sigmoid")
def _sigmoid(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y = node.output
    return (multiply(g, multiply(y, subtract(1.0, y))),)


@gradient("tanh")
def _tanh(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    y = node.output
    return (multiply(g, subtract(1.0, square(y))),)


@gradient("erf")
def _erf(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    return (multiply(g, multiply(exp(negative(square(x))), 1.1283791670955126)),)  # 2/sqrt(pi)


@gradient("cos")
def _cos(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (multiply(g, negative(sin(node.inputs[0]))),)


@gradient("sin")
def _sin(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    return (multiply(g, cos(node.inputs[0])),)


@gradient("gelu")
def _gelu(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    approximate = node.attrs["approximate"]
    if recording():   # an outer tape records this backward pass: differentiable ops
        with_tape = _gelu_composite_derivative(x, approximate)
        return (multiply(g, with_tape),)
    be = x.backend
    g = cast(g, x.dtype)
    dx = be.kernels()["gelu_grad"](g._data, x._data, node.saved, approximate)
    return (unrecorded("gelu_grad", (g, x), dx, be, x.dtype),)


def _gelu_composite_derivative(x: Tensor, approximate: bool) -> Tensor:
    """d gelu / dx in recorded ops (for gradients of gradients)."""
    if approximate:
        c = math.sqrt(2.0 / math.pi)
        t = tanh(multiply(add(x, multiply(power(x, 3.0), 0.044715)), c))
        inner = multiply(multiply(subtract(1.0, square(t)), c),
                         add(1.0, multiply(square(x), 3 * 0.044715)))
        return add(multiply(add(t, 1.0), 0.5), multiply(multiply(x, 0.5), inner))
    cdf = multiply(add(erf(multiply(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = multiply(exp(multiply(square(x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return add(cdf, multiply(x, pdf))


@gradient("where")
def _where(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    cond, a, b = node.inputs
    zero = zeros_like(g)
    return (None,
            _unbroadcast(where(cond, g, zero), a) if needs[1] else None,
            _unbroadcast(where(cond, zero, g), b) if needs[2] else None)
