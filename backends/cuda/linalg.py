"""The CUDA backend's GEMM routes: 2-D GEMMs through ``cupy.matmul`` (cuBLAS ``gemmEx``, 16-bit
inputs with float32 accumulation, tensor cores where the GPU has them); batched (and 1x1)
16-bit GEMMs through cuBLAS ``gemmStridedBatchedEx`` directly, because CuPy's batched matmul
upcasts float16 to float32 and fails on bfloat16, and its 1x1 product is a 16-bit reduction.
Below the compute capability of a dtype's tensor cores the GEMM runs in float32 and rounds once,
as the verdict says."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mpcore_xp import BF16, F16, LOW

from mpcore.plugins.settings import env_choice

from .rules import TENSOR_CORE_CAPABILITY

# cuBLAS constants (cublas_api.h, library_types.h): stable across CUDA 11-13.
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_CUDA_R = {F16: 2, BF16: 14}
_ONE = np.ones((), np.float32)   # host-pointer alpha and beta for cuBLAS
_ZERO = np.zeros((), np.float32)


#: The routes of 2-D 16-bit GEMMs (``MPCORE_CUDA_GEMM16``): ``cupy.matmul`` (cuBLAS
#: ``gemmEx``), or ``gemmStridedBatchedEx`` with a batch of one, the batched route. A switch
#: to compare them on a GPU (``benchmarks/cuda_profile.py``), not a tuning knob.
GEMM16_ROUTES = ("cupy", "cublas")


def gemm16_route() -> str:
    """The 2-D 16-bit GEMM route ``MPCORE_CUDA_GEMM16`` names (a SettingError naming the valid
    ones on a bad value)."""
    return env_choice("MPCORE_CUDA_GEMM16", GEMM16_ROUTES)


def strided_gemm_args(a_shape: tuple[int, ...], b_shape: tuple[int, ...], transpose_a: bool,
                      transpose_b: bool) -> tuple[int, ...]:
    """cuBLAS ``gemmStridedBatchedEx`` arguments (transa, transb, m, n, k, lda, strideA, ldb,
    strideB, ldc, strideC, batchCount) for the row-major, C-contiguous ``C = op(a) @ op(b)``
    of shape (..., M, N) with inner dimension K.

    cuBLAS is column-major, and a row-major matrix is its transpose in column-major order, so
    this computes ``C^T = op(b)^T op(a)^T``: cuBLAS's A is ``b``, its B is ``a``, and its
    (m, n, k) are (N, M, K)."""
    m = a_shape[-1] if transpose_a else a_shape[-2]
    k = a_shape[-2] if transpose_a else a_shape[-1]
    n = b_shape[-2] if transpose_b else b_shape[-1]
    return (_CUBLAS_OP_T if transpose_b else _CUBLAS_OP_N,
            _CUBLAS_OP_T if transpose_a else _CUBLAS_OP_N, n, m, k,
            k if transpose_b else n, k * n, m if transpose_a else k, m * k, n, m * n,
            math.prod(a_shape[:-2]))


class CudaLinalg:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    _contig: Any
    _native_gemm: dict[Any, bool] | None = None
    _gemm16_direct = False

    def _gemm_native(self, dtype: Any) -> bool:
        """Whether 16-bit GEMMs of ``dtype`` run on tensor cores of the current GPU."""
        if self._native_gemm is None:
            self._gemm16_direct = gemm16_route() == "cublas"
            cc = self.device().capability
            major, minor = (int(p) for p in cc.split("."))
            self._native_gemm = {F16: (major, minor) >= TENSOR_CORE_CAPABILITY["float16"],
                                 BF16: (major, minor) >= TENSOR_CORE_CAPABILITY["bfloat16"]}
        return self._native_gemm[dtype]

    def matmul(self, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
        cp = self.cp
        dtype = a.dtype
        if dtype in LOW and not self._gemm_native(dtype):
            # No tensor cores for this dtype: a float32 GEMM, rounded once (the verdict says so)
            out = self.matmul(self.cast(a, "float32"), self.cast(b, "float32"), transpose_a,
                              transpose_b)
            return self.cast(out, dtype.name)
        rows = a.shape[-1] if transpose_a else a.shape[-2]
        cols = b.shape[-2] if transpose_b else b.shape[-1]
        if dtype in LOW and (a.ndim > 2 or (rows == 1 and cols == 1) or self._gemm16_direct):
            # cuBLAS directly: CuPy's batched matmul upcasts float16 and fails on bfloat16, and
            # its 2-D matmul computes a 1x1 product as a reduction in the 16-bit dtype
            return self._batched_gemm16(a, b, transpose_a, transpose_b)
        if a.ndim == 2:
            # cupy.matmul hands transposed views to cuBLAS as transpose flags, without a copy
            return cp.matmul(a.T if transpose_a else a, b.T if transpose_b else b)
        return cp.matmul(cp.swapaxes(a, -1, -2) if transpose_a else a,
                         cp.swapaxes(b, -1, -2) if transpose_b else b)

    def _batched_gemm16(self, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
        """Row-major batched C = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T."""
        cp = self.cp
        from cupy_backends.cuda.libs import cublas

        a, b = self._contig(a), self._contig(b)
        transa, transb, n, m, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch = (
            strided_gemm_args(a.shape, b.shape, transpose_a, transpose_b))
        out = cp.empty((*a.shape[:-2], m, n), dtype=a.dtype)
        if out.size == 0:
            return out
        if k == 0:
            out.fill(0)
            return out
        ctype = _CUDA_R[a.dtype]
        # The wrapper puts the handle on CuPy's current stream; alpha and beta are host float32
        # (CuPy keeps the handle in host pointer mode; compute type 32F takes float scalars).
        cublas.gemmStridedBatchedEx(
            cp.cuda.device.get_cublas_handle(), transa, transb, n, m, k,
            _ONE.ctypes.data, b.data.ptr, ctype, lda, stride_a,
            a.data.ptr, ctype, ldb, stride_b,
            _ZERO.ctypes.data, out.data.ptr, ctype, ldc, stride_c,
            batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
        return out
