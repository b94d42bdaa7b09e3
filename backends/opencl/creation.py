"""Creation and conversion kernels: host arrays in and out, fills, casts, copies, one-hot and
the counter-based random numbers (``kernels/random.cl``, whose dropout mask is in :mod:`nn`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import NP_DTYPES, CLArray
from .programs import KernelFamily


class CreationKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: asarray, to_host, full, cast,
    copy, one_hot, random_uniform, random_normal."""

    def asarray(self, value: Any, dtype: str) -> CLArray:
        if isinstance(value, CLArray) and value.runtime is self.runtime:
            return value if self._dt(value) == dtype else self.cast(value, dtype)
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # another device's array (CuPy, PyOpenCL) via the host
        with np.errstate(over="ignore", invalid="ignore"):
            host = np.asarray(value, dtype=NP_DTYPES[dtype])
        return self.runtime.upload(host)

    def to_host(self, x: CLArray) -> np.ndarray:
        out = x.get()
        out.flags.writeable = False
        return out

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> CLArray:
        out = self._empty(shape, dtype)
        self.runtime.launch(self._elementwise(dtype, dtype)["fill"], out.size, np.int32(out.size),
                            self._scalar(value, dtype), out.data)
        return out

    def cast(self, x: CLArray, dtype: str) -> CLArray:
        out = self._empty(x.shape, dtype)
        self.runtime.launch(self._elementwise(self._dt(x), dtype)["k_copy"], x.size,
                            np.int32(x.size), x.data, out.data)
        return out

    def copy(self, x: CLArray) -> CLArray:
        return self.cast(x, self._dt(x))

    def one_hot(self, indices: CLArray, depth: int, dtype: str) -> CLArray:
        indices = self._index_array(indices)
        out = self._empty((*indices.shape, depth), dtype)
        prog = self._prog("index.cl", ("A", dtype), ("O", dtype), ("L", self._dt(indices)))
        self.runtime.launch(prog["one_hot"], out.size, np.int32(out.size), np.int32(depth),
                            indices.data, out.data)
        return out

    def _random(self, kernel: str, shape: tuple[int, ...], dtype: str, seed: int, p: float,
                q: float) -> CLArray:
        """``kernel`` of ``random.cl`` over a new array: values from ``seed`` and position,
        with the distribution's two parameters ``p`` and ``q``."""
        out = self._empty(shape, dtype)
        prog = self._prog("random.cl", ("O", dtype))
        self.runtime.launch(prog[kernel], out.size, np.int32(out.size),
                            np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float32(p), np.float32(q),
                            out.data)
        return out

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> CLArray:
        return self._random("random_uniform", shape, dtype, seed, minval, maxval - minval)

    def random_permutation(self, n: int, seed: int) -> CLArray:
        # drawn on the host as the CPU backend draws it: the same order on every backend
        return self.runtime.upload(np.random.Generator(np.random.PCG64(seed)).permutation(n))

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> CLArray:
        return self._random("random_normal", shape, dtype, seed, mean, stddev)
