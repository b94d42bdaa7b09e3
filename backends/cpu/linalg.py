"""The CPU backend's GEMM routes: 16-bit matmuls through float32 GEMM, and the fused dense
kernel.

NumPy's own float16 matmul is hundreds of times slower than float32; it is never called. The
float32 copy of a 16-bit GEMM operand is remembered (:class:`Upcasts`), so the forward and
backward GEMMs that share an operand convert it once; the fused ``dense`` kernel adds the bias
and applies the activation in float32, rounding once.

GEMMs print no floating-point warnings, in any dtype: a loss-scale overflow puts Inf in a
step's gradients routinely and the all-finite check skips that step, so NumPy's "invalid value
encountered in matmul" would only point the user at this file (and the oneDNN provider's GEMMs
never warned, so whether one appeared hung on the operands' size). Elementwise and reduction
kernels keep NumPy's float32 warnings, as an op a user writes.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
from mpcore_xp import F32, LOW

from .elementwise import quiet

_ZERO32 = np.zeros((), F32)


class Upcasts:
    """The float32 copies of the last few 16-bit arrays that a GEMM converted, by identity.

    A training step multiplies each 16-bit activation, weight and gradient by two GEMMs (the
    forward and one backward, or the two backward ones), and each would convert it again. The
    copies are internal (never handed out as a kernel's result, so nothing writes into them);
    the 16-bit arrays are immutable by the kernel contract, and a weak reference proves that an
    entry's array is still the one that was converted (ids are reused after collection)."""

    def __init__(self, converter: Any, size: int = 16) -> None:
        self.size = size
        self.converter = converter
        self._entries: OrderedDict[int, tuple[Any, np.ndarray]] = OrderedDict()

    def get(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == F32:
            return x
        key = id(x)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is x:
            self._entries.move_to_end(key)
            return entry[1]
        up = self.converter(x, F32)
        try:
            ref = weakref.ref(x)
        except TypeError:  # NumPy scalars cannot be weakly referenced: nothing to reuse
            return up
        entries = self._entries
        for dead in [k for k, (r, _) in entries.items() if r() is None]:
            del entries[dead]   # free the copies of arrays that are gone
        entries[key] = (ref, up)
        if len(entries) > self.size:
            entries.popitem(last=False)
        return up

    def clear(self) -> None:
        self._entries.clear()


class CpuLinalg:
    """Mixed into CpuBackend, whose ``buffer`` gives the outputs and ``convert`` rounds."""

    buffer: Any
    convert: Any

    def matmul(self, a: np.ndarray, b: np.ndarray, transpose_a: bool,
               transpose_b: bool) -> np.ndarray:
        dtype = a.dtype
        if dtype in LOW:
            # float32 GEMM, float32 accumulation; round once at the end
            a, b = self.upcast(a), self.upcast(b)
        # BLAS reads a transposed view in place (no copy)
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        out = self._gemm(a, b)
        return self.convert(out, dtype) if dtype in LOW else out

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b``; a 2-D float32 result goes into a recycled buffer."""
        # Inf * 0 in a gradient is routine (a loss-scale overflow) and the all-finite check
        # handles it; NumPy's warning would point the user at this line for nothing
        with quiet():
            if a.ndim == 2 and b.ndim == 2 and a.dtype == F32 and b.dtype == F32:
                return np.matmul(a, b, out=self.buffer((a.shape[0], b.shape[1]), F32))
            return np.matmul(a, b)

    def upcast(self, x: np.ndarray) -> np.ndarray:
        """``x`` in float32 for a GEMM (read only: it may be shared with later calls)."""
        cache = self.__dict__.get("_upcasts")
        if cache is None:
            cache = self.__dict__["_upcasts"] = Upcasts(self.convert)
        return cache.get(x)

    def dense(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
              activation: str | None) -> np.ndarray:
        """``activation(x @ w + b)``: the bias and the activation are applied in place on the
        float32 GEMM result, and 16-bit results are rounded once, at the end."""
        dtype = x.dtype
        low = dtype in LOW
        xs, ws = (self.upcast(x), self.upcast(w)) if low else (x, w)
        flat = xs.reshape(-1, xs.shape[-1]) if xs.ndim > 2 else xs
        z = self._gemm(flat, ws)
        if xs.ndim > 2:
            z = z.reshape(*xs.shape[:-1], ws.shape[-1])   # (-1 cannot be inferred for 0 rows)
        if b is not None:
            with quiet():  # Inf + -Inf, as in the GEMM
                z += self.convert(b, F32) if low else b
        if activation == "relu":
            np.maximum(z, _ZERO32 if z.dtype == F32 else np.zeros((), z.dtype), out=z)
        elif activation is not None:
            raise ValueError(f"dense: unknown activation {activation!r}; the kernel fuses "
                             "'relu' or None")
        return self.convert(z, dtype) if low else z
