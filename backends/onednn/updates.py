"""The CPU backend's fused RMSprop update on both cores, through oneDNN binary primitives.

The CPU backend's ``rmsprop_update`` (mpcore_cpu.train_kernels) runs NumPy over L2-sized blocks
on one thread: 2.3 ms per million weights inside a training step here, the largest cost of the
step after the GEMMs. The same float32 operations in the same order, as five oneDNN passes on
oneDNN's OpenMP team, give identical bits in 1.7 ms per million (medians of 15, each after a
GEMM as in a step, on this 2-core Xeon):

    tmp = (g * g) * (1 - rho)          mul, linear(1 - rho, 0): g * g >= 0, so no -0 issue
    ms  = ms * rho + tmp               mul by a scalar, add
    tmp = sqrt(ms + epsilon)           add a scalar, sqrt
    tmp = (g * -lr) / tmp              mul by a scalar, div: -(g * lr / tmp) exactly
    var = var + tmp                    add: var - g * lr / tmp exactly, signed zeros included

Momentum, other dtypes, strided arrays and arrays under :data:`MIN_ELEMENTS` go to the CPU
backend's own kernel (for small arrays five primitive launches cost more than they save).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .elementwise import BinaryCache

#: Below this many elements the NumPy kernel is faster (about 75 us of launch overhead).
MIN_ELEMENTS = 1 << 17

_F32 = np.dtype(np.float32)


def _eligible(*arrays: np.ndarray) -> bool:
    first = arrays[0]
    return first.size >= MIN_ELEMENTS and all(
        a.dtype == _F32 and a.shape == first.shape and a.flags.c_contiguous for a in arrays)


def make_rmsprop_update(original: Callable[..., None], cache: BinaryCache,
                        alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None,
                        ) -> Callable[..., None]:
    """The ``rmsprop_update`` kernel (same signature and results as the CPU backend's) with
    large plain-RMSprop float32 updates done by oneDNN; ``alloc`` gives the scratch array."""

    def rmsprop_update(var: np.ndarray, grad: np.ndarray, ms: np.ndarray,
                       mom: np.ndarray | None, lr: float, rho: float, momentum: float,
                       epsilon: float, flag: Any) -> None:
        if mom is not None or momentum or not _eligible(var, grad, ms):
            return original(var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
        if flag is not None and not bool(flag):
            return None
        v, g, s = var.reshape(-1), grad.reshape(-1), ms.reshape(-1)
        tmp = (alloc or np.empty)(v.shape, _F32)
        # hyperparameters rounded to float32 first, as the NumPy kernel does
        rate = np.float32(1.0 - rho)
        keep = np.array([rho], _F32)
        eps = np.array([epsilon], _F32)
        minus_lr = np.array([-np.float32(lr)], _F32)
        cache.run("mul", g, g, tmp, [("linear", float(rate), 0.0)])
        cache.run("mul", s, keep, s, [("add",)], [tmp])
        cache.run("add", s, eps, tmp, [("sqrt", 0.0, 0.0)])
        cache.run("mul", g, minus_lr, tmp, [("div",)], [tmp])
        cache.run("add", v, tmp, v)
        return None

    rmsprop_update.cache = cache  # type: ignore[attr-defined]
    rmsprop_update.original = original  # type: ignore[attr-defined]
    return rmsprop_update
