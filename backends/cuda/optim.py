"""The CUDA backend's loss-scaling check (multi-tensor, one device flag, no host read) and
fused optimizer updates (float32 master weights, in place, gated on the device flag)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import F32

from mpcore.core.tensor import Tensor

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid


def native(x: Any) -> Any:
    """The CuPy array of a flag given as a Tensor or as its native array."""
    return x._data if isinstance(x, Tensor) else x


class CudaOptim:
    """Mixed into CudaBackend."""

    cp: Any
    _contig: Any
    _true_flag: Any = None

    def _flag_or_true(self, flag: Any) -> Any:
        if flag is not None:
            return native(flag)
        if self._true_flag is None:
            self._true_flag = self.cp.ones((), dtype=np.bool_)
        return self._true_flag

    def _check_finite(self, xs: list[Any], inv_scale: float, write: bool,
                      inv_array: Any = None) -> tuple[list[Any], Any]:
        cp = self.cp
        flag = cp.ones((), dtype=np.bool_)
        outs: list[Any] = [None] * len(xs)
        groups: dict[Any, list[int]] = {}
        for i, x in enumerate(xs):
            if x.dtype in KERNEL_FLOATS:
                groups.setdefault(x.dtype, []).append(i)
            else:  # integer or bool tensors are finite; they still get their float32 copy
                outs[i] = ((x.astype(F32) * (np.float32(inv_scale) if inv_array is None
                                             else inv_array)) if write else None)
        null = np.uint64(0)
        for dtype, members in groups.items():
            fn = _k.function(_k.template("unscale_check", CTYPE[dtype]))
            for start in range(0, len(members), _k.MULTI_TENSOR):
                chunk = members[start:start + _k.MULTI_TENSOR]
                ins, ys, ns = [], [], []
                for i in chunk:
                    x = self._contig(xs[i])
                    ins.append(x)
                    if write:
                        outs[i] = cp.empty(x.shape, dtype=F32)
                        ys.append(outs[i])
                    else:
                        ys.append(null)
                    ns.append(np.int64(x.size))
                pad = _k.MULTI_TENSOR - len(chunk)
                longest = max(int(v) for v in ns)
                if longest == 0:
                    continue
                grid = (max(1, min((longest + BLOCK - 1) // BLOCK, 4096)), len(chunk))
                fn(grid, (BLOCK,), (np.int32(len(chunk)), np.float32(inv_scale),
                                     null if inv_array is None else inv_array, flag,
                                     *ins, *([null] * pad), *ys, *([null] * pad),
                                     *ns, *([np.int64(0)] * pad)))
        return outs, flag

    def unscale_and_check(self, grads: list[Any], inv_scale: float) -> tuple[list[Any], Any]:
        """float32 ``g * inv_scale`` for every gradient and one device bool (all finite),
        with one launch per 8 gradients of a dtype and no host read."""
        return self._check_finite(grads, inv_scale, True)

    def unscale_and_check_by(self, grads: list[Any], inv_scale: Any) -> tuple[list[Any], Any]:
        """``unscale_and_check`` with the reciprocal of a device loss scale (a float32 array
        of shape ()), read by the kernel: no host read."""
        return self._check_finite(grads, 1.0, True, self._contig(inv_scale))

    def loss_scale_update(self, scale: Any, inv_scale: Any, counters: Any, flag: Any,
                          period: int, multiplier: float, floor: float, ceiling: float,
                          hysteresis: int, latch: int) -> None:
        """A dynamic loss scale's update in place, on the device (one thread)."""
        _k.function("loss_scale_update")(
            (1,), (1,), (scale, inv_scale, counters, native(flag), np.int64(period),
                         np.float32(multiplier), np.float32(floor), np.float32(ceiling),
                         np.int64(hysteresis), np.int64(latch)))

    def all_finite(self, xs: list[Any]) -> Any:
        return self._check_finite(xs, 1.0, False)[1]

    def _fusable(self, *arrays: Any) -> bool:
        return all(a is None or (a.dtype == F32 and a.flags.c_contiguous) for a in arrays)

    def _gated(self, var: Any, new: Any, flag: Any) -> None:
        """The unfused fallback: write ``new`` into ``var`` where the device flag holds."""
        var[...] = new if flag is None else self.cp.where(native(flag), new, var)

    def _rate_array(self, lr: Any) -> Any:
        """A rate given as a device scalar (a schedule's), as the kernels read it: float32,
        one element."""
        return lr.astype(F32, copy=False).reshape(-1)

    def sgd_update(self, var: Any, grad: Any, velocity: Any, lr: Any, momentum: float,
                   nesterov: bool, flag: Any) -> None:
        if not self._fusable(var, grad, velocity):
            if not isinstance(lr, (int, float)):
                lr = lr.astype(F32, copy=False).reshape(())
            g = grad.astype(var.dtype, copy=False)
            if velocity is None:
                self._gated(var, var - lr * g, flag)
                return
            v = momentum * velocity - lr * g
            self._gated(var, var + (momentum * v - lr * g if nesterov else v), flag)
            self._gated(velocity, v, flag)
            return
        _k.function("sgd_update")(
            grid(var.size), (BLOCK,),
            (var, grad, velocity if velocity is not None else np.uint64(0), np.int64(var.size),
             np.float32(lr if isinstance(lr, (int, float)) else 0.0),
             np.uint64(0) if isinstance(lr, (int, float)) else self._rate_array(lr),
             np.float32(momentum), np.int32(bool(nesterov)),
             self._flag_or_true(flag)))

    def rmsprop_update(self, var: Any, grad: Any, ms: Any, mom: Any, lr: Any, rho: float,
                       momentum: float, epsilon: float, flag: Any) -> None:
        if not self._fusable(var, grad, ms, mom):
            if not isinstance(lr, (int, float)):
                lr = lr.astype(F32, copy=False).reshape(())
            g = grad.astype(var.dtype, copy=False)
            a = rho * ms + (1 - rho) * g * g
            inc = lr * g / self.cp.sqrt(a + epsilon)
            if mom is not None:
                m = momentum * mom + inc
                self._gated(var, var - m, flag)
                self._gated(mom, m, flag)
            else:
                self._gated(var, var - inc, flag)
            self._gated(ms, a, flag)
            return
        _k.function("rmsprop_update")(
            grid(var.size), (BLOCK,),
            (var, grad, ms, mom if mom is not None else np.uint64(0), np.int64(var.size),
             np.float32(lr if isinstance(lr, (int, float)) else 0.0),
             np.uint64(0) if isinstance(lr, (int, float)) else self._rate_array(lr),
             np.float32(rho), np.float32(1.0 - rho), np.float32(momentum),
             np.float32(epsilon), self._flag_or_true(flag)))

    def adam_rates(self, iterations: Any, lr: Any, beta1: float, beta2: float,
                   weight_decay: float) -> Any:
        """Adam's (alpha, lr*weight_decay), float32 (2,), computed on the device in double
        (one thread) from the step count and the rate (a number or an array of one element,
        a schedule's: float64, a float32 one widened exactly)."""
        rates = self.cp.empty((2,), dtype=F32)
        array = lr.astype(np.float64).reshape(-1) if not isinstance(lr, (int, float)) else None
        _k.function("adam_rates")(
            (1,), (1,), (iterations, array if array is not None else np.uint64(0),
                         np.float64(0.0 if array is not None else lr), np.float64(beta1),
                         np.float64(beta2), np.float64(weight_decay), rates))
        return rates

    def adam_update(self, var: Any, grad: Any, m: Any, v: Any, rates: Any, beta1: float,
                    beta2: float, epsilon: float, weight_decay: float, flag: Any) -> None:
        # Keras Adam: alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (adam_rates, on the
        # device); AdamW decays first.
        if not self._fusable(var, grad, m, v):
            g = grad.astype(var.dtype, copy=False)
            alpha = rates[0].astype(var.dtype)
            w = var - rates[1].astype(var.dtype) * var if weight_decay else var
            mi = m + (g - m) * (1 - beta1)
            vi = v + (g * g - v) * (1 - beta2)
            self._gated(var, w - alpha * mi / (self.cp.sqrt(vi) + epsilon), flag)
            self._gated(m, mi, flag)
            self._gated(v, vi, flag)
            return
        _k.function("adam_update")(
            grid(var.size), (BLOCK,),
            (var, grad, m, v, np.int64(var.size), rates, np.float32(1.0 - beta1),
             np.float32(1.0 - beta2), np.float32(epsilon), np.int32(bool(weight_decay)),
             self._flag_or_true(flag)))
