"""Dispatch: what every op does around its kernel, written once.

An op (1) finds the backend of its tensor inputs (:func:`common`), (2) picks the compute dtype:
the inputs' promoted dtype (:func:`mpcore.dtypes.promote_all`), moved to float32 where the op
needs a floating result or where the op's mixed precision category (:mod:`mpcore.core.categories`,
with the backend's overrides) denies 16 bits (:func:`compute_dtype`, the only place this rule
is written), (3) casts its inputs to it with the recorded, differentiable :func:`cast`, (4) calls
the backend's kernel, reached through the public ``Backend.kernels()`` table, and (5) records
itself on the active GradientTapes (:func:`finish`). Gradients are registered with
:func:`gradient` next to the op they belong to, in each family module, and walked by
:mod:`mpcore.ops.backprop`.

This is the hot path of every training step: keep it free of allocations that are not needed,
and of host reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpcore.core import dtypes as _dt
from mpcore.core import tape as _tape
from mpcore.core.categories import Category
from mpcore.core.tape import Node, record
from mpcore.core.tensor import Tensor, Variable
from mpcore.ops.creation import constant

TensorLike = Any  # a Tensor, a Python number or nested list, or a host/native array
Grads = Sequence[Tensor | None]
GradFn = Callable[[Node, Tensor, tuple[bool, ...]], Grads]

#: op name -> its gradient function (see :func:`gradient`).
GRADIENTS: dict[str, GradFn] = {}

_tapes = _tape.state
_LOW = _dt.LOW_PRECISION
_FLOATS = _dt.FLOATING_SET
_DENY = Category.DENY


def gradient(*ops: str) -> Callable[[GradFn], GradFn]:
    """Register the gradient of ``ops``: a function of the recorded node, the gradient of its
    output and, per input, whether that input needs a gradient (so, say, the first layer's
    input gradient is never computed); it returns one gradient (or None) per input."""
    def register(fn: GradFn) -> GradFn:
        for op in ops:
            GRADIENTS[op] = fn
        return fn
    return register


def compute_dtype(op: str, backend: Any, dtype: str, float_only: bool = False) -> str:
    """The dtype ``op`` computes in for inputs promoted to ``dtype``: float32 for an op that
    needs a floating result of non-floating inputs, and float32 for 16-bit inputs of an op its
    category denies 16 bits (softmax, exp, sums ...); otherwise ``dtype`` itself. While
    automatic mixed precision decides (:mod:`mpcore.amp`), its decision comes first."""
    if dtype_hook is not None:
        decided = dtype_hook(op, backend, dtype, float_only)
        if decided is not None:
            return decided
    if float_only and dtype not in _FLOATS:
        return "float32"
    if dtype in _LOW and backend.categories()[op] is _DENY:
        return "float32"
    return dtype


def as_tensor(x: Any, backend: Any = None) -> Tensor:
    if autocast_dtype is not None and type(x) is Variable:
        return autocast_variable(x)
    return x if isinstance(x, Tensor) else constant(x, backend=backend)


#: The compute dtype of the mixed precision layer whose ``call`` runs (Keras 3's
#: AutocastScope): a floating variable read by an op there is read in it (cast once per value
#: and tape). None outside such a call. Set only by :func:`autocast_scope`.
autocast_dtype: str | None = None


def autocast_variable(x: Tensor) -> Tensor:
    """``x`` as an op reads it inside :func:`autocast_scope`: a floating Variable created with
    ``autocast=True`` (the default) in the scope's dtype, anything else as it is."""
    if (autocast_dtype is not None and type(x) is Variable and x.autocast
            and x._dtype in _FLOATS and x._dtype != autocast_dtype):
        return x.read_as(autocast_dtype)
    return x


class autocast_scope:  # noqa: N801 - a context manager used like a function
    """Inside, ops read floating variables in ``dtype`` (None: as they are). Layers enter it
    around ``call`` under a mixed policy, so ``ops.matmul(x, self.w)`` in a custom layer
    multiplies in 16 bits as in Keras; a layer of a non-mixed policy enters it with None, so
    a float32 layer inside a mixed model reads its float32 weights."""

    __slots__ = ("dtype", "saved")

    def __init__(self, dtype: str | None) -> None:
        self.dtype = dtype
        self.saved: str | None = None

    def __enter__(self) -> None:
        global autocast_dtype
        self.saved, autocast_dtype = autocast_dtype, self.dtype

    def __exit__(self, *exc: object) -> None:
        global autocast_dtype
        autocast_dtype = self.saved


def mismatch(op: str, a: Tensor, b: Tensor) -> None:
    raise ValueError(f"{op}: operands live on different backends ({a.backend.name!r} and "
                     f"{b.backend.name!r}); move one with mp.constant(x, backend=...)")


def common(op: str, xs: Sequence[Any], float_only: bool = False) -> tuple[list[Tensor], Any, str]:
    """Tensors of ``xs`` on one backend, cast to ``op``'s compute dtype, with that backend and
    dtype. Non-tensor values become tensors on the first tensor's backend."""
    be = None
    for x in xs:
        if isinstance(x, Tensor):
            be = x._backend
            break
    tensors = [x if isinstance(x, Tensor) else constant(x, backend=be) for x in xs]
    if autocast_dtype is not None:
        tensors = [autocast_variable(t) for t in tensors]
    be = tensors[0]._backend
    for t in tensors[1:]:
        if t._backend is not be:
            mismatch(op, tensors[0], t)
    dt = compute_dtype(op, be, _dt.promote_all([t._dtype for t in tensors]), float_only)
    return [cast_to(t, dt) for t in tensors], be, dt


def finish(op: str, inputs: tuple[Any, ...], data: Any, be: Any, dtype: str,
           attrs: dict[str, Any] | None = None, saved: Any = None) -> Tensor:
    """The op's output tensor, recorded on every active tape (``attrs`` and ``saved`` are what
    its gradient needs besides inputs and output)."""
    out = Tensor(data, be, dtype)
    if numerics_check is not None:
        numerics_check(op, inputs, out)
    if _tapes.tapes:
        record(op, inputs, out, attrs, saved)
    return out


def unrecorded(op: str, inputs: tuple[Any, ...], data: Any, be: Any, dtype: str) -> Tensor:
    """The output of a kernel no tape records (a fused gradient), still seen by the numerics
    tools like every op's."""
    out = Tensor(data, be, dtype)
    if numerics_check is not None:
        numerics_check(op, inputs, out)
    return out


#: Set by ``mp.debugging.enable_check_numerics``: called with every op's inputs and output.
numerics_check: Callable[[str, tuple[Any, ...], Tensor], None] | None = None
#: Set by :mod:`mpcore.amp` while autocast or the graph rewrite decides dtypes:
#: ``dtype_hook(op, backend, dtype, float_only)`` returns the compute dtype, or None to leave
#: the decision to the category rule.
dtype_hook: Callable[[str, Any, str, bool], str | None] | None = None
#: Set by the graph rewrite while it traces a painted step: ``cast_hook(x, dtype)`` casts a
#: tensor once for all the ops that read it in that dtype (TF's one cast per output).
cast_hook: Callable[[Tensor, str], Tensor] | None = None


def cast(x: TensorLike, dtype: Any) -> Tensor:
    """``x`` in ``dtype``; differentiable between floating dtypes. A variable is cast from its
    own value, also inside a mixed layer's call (never through its 16-bit read)."""
    x = x if isinstance(x, Tensor) else constant(x)
    dt = _dt.canonical(dtype) if type(dtype) is not str or dtype not in _dt.ALL else dtype
    if dt == x._dtype:
        return x
    be = x._backend
    return finish("cast", (x,), be.kernels()["cast"](x._data, dt), be, dt)


def cast_to(x: Tensor, dtype: str) -> Tensor:
    if x._dtype == dtype:
        return x
    # a variable read in another dtype (automatic mixed precision casting a float32 weight
    # for an allow op) is cast once per value and tape, however many ops read it
    if type(x) is Variable:
        return x.read_as(dtype)
    return input_cast(x, dtype)


def input_cast(x: Tensor, dtype: str) -> Tensor:
    """``x`` cast to ``dtype`` for an op that reads it: while the graph rewrite traces a
    painted step, its one cast per tensor and dtype (``cast_hook``); otherwise :func:`cast`."""
    return cast(x, dtype) if cast_hook is None else cast_hook(x, dtype)


@gradient("cast")
def _cast_gradient(node: Node, g: Tensor, needs: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    if not (_dt.is_floating(x.dtype) and _dt.is_floating(node.output.dtype)):
        return (None,)
    return (cast(g, x.dtype),)
