"""The CUDA backend's reductions: 16-bit sums and means accumulate in float32, a 16-bit bias
gradient is a cuBLAS GEMV, and bfloat16 compares go through float32 (exact)."""

from __future__ import annotations

from typing import Any

from mpcore_xp import BF16, F32, LOW


class CudaReduce:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    matmul: Any
    _gemm_native: Any

    def sum(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if (x.ndim == 2 and axis == (0,) and x.shape[0] > 1 and x.size
                and x.dtype in LOW and self._gemm_native(x.dtype)):
            # A 16-bit bias gradient: ones(1, N) @ x is a cuBLAS GEMV with coalesced reads and
            # float32 accumulation, where a column reduction reads with a stride of a row.
            # (Not for float32: with CUPY_TF32=1 the GEMV would round its inputs to TF32.)
            out = self.matmul(self.cp.ones((1, x.shape[0]), dtype=x.dtype), x, False, False)
            return out if keepdims else out.reshape(x.shape[1])
        if x.dtype in LOW:
            return self._in_float32(self.cp.sum, x, axis, keepdims)
        return self.cp.sum(x, axis=axis, keepdims=keepdims)

    def mean(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype in LOW:
            return self._in_float32(self.cp.mean, x, axis, keepdims)
        return self.cp.mean(x, axis=axis, keepdims=keepdims)

    def _in_float32(self, reduction: Any, x: Any, axis: Any, keepdims: bool) -> Any:
        """A 16-bit reduction accumulated in float32 and rounded once (bfloat16 read as float32
        first: CuPy's bfloat16 loops are new)."""
        src = self.cast(x, "float32") if x.dtype == BF16 else x
        return self.cast(reduction(src, axis=axis, dtype=F32, keepdims=keepdims), x.dtype.name)

    # bfloat16 comparisons go through float32 (exact): CuPy 14's bfloat16 reductions are new.
    def max(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype == BF16:
            return self.cast(super().max(self.cast(x, "float32"), axis, keepdims), "bfloat16")
        return super().max(x, axis, keepdims)

    def min(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype == BF16:
            return self.cast(super().min(self.cast(x, "float32"), axis, keepdims), "bfloat16")
        return super().min(x, axis, keepdims)

    def argmax(self, x: Any, axis: int) -> Any:
        if x.dtype == BF16:
            x = self.cast(x, "float32")
        return super().argmax(x, axis)
