"""The optional ``batch_norm``, ``batch_norm_grad``, ``layer_norm`` and ``layer_norm_grad``
kernels of the CPU backend on oneDNN's normalization primitives (:class:`~.norm.NormCache`),
for the dtypes the plugin chose (float32; bfloat16 where the core hands it over; float16 as
float32, see below); float64,
empty arrays and anything oneDNN fails on go to the CPU backend's NumPy kernels, so installing
these changes no result but the speed and the rounding (a few ulps: oneDNN sums in its own
order).

A oneDNN failure (a problem this library has no implementation for, an error while creating
a primitive) is never fatal: that problem goes to the NumPy kernel from then on, and the
failure is logged once (logger ``mpcore``) and kept in :attr:`NormKernels.failures`.

Non-finite values: a NaN or an infinity in a channel (a row, for layer normalization) makes
its statistics NaN and every output of that channel NaN, as the NumPy kernels do
(tests/backends/cpu/test_cpu_providers_nonfinite.py).

float16 has no normalization primitive on CPUs without avx512_fp16, and the NumPy kernel
reads it through float32 too, but sweeps the data five or six times in NumPy: a float16
problem runs on oneDNN's float32 primitive instead, its full-size operands widened and its
full-size result rounded once to float16 through the backend's ``cast`` (vectorised where
ONNX Runtime is installed), which is what the NumPy kernel computes, summed in oneDNN's order.

The returned ``inv_std`` is ``1 / sqrt(var + epsilon)`` computed from oneDNN's variance in
NumPy, the NumPy kernel's formula: the moving statistics and the backward pass see the same
value whichever kernel ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from .dnnl import float16_as_float32, kernel_table, run_or_remember
from .norm import BATCH, LAYER, Alloc, NormCache

Kernel = Callable[..., Any]
NAMES = ("batch_norm", "batch_norm_grad", "layer_norm", "layer_norm_grad")


class NormKernels:
    """The four kernels over one :class:`NormCache`: ``dtypes`` (oneDNN names) go to oneDNN,
    the rest to ``fallback`` (name -> the CPU backend's kernel); ``alloc`` gives the
    full-size results."""

    def __init__(self, cache: NormCache, dtypes: frozenset[str], fallback: dict[str, Kernel],
                 alloc: Alloc | None = None, cast: Kernel | None = None) -> None:
        self.cache = cache
        #: the backend's cast (its float16 conversions are vectorised where NumPy's are not)
        self.cast = cast or (lambda x, dtype: x.astype(dtype))
        self.dtypes = {DTYPES[d] for d in dtypes}
        self.fallback = fallback
        self.alloc = alloc
        #: problem -> why oneDNN could not run it (those problems take the NumPy kernel)
        self.failures: dict[tuple[Any, ...], str] = {}

    def table(self) -> dict[str, Kernel]:
        """The kernels by name, each carrying ``cache`` and ``norm`` (this object)."""
        return kernel_table(self, NAMES, "norm")

    def _onednn(self, name: str, x: np.ndarray, epsilon: float,
                run: Callable[[], Any]) -> Any:
        """``run()`` where oneDNN takes this problem, else None (the caller's fallback)."""
        if x.dtype not in self.dtypes or x.ndim < 1 or x.size == 0:
            return None
        key = (name, x.shape[-1], x.size // x.shape[-1], x.dtype.name, epsilon)
        return run_or_remember(self.failures, key, run, name, "NumPy kernel")

    def _wide(self, x: np.ndarray) -> np.ndarray:
        return self.cast(x, "float32")  # type: ignore[no-any-return]

    def batch_norm(self, x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                   epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(y, mean, biased variance, inv_std) over every axis but the last."""
        if float16_as_float32(self.dtypes, x) and x.ndim >= 2 and x.size:
            y, mean, var, inv = self.batch_norm(self._wide(x), gamma, beta, epsilon)
            return self.cast(y, "float16"), mean, var, inv
        if x.ndim >= 2:
            out = self._onednn("batch_norm", x, float(epsilon),
                               lambda: self.cache.forward(BATCH, x, gamma, beta, epsilon,
                                                          self.alloc))
            if out is not None:
                y, mean, var = out
                return y, mean, var, _inv_std(var, epsilon)
        return self.fallback["batch_norm"](x, gamma, beta, epsilon)  # type: ignore[no-any-return]

    def batch_norm_grad(self, dy: np.ndarray, x: np.ndarray, mean: np.ndarray,
                        inv_std: np.ndarray, gamma: np.ndarray | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dx, dgamma, dbeta) of :meth:`batch_norm`."""
        if (float16_as_float32(self.dtypes, dy, x) and x.ndim >= 2 and x.size
                and dy.shape == x.shape):
            dx, dgamma, dbeta = self.batch_norm_grad(self._wide(dy), self._wide(x), mean,
                                                     inv_std, gamma)
            return self.cast(dx, "float16"), dgamma, dbeta
        if x.ndim >= 2 and dy.dtype == x.dtype and dy.shape == x.shape:
            out = self._onednn("batch_norm_grad", x, 0.0,
                               lambda: self.cache.backward(BATCH, dy, x, mean, inv_std, gamma,
                                                           self.alloc))
            if out is not None:
                return out  # type: ignore[no-any-return]
        return self.fallback["batch_norm_grad"](dy, x, mean, inv_std,  # type: ignore[no-any-return]
                                                gamma)

    def layer_norm(self, x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                   epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(y, mean, inv_std) of each row over the last axis."""
        if float16_as_float32(self.dtypes, x) and x.size:
            y, mean, inv = self.layer_norm(self._wide(x), gamma, beta, epsilon)
            return self.cast(y, "float16"), mean, inv
        out = self._onednn("layer_norm", x, float(epsilon),
                           lambda: self.cache.forward(LAYER, x, gamma, beta, epsilon,
                                                      self.alloc))
        if out is not None:
            y, mean, var = out
            return y, mean, _inv_std(var, epsilon)   # (one per row, flat: as NumPy's)
        return self.fallback["layer_norm"](x, gamma, beta, epsilon)  # type: ignore[no-any-return]

    def layer_norm_grad(self, dy: np.ndarray, x: np.ndarray, mean: np.ndarray,
                        inv_std: np.ndarray, gamma: np.ndarray | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dx, dgamma, dbeta) of :meth:`layer_norm`."""
        if float16_as_float32(self.dtypes, dy, x) and x.size and dy.shape == x.shape:
            dx, dgamma, dbeta = self.layer_norm_grad(self._wide(dy), self._wide(x), mean,
                                                     inv_std, gamma)
            return self.cast(dx, "float16"), dgamma, dbeta
        if dy.dtype == x.dtype and dy.shape == x.shape:
            out = self._onednn("layer_norm_grad", x, 0.0,
                               lambda: self.cache.backward(LAYER, dy, x, mean.reshape(-1),
                                                           inv_std.reshape(-1), gamma,
                                                           self.alloc))
            if out is not None:
                return out  # type: ignore[no-any-return]
        return self.fallback["layer_norm_grad"](dy, x, mean, inv_std,  # type: ignore[no-any-return]
                                                gamma)


def _inv_std(var: np.ndarray, epsilon: float) -> np.ndarray:
    """``1 / sqrt(var + epsilon)`` in float32, as the NumPy kernels compute it."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (1.0 / np.sqrt(var + np.float32(epsilon))).astype(np.float32, copy=False)
