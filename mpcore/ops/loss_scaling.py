"""Loss scaling: unscale every gradient and check that all are finite, with one device flag
and no host read (the flag gates the optimizer update on the device), and a dynamic loss
scale's update on the device from that flag (:func:`loss_scale_update`).

A dynamic scale's state is three variables: the scale and its reciprocal (float32, shape ())
and int64 counters of shape (4,): good steps, overflows in a row (hysteresis), overflows in a
row at the floor (kept once it reaches ``latch``: the "stuck at its floor" warning is decided
when the host reads it) and skipped steps. The update is TF's rule in float32, the same bits as
:class:`mpcore.DynamicLossScale`'s Python rule: one fused in-place kernel where the backend has
``loss_scale_update``, the same arithmetic as ops otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpcore.core.tensor import Tensor, Variable
from mpcore.ops.creation import constant
from mpcore.ops.dispatch import cast
from mpcore.ops.elementwise import (
    add,
    divide,
    greater_equal,
    isfinite,
    less_equal,
    logical_and,
    maximum,
    minimum,
    multiply,
    where,
)
from mpcore.ops.shapes import getitem, stack

#: The counters' positions.
GOOD_STEPS, OVERFLOWS, AT_FLOOR, SKIPPED = range(4)


def unscale_and_check(grads: Sequence[Tensor | None],
                      inv_scale: float | Tensor) -> tuple[list[Tensor | None], Tensor | None]:
    """Every gradient times ``inv_scale``, in float32, and one device flag that is true when
    all of them are finite: one multi-tensor kernel, no host read. None stays None.
    ``inv_scale`` is a number or a float32 tensor of shape () (a dynamic scale's reciprocal,
    read on the device at each step of a traced step)."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads), None
    be = present[0]._backend
    table = be.kernels()
    if isinstance(inv_scale, Tensor):
        kernel = table.get("unscale_and_check_by")
        if kernel is None:                # the same float32 products, as ops
            return _unscale_composite(grads, inv_scale)
        outs, flag = kernel([g._data for g in present], inv_scale._data)
    else:
        outs, flag = table["unscale_and_check"]([g._data for g in present], float(inv_scale))
    it = iter(outs)
    result = [None if g is None else Tensor(next(it), be, "float32") for g in grads]
    return result, Tensor(flag, be, "bool")


def _unscale_composite(grads: Sequence[Tensor | None], inv_scale: Tensor
                       ) -> tuple[list[Tensor | None], Tensor | None]:
    result = [None if g is None else multiply(g if g.dtype == "float32" else cast(g, "float32"),
                                              inv_scale) for g in grads]
    return result, all_finite([g for g in result if g is not None])


def all_finite(xs: Sequence[Tensor]) -> Tensor:
    """A device flag: are all values of all tensors finite?"""
    tensors = [x for x in xs if x is not None]
    if not tensors:
        raise ValueError("all_finite needs at least one tensor")
    be = tensors[0]._backend
    kernel = be.kernels().get("all_finite")
    if kernel is not None:
        return Tensor(kernel([t._data for t in tensors]), be, "bool")
    return unscale_and_check(tensors, 1.0)[1]  # type: ignore[return-value]


def loss_scale_update(scale: Variable, inv_scale: Variable, counters: Variable, flag: Tensor,
                      period: int, multiplier: float, floor: float, ceiling: float,
                      hysteresis: int, latch: int, fused: bool = True) -> None:
    """Update a dynamic loss scale's variables in place from the step's finite ``flag`` (see
    the module docstring); ``ceiling`` is inf for none. No host read."""
    kernel = scale._backend.kernels().get("loss_scale_update") if fused else None
    if kernel is not None:
        kernel(scale.data, inv_scale.data, counters.data, flag.data, int(period),
               float(multiplier), float(floor), float(ceiling), int(hysteresis), int(latch))
        for v in (scale, inv_scale, counters):
            v.mark_updated()
        return
    _update_composite(scale, inv_scale, counters, flag, period, multiplier, floor, ceiling,
                      hysteresis, latch)


def _update_composite(scale: Variable, inv_scale: Variable, counters: Variable, flag: Tensor,
                      period: int, multiplier: float, floor: float, ceiling: float,
                      hysteresis: int, latch: int) -> None:
    """:func:`loss_scale_update` as ops (float32 scale, int64 counters)."""
    s, c = scale.current_value(), counters.current_value()
    good, over, stuck, skipped = (getitem(c, i) for i in range(4))
    zero = getitem(c, GOOD_STEPS) - getitem(c, GOOD_STEPS)   # an int64 0 on the device
    latched = greater_equal(stuck, latch)
    # a finite step
    good_f = add(good, 1)
    grow = greater_equal(good_f, period)
    grown = s * multiplier
    s_f = where(logical_and(grow, isfinite(grown)), minimum(grown, ceiling), s)
    good_f = where(grow, zero, good_f)
    stuck_f = where(latched, stuck, zero)
    # an overflow
    over_o = add(over, 1)
    back = greater_equal(over_o, hysteresis)
    s_o = where(back, maximum(divide(s, multiplier), floor), s)
    over_o = where(back, zero, over_o)
    stuck_o = where(latched, stuck, where(less_equal(s, floor), add(stuck, 1), zero))
    new_s = where(flag, s_f, s_o)
    new_c = stack([where(flag, good_f, zero), where(flag, zero, over_o),
                   where(flag, stuck_f, stuck_o), where(flag, skipped, add(skipped, 1))])
    new_inv = divide(1.0, new_s)
    scale.assign(new_s)
    inv_scale.assign(new_inv)
    counters.assign(new_c)


# --- a DynamicLossScale's device side (mpcore.mixed_precision.loss_scale uses it) ------------
def make_state(backend: Any, scale: float, inv_scale: float,
               counters: list[int]) -> tuple[Variable, Variable, Variable]:
    """A dynamic scale's variables on ``backend``: scale, reciprocal, counters."""
    def make(value: Any, dtype: str, name: str) -> Variable:
        return Variable(constant(value, dtype, backend=backend), dtype=dtype, trainable=False,
                        name=f"loss_scale/{name}")

    return (make(scale, "float32", "dynamic_scale"), make(inv_scale, "float32", "inverse_scale"),
            make(counters, "int64", "counters"))


def write_state(variables: tuple[Variable, Variable, Variable], scale: float, inv_scale: float,
                counters: list[int]) -> None:
    for variable, value in zip(variables, (scale, inv_scale, counters)):
        variable.assign(_value_like(value, variable))


def _value_like(value: Any, variable: Variable) -> Tensor:
    return constant(value, variable.dtype, backend=variable.backend)


def flag(value: bool, backend: Any) -> Tensor:
    return constant(bool(value), "bool", backend=backend)

