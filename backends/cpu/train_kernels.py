"""Fused optimizer updates of the CPU backend: in place over float32 master weights.

Each kernel performs the same float32 operations in the same order as the optimizer's composite
path in :mod:`mpcore.optimizers` (Python-float hyperparameters rounded to float32 first), so the
two paths agree bit for bit; they only save the temporaries and the Python dispatch. ``flag`` is
None or the 0-d bool from ``unscale_and_check``; when it is false nothing is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_f32 = np.float32


def _skip(flag: Any) -> bool:
    return flag is not None and not bool(flag)


class TrainKernels:
    """Mixed into CpuBackend."""

    def sgd_update(self, var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None,
                   lr: float, momentum: float, nesterov: bool, flag: Any) -> None:
        if _skip(flag):
            return
        step = grad * _f32(lr)
        if velocity is None:
            var -= step
            return
        velocity *= _f32(momentum)
        velocity -= step
        if nesterov:
            update = velocity * _f32(momentum)
            update -= step
            var += update
        else:
            var += velocity

    def rmsprop_update(self, var: np.ndarray, grad: np.ndarray, ms: np.ndarray,
                       mom: np.ndarray | None, lr: float, rho: float, momentum: float,
                       epsilon: float, flag: Any) -> None:
        if _skip(flag):
            return
        ms *= _f32(rho)
        sq = grad * grad
        sq *= _f32(1.0 - rho)
        ms += sq
        denom = ms + _f32(epsilon)
        np.sqrt(denom, out=denom)
        increment = grad * _f32(lr)
        increment /= denom
        if mom is None:
            var -= increment
            return
        mom *= _f32(momentum)
        mom += increment
        var -= mom

    def adam_update(self, var: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
                    lr: float, beta1: float, beta2: float, epsilon: float, step: int,
                    weight_decay: float, flag: Any) -> None:
        if _skip(flag):
            return
        if weight_decay:
            var -= var * _f32(lr * weight_decay)
        alpha = lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        d = grad - m
        d *= _f32(1.0 - beta1)
        m += d
        d = grad * grad
        d -= v
        d *= _f32(1.0 - beta2)
        v += d
        denom = np.sqrt(v)
        denom += _f32(epsilon)
        update = m * _f32(alpha)
        update /= denom
        var -= update
