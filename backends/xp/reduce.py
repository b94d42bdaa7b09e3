"""Reductions shared by the array-library backends: in the input's dtype (16-bit sums
accumulate as the library's 16-bit loop does; a backend with a float32 route overrides)."""

from __future__ import annotations

from typing import Any

from .dtypes import I64


class ReduceKernels:
    """Mixed into XpBackend."""

    xp: Any
    errstate: Any

    def sum(self, x: Any, axis: Any, keepdims: bool) -> Any:
        with self.errstate():
            return self.xp.asarray(self.xp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype))

    def mean(self, x: Any, axis: Any, keepdims: bool) -> Any:
        with self.errstate():
            return self.xp.asarray(self.xp.mean(x, axis=axis, keepdims=keepdims, dtype=x.dtype))

    def max(self, x: Any, axis: Any, keepdims: bool) -> Any:
        return self.xp.asarray(self.xp.max(x, axis=axis, keepdims=keepdims))

    def min(self, x: Any, axis: Any, keepdims: bool) -> Any:
        return self.xp.asarray(self.xp.min(x, axis=axis, keepdims=keepdims))

    def argmax(self, x: Any, axis: int) -> Any:
        return self.xp.asarray(self.xp.argmax(x, axis=axis), dtype=I64)
