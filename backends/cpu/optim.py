"""The CPU backend's loss-scaling checks and fused optimizer updates (in place over float32
master weights).

Each kernel performs the same float32 operations in the same order as the optimizer's composite
path in :mod:`mpcore.optimizers` (Python-float hyperparameters rounded to float32 first), so the
two paths agree bit for bit; they only save the temporaries and the Python dispatch. ``flag`` is
None or the 0-d bool from ``unscale_and_check``; when it is false nothing is written.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpcore_xp import F32, LOW

from mpcore.core.backend import same_values

from .elementwise import quiet

_f32 = np.float32
_F32_DTYPE = np.dtype(np.float32)
#: Elements per block: 128 KB of float32, so a block of each operand and the scratch fit in L2
#: (benchmarks/ measures the choice).
BLOCK = 32768


def _blocks(arrays: list[np.ndarray | None]) -> Iterator[tuple[Any, ...]]:
    """Matching flat blocks of ``arrays`` (None stays None), then two scratch blocks. Arrays
    that are updated in place must be contiguous (the caller checks with :func:`_flat`)."""
    flat = [None if a is None else a.reshape(-1) for a in arrays]
    n = flat[0].size  # type: ignore[union-attr]
    s1 = np.empty(min(BLOCK, n), np.float32)
    s2 = np.empty(min(BLOCK, n), np.float32)
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        yield (*(None if a is None else a[lo:hi] for a in flat), s1[:hi - lo], s2[:hi - lo])


def _flat(*arrays: np.ndarray | None) -> bool:
    """Whether the blocked path applies: float32, one shape, contiguous (so reshape(-1) is a
    view and in-place writes reach the arrays)."""
    first = arrays[0]
    assert first is not None
    shape = first.shape
    for a in arrays:
        if a is not None and not (a.dtype == _F32_DTYPE and a.shape == shape
                                  and a.flags.c_contiguous):
            return False
    return True


def _run(arrays: list[np.ndarray | None], body: Callable[..., None],
         fallback: Callable[[], None]) -> None:
    first = arrays[0]
    assert first is not None
    n = first.size
    if not (n and _flat(*arrays)):
        fallback()
    elif n <= BLOCK:   # one block (a bias, a small layer): no generator, no views of views
        body(*[None if a is None else a.reshape(-1) for a in arrays],
             np.empty(n, np.float32), np.empty(n, np.float32))
    else:
        for block in _blocks(arrays):
            body(*block)


def _skip(flag: Any) -> bool:
    return flag is not None and not bool(flag)


def is_all_finite(x: np.ndarray) -> bool:
    """Whether every value of ``x`` is finite, in one pass over it in the common case.

    Inf and NaN propagate through a sum of squares, so a finite ``x . x`` proves a finite
    tensor; only a non-finite one needs the exact check (large finite values can overflow the
    sum on their own). For float32/float64 the sum of squares is a BLAS dot, faster than
    ``x.sum()`` (NumPy's pairwise sum); 16-bit values are summed in float32."""
    if x.dtype in LOW:
        total = float(x.sum(dtype=F32))
    elif x.dtype.kind == "f" and x.flags.c_contiguous and x.dtype.itemsize >= 4:
        flat = x.reshape(-1)
        total = float(np.dot(flat, flat))
    else:
        total = float(x.sum())
    return math.isfinite(total) or bool(np.isfinite(x).all())


def _sgd(v: Any, g: Any, vel: Any, step: Any, update: Any,
         constants: tuple[np.float32, np.float32], nesterov: bool) -> None:
    """One block of SGD in place (``vel``: the momentum slot or None; ``step`` and
    ``update`` scratch), in the composite path's float32 operations and order."""
    rate, m_ = constants
    np.multiply(g, rate, out=step)
    if vel is None:
        v -= step
        return
    vel *= m_
    vel -= step
    if nesterov:
        np.multiply(vel, m_, out=update)
        update -= step
        v += update
    else:
        v += vel


def _rate(lr: Any) -> float:
    """A rate given as a number or a device scalar (a float32 array of shape (); a
    schedule's rate), read where it lies: the CPU's memory."""
    return float(lr.reshape(-1)[0]) if isinstance(lr, np.ndarray) else lr


def _sgd_constants(lr: float, momentum: float) -> tuple[np.float32, np.float32]:
    return _f32(_rate(lr)), _f32(momentum)


def _rmsprop_constants(lr: float, rho: float, momentum: float,
                       epsilon: float) -> tuple[np.float32, ...]:
    return _f32(rho), _f32(1.0 - rho), _f32(epsilon), _f32(_rate(lr)), _f32(momentum)


def _rmsprop(v: Any, g: Any, s: Any, mo: Any, sq: Any, inc: Any,
             constants: tuple[np.float32, ...]) -> None:
    """One block of RMSprop in place (``mo``: the momentum slot or None; ``sq`` and ``inc``
    scratch of the block's shape), in the composite path's float32 operations and order."""
    r, r1, e, step, m_ = constants
    s *= r
    np.multiply(g, g, out=sq)
    sq *= r1
    s += sq
    np.add(s, e, out=sq)            # denom
    np.sqrt(sq, out=sq)
    np.multiply(g, step, out=inc)
    inc /= sq
    if mo is None:
        v -= inc
        return
    mo *= m_
    mo += inc
    v -= mo


class CpuOptim:
    """Mixed into CpuBackend, whose ``buffer`` gives the outputs and ``convert`` widens."""

    buffer: Any
    convert: Any
    _kernel_table: Any

    def unscale_and_check(self, grads: list[np.ndarray],
                          inv_scale: float) -> tuple[list[np.ndarray], np.ndarray]:
        scale = np.float32(inv_scale)
        outs = []
        finite = True
        with quiet():
            for g in grads:
                if g.dtype == F32:
                    u = np.multiply(g, scale, out=self.buffer(g.shape, F32) if g.ndim else None)
                else:
                    u = self.convert(g, F32)  # always a fresh array: scaled in place below
                    u *= scale
                outs.append(u)
                if finite:
                    finite = is_all_finite(u)
        return outs, np.asarray(finite)

    def unscale_and_check_by(self, grads: list[np.ndarray],
                             inv_scale: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """``unscale_and_check`` with the reciprocal of a device loss scale (a float32 array
        of shape ()), through the table's kernel (oneDNN's where installed)."""
        return self._kernel_table["unscale_and_check"](grads, np.float32(inv_scale[()]))

    def loss_scale_update(self, scale: np.ndarray, inv_scale: np.ndarray, counters: np.ndarray,
                          flag: Any, period: int, multiplier: float, floor: float,
                          ceiling: float, hysteresis: int, latch: int) -> None:
        """A dynamic loss scale's update in place (``OPTIONAL_KERNELS``), float32 arithmetic."""
        s = _f32(scale[()])
        good, over, stuck, skipped = (int(c) for c in counters)
        if bool(flag):
            over = 0
            stuck = stuck if stuck >= latch else 0
            good += 1
            if good >= period:
                with np.errstate(over="ignore"):
                    grown = s * _f32(multiplier)
                if math.isfinite(grown):
                    s = min(grown, _f32(ceiling))
                good = 0
        else:
            good = 0
            if stuck < latch:
                stuck = stuck + 1 if s <= _f32(floor) else 0
            over += 1
            if over >= hysteresis:
                over = 0
                s = max(s / _f32(multiplier), _f32(floor))
            skipped += 1
        scale[()] = s
        inv_scale[()] = _f32(1.0) / s
        counters[:] = (good, over, stuck, skipped)

    def all_finite(self, xs: list[np.ndarray]) -> np.ndarray:
        with quiet():
            return np.asarray(all(is_all_finite(x) for x in xs))

    def sgd_update(self, var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None,
                   lr: float, momentum: float, nesterov: bool, flag: Any) -> None:
        if _skip(flag):
            return
        body = functools.partial(_sgd, constants=_sgd_constants(lr, momentum), nesterov=nesterov)
        _run([var, grad, velocity], body,
             lambda: body(var, grad, velocity, np.empty_like(var), np.empty_like(var)))

    def bind_sgd_update(self, var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None,
                        lr: float, momentum: float, nesterov: bool,
                        flag: Any) -> Callable[..., None] | None:
        """``sgd_update`` of one block for a traced step (as :meth:`bind_rmsprop_update`)."""
        if isinstance(lr, np.ndarray) or not (0 < var.size <= BLOCK
                                              and _flat(var, grad, velocity)):
            return None     # (a device rate: read at each call, by the kernel)
        constants = _sgd_constants(lr, momentum)
        shape, hyper = var.shape, (velocity is None, lr, momentum, nesterov)
        kernel = self._kernel_table["sgd_update"]

        def bound(var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None, lr: float,
                  momentum: float, nesterov: bool, flag: Any) -> None:
            if (isinstance(lr, np.ndarray)
                    or not same_values((velocity is None, lr, momentum, nesterov), hyper)
                    or var.shape != shape
                    or not _flat(var, grad, velocity)):
                return kernel(var, grad, velocity, lr, momentum, nesterov, flag)
            if not _skip(flag):
                _sgd(var, grad, velocity, np.empty(shape, _F32_DTYPE),
                     np.empty(shape, _F32_DTYPE), constants, nesterov)
            return None

        return bound

    def rmsprop_update(self, var: np.ndarray, grad: np.ndarray, ms: np.ndarray,
                       mom: np.ndarray | None, lr: float, rho: float, momentum: float,
                       epsilon: float, flag: Any) -> None:
        if _skip(flag):
            return
        body = functools.partial(_rmsprop, constants=_rmsprop_constants(lr, rho, momentum,
                                                                        epsilon))
        _run([var, grad, ms, mom], body,
             lambda: body(var, grad, ms, mom, np.empty_like(var), np.empty_like(var)))

    def bind_rmsprop_update(self, var: np.ndarray, grad: np.ndarray, ms: np.ndarray,
                            mom: np.ndarray | None, lr: float, rho: float, momentum: float,
                            epsilon: float, flag: Any) -> Callable[..., None] | None:
        """``rmsprop_update`` of one block (a bias, a small layer) for a traced step: its
        float32 hyperparameters rounded once, the passes run on the arrays as they are."""
        if isinstance(lr, np.ndarray) or not (0 < var.size <= BLOCK
                                              and _flat(var, grad, ms, mom)):
            return None
        constants = _rmsprop_constants(lr, rho, momentum, epsilon)
        shape, hyper = var.shape, (mom is None, lr, rho, momentum, epsilon)
        kernel = self._kernel_table["rmsprop_update"]

        def bound(var: np.ndarray, grad: np.ndarray, ms: np.ndarray, mom: np.ndarray | None,
                  lr: float, rho: float, momentum: float, epsilon: float, flag: Any) -> None:
            if (isinstance(lr, np.ndarray)
                    or not same_values((mom is None, lr, rho, momentum, epsilon), hyper)
                    or var.shape != shape
                    or not _flat(var, grad, ms, mom)):
                return kernel(var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
            if not _skip(flag):
                _rmsprop(var, grad, ms, mom, np.empty(shape, _F32_DTYPE),
                         np.empty(shape, _F32_DTYPE), constants)
            return None

        return bound

    def adam_rates(self, iterations: np.ndarray, lr: Any, beta1: float, beta2: float,
                   weight_decay: float) -> np.ndarray:
        """Adam's (alpha, lr*weight_decay) for step ``iterations + 1``, float32 (2,): the
        float64 expressions of Python, rounded once (``lr``: a number or a float64/float32
        array of one element, a schedule's rate)."""
        step = int(iterations[()]) + 1
        rate = float(_rate(lr))
        alpha = rate * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        return np.array([alpha, rate * weight_decay], np.float32)

    def adam_update(self, var: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
                    rates: np.ndarray, beta1: float, beta2: float, epsilon: float,
                    weight_decay: float, flag: Any) -> None:
        if _skip(flag):
            return
        alpha, decay = _f32(rates[0]), _f32(rates[1])
        b1, b2, e = _f32(1.0 - beta1), _f32(1.0 - beta2), _f32(epsilon)

        def body(w: Any, g: Any, m1: Any, m2: Any, d: Any, denom: Any) -> None:
            if weight_decay:
                np.multiply(w, decay, out=d)
                w -= d
            np.subtract(g, m1, out=d)
            d *= b1
            m1 += d
            np.multiply(g, g, out=d)
            d -= m2
            d *= b2
            m2 += d
            np.sqrt(m2, out=denom)
            denom += e
            np.multiply(m1, alpha, out=d)   # the update
            d /= denom
            w -= d

        _run([var, grad, m, v], body,
             lambda: body(var, grad, m, v, np.empty_like(var), np.empty_like(var)))
