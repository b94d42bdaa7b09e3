"""The CUDA backend's host interop, casts, copies and random numbers (``kernels.cu``), and the
one-hot kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import DTYPES, F32, I64

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid

_CAST_FLOATS = frozenset({F32, DTYPES["float16"], DTYPES["bfloat16"]})


class CudaCreation:
    """Mixed into CudaBackend."""

    cp: Any
    _contig: Any

    def asarray(self, value: Any, dtype: str) -> Any:
        cp = self.cp
        dt = DTYPES[dtype]
        if isinstance(value, cp.ndarray):
            return value if value.dtype == dt else self.cast(value, dtype)
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # another device's array (PyOpenCL) through the host
        return cp.asarray(np.asarray(value, dtype=dt))

    def to_host(self, x: Any) -> np.ndarray:
        host = self.cp.asnumpy(x)
        host.flags.writeable = False  # as on the CPU: t.numpy() must not look editable
        return host

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> Any:
        if dtype == "bfloat16":  # through this backend's own cast: CuPy's bfloat16 is new
            return self.cast(self.cp.full(shape, value, dtype=F32), dtype)
        return super().full(shape, value, dtype)

    def cast(self, x: Any, dtype: str) -> Any:
        dt = DTYPES[dtype]
        if x.dtype in _CAST_FLOATS and dt in _CAST_FLOATS and x.dtype != dt:
            x = self._contig(x)
            out = self.cp.empty(x.shape, dtype=dt)
            if x.size:
                _k.function(_k.template("cast_kernel", CTYPE[x.dtype], CTYPE[dt]))(
                    grid(x.size), (BLOCK,), (x, out, np.int64(x.size)))
            return out
        return x.astype(dt)

    def copy(self, x: Any) -> Any:
        return self.cp.array(x, copy=True, order="C")

    def _random(self, kernel: str, shape: tuple[int, ...], dtype: str, seed: int,
                a: float, b: float) -> Any:
        dt = DTYPES[dtype]
        kdt = dt if dt in KERNEL_FLOATS else F32
        out = self.cp.empty(shape, dtype=kdt)
        if out.size:
            _k.function(_k.template(kernel, CTYPE[kdt]))(
                grid(out.size), (BLOCK,),
                (out, np.int64(out.size), np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float64(a),
                 np.float64(b)))
        return out if kdt == dt else out.astype(dt)

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> Any:
        return self._random("rand_uniform", shape, dtype, seed, minval, maxval)

    def random_permutation(self, n: int, seed: int) -> Any:
        # drawn on the host as the CPU backend draws it: the same order on every backend
        return self.cp.asarray(np.random.Generator(np.random.PCG64(seed)).permutation(n))

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> Any:
        return self._random("rand_normal", shape, dtype, seed, mean, stddev)

    def one_hot(self, indices: Any, depth: int, dtype: str) -> Any:
        dt = DTYPES[dtype]
        if dt not in KERNEL_FLOATS:
            return super().one_hot(indices, depth, dtype)
        idx = self._contig(indices.astype(I64, copy=False))
        out = self.cp.empty((*idx.shape, depth), dtype=dt)
        if out.size:
            _k.function(_k.template("one_hot", CTYPE[dt]))(
                grid(out.size), (BLOCK,), (idx, out, np.int64(out.size), np.int64(depth)))
        return out
