"""Creation kernels shared by the array-library backends (the host interop, casts, copies and
random numbers depend on the library and stay in each backend)."""

from __future__ import annotations

from typing import Any

from .dtypes import DTYPES


class CreationKernels:
    """Mixed into XpBackend."""

    xp: Any

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> Any:
        return self.xp.full(shape, value, dtype=DTYPES[dtype])

    def one_hot(self, indices: Any, depth: int, dtype: str) -> Any:
        return (indices[..., None] == self.xp.arange(depth)).astype(DTYPES[dtype])
