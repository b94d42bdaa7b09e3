"""The OpenCL backend's native array and the dtype and layout tables its kernels use. Free of
pyopencl (the :class:`~mpcore_opencl.runtime.Runtime` a CLArray belongs to does the device work),
so the backend imports it at module level and its per-op dispatch pays no import statements.

Native arrays are :class:`CLArray`: a device buffer holding a C-contiguous array (shape, dtype).
Kernels read strided views (transpose, broadcast, slicing) through their ``_s``/``_bc``
variants, so no kernel ever needs a non-contiguous input and every result is contiguous.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from mpcore.core.dtypes import ALL as ALL_DTYPES

# NumPy's dtype for every mpcore dtype name (bfloat16 comes from ml_dtypes).
NP_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in ALL_DTYPES}
NAMES: dict[np.dtype[Any], str] = {v: k for k, v in NP_DTYPES.items()}

#: NumPy type of a kernel's scalar argument in the compute type of a dtype.
SCALAR: dict[str, Any] = {
    "float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
    "float64": np.float64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "bool": np.uint8,
}

FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
#: The 16-bit float dtypes: stored in 16 bits, accumulated in float32.
LOW = ("float16", "bfloat16")
MAX_DIMS = 8
#: Kernels index with 32-bit ints (work-item ids, sizes): bigger launches are refused.
MAX_ITEMS = 2**31 - 1


class CLArray:
    """A C-contiguous array in a device buffer (the backend's native array)."""

    __slots__ = ("__weakref__", "base", "data", "dtype", "runtime", "shape", "size")

    def __init__(self, runtime: Any, shape: tuple[int, ...], dtype: np.dtype[Any],
                 data: Any = None, base: CLArray | None = None) -> None:
        self.runtime = runtime
        self.shape = shape
        self.dtype = dtype
        self.size = math.prod(shape)
        # Zero-size arrays still get a buffer so that every array can be a kernel argument.
        self.data = data if data is not None else runtime.allocate(max(self.size, 1)
                                                                   * dtype.itemsize)
        self.base = base  # a reshape shares its source's buffer and keeps it alive

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get(self) -> np.ndarray:
        """A host copy (NumPy array; bfloat16 through ml_dtypes)."""
        out = np.empty(self.shape, dtype=self.dtype)
        self.runtime.read(out, self.data)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CLArray({self.get()!r}, dtype={NAMES[self.dtype]})"



def vec8(values: tuple[int, ...] | list[int]) -> np.ndarray:
    """Up to 8 ints right-aligned in an OpenCL int8 argument (padding: size 1, stride 0)."""
    pad = MAX_DIMS - len(values)
    return np.array((1,) * pad + tuple(values), dtype=np.int32) if pad else np.array(
        values, dtype=np.int32)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def coalesce(shape: tuple[int, ...], *strides: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                         list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbours that are contiguous in every operand, so that
    most broadcasts need 2 or 3 dimensions and every view fits in MAX_DIMS."""
    dims = [(d, [s[i] for s in strides]) for i, d in enumerate(shape) if d != 1]
    merged: list[tuple[int, list[int]]] = []
    for d, st in dims:
        if merged:
            pd, pst = merged[-1]
            if all(ps == s * d for ps, s in zip(pst, st)):
                merged[-1] = (pd * d, st)
                continue
        merged.append((d, st))
    if not merged:
        return (), [() for _ in strides]
    return (tuple(d for d, _ in merged),
            [tuple(st[k] for _, st in merged) for k in range(len(strides))])
