"""Loss-scaling checks and fused optimizer updates (``kernels/optim.cl``): unscale_and_check,
all_finite, and the SGD, RMSprop and Adam updates of float32/float64 master weights.

An update given the loss scale's finite flag skips itself on the device when the flag is false,
so a loss-scaled step needs no host read before its updates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import CLArray
from .programs import KernelFamily

#: The loss scale's divisions round as IEEE's (OpenCL allows 2.5 ulp otherwise).
_CORRECTLY_ROUNDED = ("-cl-fp32-correctly-rounded-divide-sqrt",)


class OptimKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: loss-scaling checks and the
    fused optimizer updates."""

    def _flag(self) -> CLArray:
        return self.full((), 1, "bool")

    def unscale_and_check(self, grads: list[CLArray],
                          inv_scale: float) -> tuple[list[CLArray], CLArray]:
        flag = self._flag()
        outs = []
        for g in grads:
            o = self._empty(tuple(g.shape), "float32")
            prog = self._prog("optim.cl", ("A", self._dt(g)))
            self.runtime.launch(prog["unscale"], g.size, np.int32(g.size),
                                np.float32(inv_scale), g.data, o.data, flag.data)
            outs.append(o)
        return outs, flag

    def unscale_and_check_by(self, grads: list[CLArray],
                             inv_scale: CLArray) -> tuple[list[CLArray], CLArray]:
        """``unscale_and_check`` with the reciprocal of a device loss scale, read on the
        device."""
        flag = self._flag()
        outs = []
        for g in grads:
            o = self._empty(tuple(g.shape), "float32")
            prog = self._prog("optim.cl", ("A", self._dt(g)))
            self.runtime.launch(prog["unscale_by"], g.size, np.int32(g.size), inv_scale.data,
                                g.data, o.data, flag.data)
            outs.append(o)
        return outs, flag

    def loss_scale_update(self, scale: CLArray, inv_scale: CLArray, counters: CLArray,
                          flag: CLArray, period: int, multiplier: float, floor: float,
                          ceiling: float, hysteresis: int, latch: int) -> None:
        """A dynamic loss scale's update in place, on the device (one work-item)."""
        prog = self._prog("optim.cl", ("A", "float32"), options=_CORRECTLY_ROUNDED)
        self.runtime.launch(prog["loss_scale_update"], 1, scale.data, inv_scale.data,
                            counters.data, flag.data, np.int64(period), np.float32(multiplier),
                            np.float32(floor), np.float32(ceiling), np.int64(hysteresis),
                            np.int64(latch))

    def all_finite(self, xs: list[CLArray]) -> CLArray:
        flag = self._flag()
        for x in xs:
            prog = self._prog("optim.cl", ("A", self._dt(x)))
            self.runtime.launch(prog["all_finite"], x.size, np.int32(x.size), x.data, flag.data)
        return flag

    def _update_args(self, var: CLArray, grad: CLArray, flag: Any) -> tuple[Any, Any, Any]:
        dt = self._dt(var)
        if dt not in ("float32", "float64"):
            raise TypeError(f"optimizer kernels update float32/float64 master weights, got {dt}")
        if self._dt(grad) != dt:
            grad = self.cast(grad, dt)
        if flag is None:
            return grad, np.int32(0), var.data  # any buffer: the kernel does not read it
        return grad, np.int32(1), flag.data

    def _rate_args(self, lr: Any, var: CLArray) -> tuple[Any, Any, Any]:
        """A rate as the kernels take it: a number, or a float32 device scalar (a schedule's
        rate) read by the kernel."""
        if isinstance(lr, CLArray):
            if self._dt(lr) != "float32":
                lr = self.cast(lr, "float32")
            return np.float32(0.0), np.int32(1), lr.data
        return np.float32(lr), np.int32(0), var.data  # any buffer: the kernel does not read it

    def sgd_update(self, var: CLArray, grad: CLArray, velocity: CLArray | None, lr: Any,
                   momentum: float, nesterov: bool, flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        vel = velocity.data if velocity is not None else var.data
        self.runtime.launch(prog["sgd"], var.size, np.int32(var.size),
                            *self._rate_args(lr, var), np.float32(momentum),
                            np.int32(bool(nesterov)), np.int32(velocity is not None),
                            use_flag, fbuf, var.data, grad.data, vel)

    def rmsprop_update(self, var: CLArray, grad: CLArray, ms: CLArray, mom: CLArray | None,
                       lr: Any, rho: float, momentum: float, epsilon: float,
                       flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        self.runtime.launch(prog["rmsprop"], var.size, np.int32(var.size),
                            *self._rate_args(lr, var), np.float32(rho),
                            np.float32(1.0 - rho), np.float32(momentum), np.float32(epsilon),
                            np.int32(mom is not None), use_flag, fbuf,
                            var.data, grad.data, ms.data,
                            (mom if mom is not None else ms).data)

    def adam_rates(self, iterations: CLArray, lr: Any, beta1: float, beta2: float,
                   weight_decay: float) -> CLArray:
        """Adam's (alpha, lr*weight_decay), float32 (2,), computed on the device (one
        work-item; in double where the device has cl_khr_fp64) from the step count and the
        rate (a number or a float64/float32 array of one element, a schedule's)."""
        rates = self._empty((2,), "float32")
        prog = self._prog("optim.cl", ("A", "float32"))
        real = np.float64 if self.runtime.fp64 else np.float32
        array = lr if isinstance(lr, CLArray) else None
        rate_dt = "float64" if self.runtime.fp64 else "float32"
        if array is not None and self._dt(array) != rate_dt:
            array = self.cast(array, rate_dt)      # (float32 to float64: exact)
        self.runtime.launch(prog["adam_rates"], 1, iterations.data, np.int32(array is not None),
                            (array if array is not None else rates).data,
                            real(0.0 if array is not None else lr), real(beta1), real(beta2),
                            real(weight_decay), rates.data)
        return rates

    def adam_update(self, var: CLArray, grad: CLArray, m: CLArray, v: CLArray,
                    rates: CLArray, beta1: float, beta2: float, epsilon: float,
                    weight_decay: float, flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        self.runtime.launch(prog["adam"], var.size, np.int32(var.size), rates.data,
                            np.float32(1.0 - beta1), np.float32(1.0 - beta2),
                            np.float32(epsilon), np.int32(bool(weight_decay)), use_flag, fbuf,
                            var.data, grad.data, m.data, v.data)
