"""Gradient clipping, as Keras' optimizers spell it: ``clipnorm`` (each gradient's L2 norm),
``global_clipnorm`` (the L2 norm of all gradients together) and ``clipvalue`` (each value).

Norms are computed on the device, in the gradients' dtype (float32 for float32 variables), with
Keras' formulas (``g * t / max(norm, t)``; the global scale ``t / max(global norm, t)`` is
exactly 1 below the threshold), and a zero gradient stays zero (no 0/0). Under a
LossScaleOptimizer the optimizer clips the *unscaled* gradients, and a skipped (non-finite)
step changes nothing, clipped or not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mpcore import ops
from mpcore.core import arguments as _args
from mpcore.core.tensor import Tensor

OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


def check(clipnorm: Any, clipvalue: Any, global_clipnorm: Any) -> tuple[str, float] | None:
    """The clipping asked for, as (option, threshold), or None; at most one may be set."""
    given = {name: value for name, value in zip(OPTIONS, (clipnorm, clipvalue, global_clipnorm))
             if value is not None}
    if len(given) > 1:
        raise ValueError(f"only one of {', '.join(OPTIONS)} can be set, got "
                         + ", ".join(f"{k}={v!r}" for k, v in given.items()))
    if not given:
        return None
    ((name, value),) = given.items()
    threshold = _args.number(name, value, 0.0, low_open=True)
    if not math.isfinite(threshold):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return name, threshold


def _squared_norm(g: Tensor) -> Tensor:
    return ops.sum(ops.square(g))


def _divisor(squared: Tensor, threshold: float) -> Tensor:
    """max(norm, threshold), the divisor of Keras' formulas. A zero norm gives the threshold
    (no 0/0); a non-finite one too: that step is skipped (the "all finite" flag was taken
    before clipping), and inf/inf would only add NaN and NumPy's warnings to it."""
    finite = ops.isfinite(squared)
    norm = ops.sqrt(ops.where(finite, squared, 0.0))
    return ops.maximum(norm, threshold)


def clip(grads: Sequence[Tensor], how: tuple[str, float] | None) -> list[Tensor]:
    """``grads`` clipped as ``how`` (from :func:`check`) says."""
    if how is None or not grads:
        return list(grads)
    name, threshold = how
    if name == "clipvalue":
        return [ops.clip_by_value(g, -threshold, threshold) for g in grads]
    if name == "clipnorm":
        return [ops.divide(ops.multiply(g, threshold), _divisor(_squared_norm(g), threshold))
                for g in grads]
    total = _squared_norm(grads[0])
    for g in grads[1:]:
        total = ops.add(total, _squared_norm(g))
    scale = ops.divide(threshold, _divisor(total, threshold))
    return [ops.multiply(g, ops.cast(scale, g.dtype)) for g in grads]
