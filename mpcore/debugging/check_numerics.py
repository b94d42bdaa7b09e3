"""``enable_check_numerics()`` (TF's name) makes every op check its output
and raise at the first op whose output holds Inf or NaN, naming the op, the layer it ran in and
the ranges of its inputs, and saying whether it produced the value or was handed it. Off by
default; when off it costs one ``is None`` test per op. While it is on, traced functions run
eagerly (a replay has no ops to check) and every op reads its result on the host, so it is for
finding a problem, not for training."""

from __future__ import annotations

import contextvars
from typing import Any

from mpcore import ops
from mpcore.core import dtypes as _dtypes
from mpcore.core.tape import VariableRead
from mpcore.core.tensor import Tensor, Variable
from mpcore.layers.scopes import layer_path
from mpcore.ops import dispatch as _dispatch

_checking = contextvars.ContextVar("mpcore_checking", default=False)


class NumericsError(FloatingPointError):
    """Raised by an op whose output holds Inf or NaN while ``enable_check_numerics`` is on."""


def enable_check_numerics() -> None:
    _dispatch.numerics_check = _check


def disable_check_numerics() -> None:
    _dispatch.numerics_check = None


def check_numerics_enabled() -> bool:
    return _dispatch.numerics_check is _check


def _host(t: Tensor) -> Any:
    return t._backend.to_host(t._data)   # not t.numpy(): this read is not the step's own


def _finite(t: Tensor) -> bool:
    return bool(_host(ops.all_finite([t])))


def _range(t: Tensor) -> str:
    """The tensor's finite range, and how many of its values are not finite."""
    finite = ops.isfinite(t)
    bad = t.size - int(_host(ops.sum(ops.cast(finite, "int32"))))
    if bad == t.size:
        return f"{t.dtype}{list(t.shape)}: every value Inf/NaN"
    low = float(_host(ops.min(ops.where(finite, t, float("inf")))))
    high = float(_host(ops.max(ops.where(finite, t, float("-inf")))))
    extra = f", and {bad} Inf/NaN" if bad else ""
    return f"{t.dtype}{list(t.shape)} in [{low:.6g}, {high:.6g}]{extra}"


def _origin(handed: list[Tensor]) -> str:
    """Where non-finite inputs that no checked op produced come from."""
    names = [f"variable {t.variable.name!r}" for t in handed if isinstance(t, VariableRead)]
    names += [f"variable {t.name!r}" for t in handed if isinstance(t, Variable)]
    if names:
        return f"{', '.join(names)} already held them (restored, or assigned, that way?)"
    return ("they were in the data passed in (check it with numpy.isfinite(x).all()), or were "
            "made while checking was off")


def _check(op: str, inputs: tuple[Any, ...], out: Tensor) -> None:
    if _checking.get() or not _dtypes.is_floating(out._dtype) or out.size == 0:
        return
    token = _checking.set(True)           # the check's own ops are not checked
    try:
        if _finite(out):
            return
        tensors = [t for t in inputs if isinstance(t, Tensor) and _dtypes.is_floating(t._dtype)
                   and t.size]
        handed = [t for t in tensors if not _finite(t)]
        where = " > ".join(layer_path()) or "no layer (a loss, a gradient or your own code)"
        ranges = "; ".join(_range(t) for t in tensors) or "no floating inputs"
        cause = (f"its inputs already held Inf/NaN: it passed them on. No checked op made "
                 f"them: {_origin(handed)}" if handed else
                 "its inputs were finite: this op produced them")
        hint = (" A 16-bit overflow: keep that layer in float32 (dtype='float32'), or use "
                "mixed_bfloat16." if out._dtype in _dtypes.LOW_PRECISION and not handed else "")
        raise NumericsError(
            f"check_numerics: {op} gave Inf/NaN in its {out.dtype}{list(out.shape)} output, "
            f"in {where}; {cause}. Input ranges: {ranges}.{hint}")
    finally:
        _checking.reset(token)
