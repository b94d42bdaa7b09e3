"""The CPU backend's host interop, conversions, copies and random numbers.

NumPy converts float16 one element at a time (several times the cost of a float32 add), so
float16 training is bound by conversions, not by GEMMs. :func:`convert` takes the faster route
through ml_dtypes' complex32 (pairs of float16), identical to ``astype`` except for NaN
payloads, and every conversion the backend makes goes through :meth:`CpuCreation.convert`,
which a kernel provider can replace by registering a ``convert`` kernel (``mpcore[onnxruntime]``
does: vectorised F16C conversions) without any special case here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from mpcore_xp import DTYPES, F16, F32

from mpcore.core.backend import bind_call

from .elementwise import quiet
from .pool import POOL, aligned_empty

_C64 = np.dtype(np.complex64)
_C32 = np.dtype(ml_dtypes.complex32) if hasattr(ml_dtypes, "complex32") else None
#: The dtypes whose every value float32 holds exactly (widening them sets no FP flag).
_EXACT_IN_F32 = frozenset({F16, np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
                           np.dtype(ml_dtypes.float8_e5m2)})
#: Copies at least this large are cache-line aligned.
_ALIGNED_COPY_BYTES = 4096


def convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x.astype(dtype)`` (a new array: a recycled buffer of :data:`POOL` where large), faster
    between float32 and float16: ml_dtypes converts complex64 -> complex32 with a vectorised
    loop, so a contiguous array of even size is converted as pairs. The result equals
    ``astype`` bit for bit except that a NaN's payload is not kept (it stays a NaN of the same
    sign)."""
    src = x.dtype
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    pairs = None
    if (_C32 is not None and src != dtype and x.ndim and x.size % 2 == 0
            and x.flags.c_contiguous):
        if src == F32 and dtype == F16:
            pairs = (_C64, _C32)
        elif src == F16 and dtype == F32:
            pairs = (_C32, _C64)
    if pairs is None and (not x.ndim or x.size * dtype.itemsize < POOL.min_bytes):
        # (the pool hands out np.empty below its minimum: astype is that, in one call)
        if dtype == F32 and src in _EXACT_IN_F32:
            return x.astype(dtype)    # widening is exact: no overflow, no flag to quiet
        with quiet():
            return x.astype(dtype)
    out = POOL.empty(x.shape, dtype)
    with quiet():
        if pairs is not None:
            np.copyto(out.reshape(-1).view(pairs[1]), x.reshape(-1).view(pairs[0]),
                      casting="unsafe")
        else:
            np.copyto(out, x, casting="unsafe")
    return out


def _generator(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


class CpuCreation:
    """Mixed into CpuBackend."""

    _kernel_table: Any

    def asarray(self, value: Any, dtype: str) -> np.ndarray:
        # No copy when the value already is a NumPy array of that dtype: tensors are
        # immutable and Variables copy what they are given.
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # a device array (CuPy, PyOpenCL) moving to the host
        return np.asarray(value, dtype=DTYPES[dtype])

    def to_host(self, x: np.ndarray) -> np.ndarray:
        view = x.view() if isinstance(x, np.ndarray) else np.asarray(x)
        view.flags.writeable = False  # t.numpy() must not let a caller edit the tensor
        return view

    def cast(self, x: np.ndarray, dtype: str) -> np.ndarray:
        # float32 -> float16 overflow is inf, by design (convert keeps it quiet)
        return self.convert(np.asarray(x), DTYPES[dtype])

    def bind_cast(self, x: np.ndarray, dtype: str) -> Callable[[Any, str], np.ndarray]:
        """``cast`` for a traced step: straight to the converter that takes arrays like
        ``x`` (the providers' ``convert`` wrappers decide once, through their ``bind``)."""
        target = DTYPES[dtype]
        chosen = self._converter()
        converter = bind_call(chosen, np.asarray(x), target) or chosen
        table = self._kernel_table
        cast = table["cast"] if table is not None else self.cast

        def bound(x: Any, dtype_: str) -> np.ndarray:
            if dtype_ != dtype:
                return cast(x, dtype_)
            return converter(np.asarray(x), target)

        return bound

    def convert(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        """``x.astype(dtype)`` for every conversion this backend makes (casts, 16-bit GEMM
        operands and results, the fused kernels): a ``convert`` kernel from a kernel provider
        where one is installed, else :func:`convert`. A provider's ``convert(x, dtype)`` takes
        any array and a NumPy dtype and must return a new array equal to ``astype`` bit for
        bit (NaN payloads aside), falling back to :func:`convert` for what it does not
        handle."""
        return self._converter()(x, dtype)

    def _converter(self) -> Callable[[np.ndarray, Any], np.ndarray]:
        """The provider's ``convert`` kernel where one is installed, else :func:`convert`."""
        table = self._kernel_table
        fast = table.get("convert") if table is not None else None
        return fast or convert  # type: ignore[no-any-return]

    def copy(self, x: np.ndarray) -> np.ndarray:
        # Variables copy their values: large ones start on a cache line (see pool.py), as
        # weights are read by every GEMM and rewritten by every optimizer step
        x = np.asarray(x)
        if x.nbytes < _ALIGNED_COPY_BYTES:
            return np.array(x, copy=True)
        out = aligned_empty(x.shape, x.dtype)
        np.copyto(out, x)
        return out

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> np.ndarray:
        base = np.float64 if dtype == "float64" else np.float32
        out = _generator(seed).random(shape, dtype=base)
        if minval != 0.0 or maxval != 1.0:
            out *= maxval - minval
            out += minval
        return out.astype(DTYPES[dtype], copy=False)

    def random_permutation(self, n: int, seed: int) -> np.ndarray:
        return _generator(seed).permutation(n)

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> np.ndarray:
        base = np.float64 if dtype == "float64" else np.float32
        out = _generator(seed).standard_normal(shape, dtype=base)
        if stddev != 1.0:
            out *= stddev
        if mean != 0.0:
            out += mean
        return out.astype(DTYPES[dtype], copy=False)
