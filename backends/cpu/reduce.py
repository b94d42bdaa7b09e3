"""The CPU backend's reductions: the shared kernels' NumPy calls without NumPy's Python wrappers.

``np.sum(x, dtype=x.dtype)`` is ``np.add.reduce`` with the same arguments, and ``np.mean`` is
that sum divided by the element count as a NumPy ``intp`` (``numpy._core._methods._mean``: an
array quotient in place with unsafe casting, a scalar one through the scalar's own type), so
calling those directly gives the same bits. A training step reduces small arrays (the batch's
losses, its correct predictions), where the wrappers are most of the cost.

NumPy scalars take the shared kernels, and so do means of dtypes other than float32 and
float64, over bad or repeated axes, and of no elements (with NumPy's warning).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mpcore_xp import F32, F64, I64

from .elementwise import quiet

#: Where the direct route runs: NumPy's own float loops, whose reduction it calls unchanged.
_DIRECT = frozenset({F32, F64})


def _count(x: np.ndarray, axis: Any) -> int | None:
    """How many elements each result of a reduction over ``axis`` (None, an int or a tuple of
    ints: the ops pass None or a tuple) sums, or None where the shared kernel should decide
    (a bad or repeated axis: its error)."""
    if axis is None:
        return x.size
    axes = (axis,) if type(axis) is int else axis
    if type(axes) is not tuple or not all(type(a) is int and -x.ndim <= a < x.ndim
                                          for a in axes):
        return None
    if len({a % x.ndim for a in axes}) != len(axes):
        return None
    return math.prod(x.shape[a] for a in axes)


class CpuReduce:
    """Mixed into CpuBackend, ahead of the shared reductions."""

    def sum(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if type(x) is not np.ndarray:
            return super().sum(x, axis, keepdims)
        with quiet():
            total = np.add.reduce(x, axis=axis, dtype=x.dtype, keepdims=keepdims)
        return total if type(total) is np.ndarray else np.asarray(total)

    def mean(self, x: Any, axis: Any, keepdims: bool) -> Any:
        count = _count(x, axis) if type(x) is np.ndarray and x.dtype in _DIRECT else None
        if not count:   # (an empty mean warns through the shared kernel)
            return super().mean(x, axis, keepdims)
        n = np.intp(count)
        with quiet():
            total = np.add.reduce(x, axis=axis, dtype=x.dtype, keepdims=keepdims)
            if type(total) is np.ndarray:
                return np.true_divide(total, n, out=total, casting="unsafe", subok=False)
            return np.asarray(total.dtype.type(total / n))

    def argmax(self, x: Any, axis: int) -> Any:
        if type(x) is not np.ndarray:
            return super().argmax(x, axis)
        index = x.argmax(axis=axis)
        if type(index) is np.ndarray and index.dtype == I64:
            return index
        return np.asarray(index, dtype=I64)
