"""The CPU backend's fused optimizer updates on both cores, through oneDNN binary primitives.

The CPU backend's ``sgd_update``, ``rmsprop_update`` and ``adam_update``
(mpcore_cpu.optim) run NumPy over L2-sized blocks on one thread, the largest cost of a
training step after the GEMMs. The
same float32 operations in the same order, as a few oneDNN passes on oneDNN's OpenMP team, give
identical bits (tested against the NumPy kernels, signed zeros and Inf included; a NaN stays a
NaN, but where two NaNs meet, the order of the operands decides whose sign survives), in less
time on both cores (benchmarks/ measures it).

Each line below is one primitive; every operation rounds once, in the NumPy kernel's order.
``x - y`` is written ``x + (-y)`` with the negation folded into a hyperparameter
(``-(a * b) == a * (-b)`` exactly), which is the same float32 result, signed zeros included::

    RMSprop   tmp = (g * g) * (1 - rho)
              ms  = ms * rho + tmp
              tmp = sqrt(ms + epsilon)
              var = (g * -lr) / tmp + var
    SGD       var = var + g * -lr                             (no momentum)
              tmp = g * -lr;  vel = vel * m + tmp;  var = var + vel
              (Nesterov: var = (vel * m + tmp) + var)
    Adam      var = var * -decay + var                        (weight decay only)
              m   = (g - m) * (1 - beta1) + m
              v   = ((g * g) - v) * (1 - beta2) + v
              tmp = sqrt(v * 1) + epsilon
              var = (m * -alpha) / tmp + var
    Unscale   u   = g * inv_scale                             (then the CPU backend's finite
                                                               check of u)

Other dtypes, strided arrays, RMSprop with momentum and arrays under :data:`MIN_ELEMENTS`
(:data:`UPDATE_MIN_ELEMENTS` for SGD and RMSprop) go to the CPU backend's own kernel (for small
arrays the launches cost more than they save). SGD's and RMSprop's primitives are made once
per array length and their hyperparameters' one-element operands kept while the setting
stays, so their memory handles stay set; a traced step binds them to its operands
(``bind``), without even the lookups.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from mpcore.core.backend import bind_call, same_values

from .elementwise import BinaryCache

#: Below this many elements the NumPy kernels are faster (a primitive launch costs more):
#: Adam and the unscale, whose calls go through the primitive cache's LRU.
MIN_ELEMENTS = 1 << 17
#: The same for SGD and RMSprop, whose primitives are made once per length and whose
#: hyperparameter operands stay bound (launches cost less); eager and traced calls alike, so
#: both give the same bits, NaNs included (benchmarks/kernels.py ``--units 64``: "ms" and
#: "bound_ms" of the updates).
UPDATE_MIN_ELEMENTS = 1 << 15

_F32 = np.dtype(np.float32)
Alloc = Callable[[tuple[int, ...], Any], np.ndarray]


def _eligible(*arrays: np.ndarray | None, minimum: int | None = None) -> bool:
    """Whether oneDNN takes these: C-contiguous float32 of one shape, at least ``minimum``
    elements (default :data:`MIN_ELEMENTS`)."""
    first = arrays[0]
    assert first is not None
    return first.size >= (MIN_ELEMENTS if minimum is None else minimum) and all(
        a is None or (a.dtype == _F32 and a.shape == first.shape and a.flags.c_contiguous)
        for a in arrays)


def _like(shape: tuple[int, ...], *arrays: np.ndarray) -> bool:
    """Whether ``arrays`` are what a bound update was made for: C-contiguous float32 of
    ``shape``."""
    return all(a.shape == shape and a.dtype == _F32 and a.flags.c_contiguous for a in arrays)


def _skip(flag: Any) -> bool:
    return flag is not None and not bool(flag)


def _scalar(value: float) -> np.ndarray:
    """A hyperparameter as a one-element float32 operand (rounded to float32 first, as the
    NumPy kernels do)."""
    return np.array([value], _F32)


def _flat(*arrays: np.ndarray | None) -> list[Any]:
    return [None if a is None else a.reshape(-1) for a in arrays]


class _Passes:
    """An update's primitives for each array length (``make(key)``, once; the least recently
    used dropped past ``max_sizes``, as many as the primitive cache keeps, freed once no bound
    update holds them), and the
    one-element operands of the latest hyperparameters (the same arrays while the setting
    stays, so their memory handles stay set). Eager calls and traced steps share them."""

    def __init__(self, make: Callable[[Any], tuple[Any, ...]], max_sizes: int = 256) -> None:
        self._make = make
        self._max_sizes = max_sizes
        self._by_key: OrderedDict[Any, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._latest: tuple[bytes, tuple[np.ndarray, ...]] = (b"", ())
        self.runs = 0   # updates run on oneDNN, eager or bound (for tests and diagnostics)

    def get(self, key: Any) -> tuple[Any, ...]:
        with self._lock:
            found = self._by_key.get(key)
            if found is not None:
                self._by_key.move_to_end(key)
                return found
            found = self._by_key[key] = self._make(key)
            while len(self._by_key) > self._max_sizes:
                self._by_key.popitem(last=False)
            return found

    def scalars(self, *values: float) -> tuple[np.ndarray, ...]:
        key = struct.pack(f"{len(values)}d", *values)    # bits: -0.0 is not 0.0
        latest, arrays = self._latest
        if key != latest:
            arrays = tuple(_scalar(v) for v in values)
            self._latest = (key, arrays)
        return arrays


def make_rmsprop_update(original: Callable[..., None], cache: BinaryCache,
                        alloc: Alloc | None = None) -> Callable[..., None]:
    """``rmsprop_update`` (the CPU kernel's signature and results), plain RMSprop on oneDNN;
    ``alloc`` gives the scratch array (the CPU backend's recycled buffers)."""
    alloc = alloc or np.empty
    passes = _Passes(lambda n: (cache.bind("mul", n, False, [("mul", "scalar")]),
                                cache.bind("mul", n, True, [("add", "full")]),
                                cache.bind("add", n, True, [("sqrt",)]),
                                cache.bind("mul", n, True, [("div", "full"), ("add", "full")])))

    def takes(var: np.ndarray, grad: np.ndarray, ms: np.ndarray, mom: np.ndarray | None,
              momentum: float) -> bool:
        return (mom is None and not momentum
                and _eligible(var, grad, ms, minimum=UPDATE_MIN_ELEMENTS))

    def run(primitives: tuple[Any, ...], scalars: tuple[np.ndarray, ...], var: np.ndarray,
            grad: np.ndarray, ms: np.ndarray) -> None:
        square, average, denominator, step = primitives
        decay, keep, eps, minus_lr = scalars
        passes.runs += 1
        tmp = alloc(var.shape, _F32)
        square(grad, grad, tmp, decay)
        average(ms, keep, ms, tmp)
        denominator(ms, eps, tmp)
        step(grad, minus_lr, var, tmp, var)

    def rmsprop_update(var: np.ndarray, grad: np.ndarray, ms: np.ndarray,
                       mom: np.ndarray | None, lr: float, rho: float, momentum: float,
                       epsilon: float, flag: Any) -> None:
        if isinstance(lr, np.ndarray) or not takes(var, grad, ms, mom, momentum):
            # (a schedule's device rate: the CPU kernel reads it)
            return original(var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
        if not _skip(flag):
            run(passes.get(var.size), passes.scalars(*_rmsprop_values(lr, rho, epsilon)), var,
                grad, ms)
        return None

    def bind(var: np.ndarray, grad: np.ndarray, ms: np.ndarray, mom: np.ndarray | None,
             lr: float, rho: float, momentum: float, epsilon: float, flag: Any) -> Any:
        if isinstance(lr, np.ndarray) or not takes(var, grad, ms, mom, momentum):   # the CPU's
            return bind_call(original, var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
        shape, hyper = var.shape, (lr, rho, momentum, epsilon)
        primitives = passes.get(var.size)
        scalars = tuple(_scalar(v) for v in _rmsprop_values(lr, rho, epsilon))

        def bound(var: np.ndarray, grad: np.ndarray, ms: np.ndarray, mom: np.ndarray | None,
                  lr: float, rho: float, momentum: float, epsilon: float, flag: Any) -> None:
            if (mom is not None or isinstance(lr, np.ndarray)
                    or not same_values((lr, rho, momentum, epsilon), hyper)
                    or not _like(shape, var, grad, ms)):
                return rmsprop_update(var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
            if not _skip(flag):
                run(primitives, scalars, var, grad, ms)
            return None

        return bound

    rmsprop_update.bind = bind  # type: ignore[attr-defined]
    rmsprop_update.passes = passes  # type: ignore[attr-defined]
    return _mark(rmsprop_update, original, cache, calls_original_below=UPDATE_MIN_ELEMENTS)


def _rmsprop_values(lr: float, rho: float, epsilon: float) -> tuple[float, ...]:
    """RMSprop's one-element operands, in the passes' order (the rate negated: ``x - y`` is
    ``x + (-y)``, see the module docstring)."""
    return 1.0 - rho, rho, epsilon, -lr


def _sgd_values(lr: float, momentum: float) -> tuple[float, ...]:
    return -lr, momentum


def _sgd_primitives(cache: BinaryCache, key: tuple[int, str]) -> tuple[Any, ...]:
    n, variant = key
    full = ("add", "full")
    if variant == "plain":
        return (cache.bind("mul", n, True, [full]),)
    return (cache.bind("mul", n, True), cache.bind("mul", n, True, [full]),
            cache.bind("mul", n, True, [full, full]) if variant == "nesterov"
            else cache.bind("add", n, False))


def make_sgd_update(original: Callable[..., None], cache: BinaryCache,
                    alloc: Alloc | None = None) -> Callable[..., None]:
    """``sgd_update`` (the CPU kernel's signature and results) on oneDNN."""
    alloc = alloc or np.empty
    passes = _Passes(lambda key: _sgd_primitives(cache, key))

    def run(primitives: tuple[Any, ...], scalars: tuple[np.ndarray, ...], var: np.ndarray,
            grad: np.ndarray, velocity: np.ndarray | None, nesterov: bool) -> None:
        minus_lr, m_ = scalars
        passes.runs += 1
        if velocity is None:
            primitives[0](grad, minus_lr, var, var)
            return
        step, average, ahead = primitives
        tmp = alloc(var.shape, _F32)
        step(grad, minus_lr, tmp)
        average(velocity, m_, velocity, tmp)
        if nesterov:
            ahead(velocity, m_, var, tmp, var)
        else:
            ahead(var, velocity, var)

    def variant(velocity: np.ndarray | None, nesterov: bool) -> str:
        return "plain" if velocity is None else "nesterov" if nesterov else "momentum"

    def sgd_update(var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None, lr: float,
                   momentum: float, nesterov: bool, flag: Any) -> None:
        if isinstance(lr, np.ndarray) or not _eligible(var, grad, velocity,
                                                       minimum=UPDATE_MIN_ELEMENTS):
            return original(var, grad, velocity, lr, momentum, nesterov, flag)
        if not _skip(flag):
            run(passes.get((var.size, variant(velocity, nesterov))),
                passes.scalars(*_sgd_values(lr, momentum)), var, grad, velocity, nesterov)
        return None

    def bind(var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None, lr: float,
             momentum: float, nesterov: bool, flag: Any) -> Any:
        if isinstance(lr, np.ndarray) or not _eligible(var, grad, velocity,
                                                       minimum=UPDATE_MIN_ELEMENTS):  # CPU's
            return bind_call(original, var, grad, velocity, lr, momentum, nesterov, flag)
        shape, hyper = var.shape, (velocity is None, lr, momentum, nesterov)
        primitives = passes.get((var.size, variant(velocity, nesterov)))
        scalars = tuple(_scalar(v) for v in _sgd_values(lr, momentum))

        def bound(var: np.ndarray, grad: np.ndarray, velocity: np.ndarray | None, lr: float,
                  momentum: float, nesterov: bool, flag: Any) -> None:
            if (isinstance(lr, np.ndarray)
                    or not same_values((velocity is None, lr, momentum, nesterov), hyper)
                    or not _like(shape, var, grad, *(() if velocity is None else (velocity,)))):
                return sgd_update(var, grad, velocity, lr, momentum, nesterov, flag)
            if not _skip(flag):
                run(primitives, scalars, var, grad, velocity, nesterov)
            return None

        return bound

    sgd_update.bind = bind  # type: ignore[attr-defined]
    sgd_update.passes = passes  # type: ignore[attr-defined]
    return _mark(sgd_update, original, cache, calls_original_below=UPDATE_MIN_ELEMENTS)


def make_adam_update(original: Callable[..., None], cache: BinaryCache,
                     alloc: Alloc | None = None) -> Callable[..., None]:
    """``adam_update`` (the CPU kernel's signature and results, AdamW's decoupled decay
    included) on oneDNN."""
    alloc = alloc or np.empty

    def adam_update(var: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
                    rates: np.ndarray, beta1: float, beta2: float, epsilon: float,
                    weight_decay: float, flag: Any) -> None:
        if not _eligible(var, grad, m, v):
            return original(var, grad, m, v, rates, beta1, beta2, epsilon, weight_decay, flag)
        if _skip(flag):
            return None
        w, g, m1, m2 = _flat(var, grad, m, v)
        # the step size and decay of adam_rates, float32 on the host (the CPU's memory)
        alpha, decay = float(rates[0]), float(rates[1])
        full = ("add", "full")
        if weight_decay:
            cache.run("mul", w, -_scalar(decay), w, [full], [w])
        cache.run("sub", g, m1, m1, [("mul", "scalar"), full],
                  [_scalar(1.0 - beta1), m1])
        cache.run("mul", g, g, m2, [("sub", "full"), ("mul", "scalar"), full],
                  [m2, _scalar(1.0 - beta2), m2])
        tmp = alloc(w.shape, _F32)
        cache.run("mul", m2, _scalar(1.0), tmp, [("sqrt",), ("add", "scalar")],
                  [_scalar(epsilon)])
        cache.run("mul", m1, -_scalar(alpha), w, [("div", "full"), full], [tmp, w])
        return None

    return _mark(adam_update, original, cache)


def make_unscale_and_check(original: Callable[..., Any], cache: BinaryCache,
                           alloc: Alloc | None = None) -> Callable[..., Any]:
    """``unscale_and_check`` (the CPU kernel's signature and results): large contiguous
    float32 gradients are multiplied on oneDNN's threads and checked by the CPU backend's exact
    all-finite test, everything else goes to ``original``, one gradient at a time."""
    alloc = alloc or np.empty
    from mpcore_cpu.optim import is_all_finite

    def unscale_and_check(grads: list[np.ndarray], inv_scale: float
                          ) -> tuple[list[np.ndarray], np.ndarray]:
        scale = _scalar(inv_scale)
        outs = []
        ok = True
        for g in grads:
            if not _eligible(g):
                (u,), flag = original([g], inv_scale)
                outs.append(u)
                ok = ok and bool(flag)
                continue
            u = alloc(g.shape, _F32)
            cache.run("mul", g.reshape(-1), scale, u.reshape(-1))
            outs.append(u)
            if ok:
                with np.errstate(over="ignore", invalid="ignore"):
                    ok = is_all_finite(u)
        return outs, np.asarray(ok)

    return _mark(unscale_and_check, original, cache)  # type: ignore[arg-type]


def _mark(kernel: Callable[..., Any], original: Callable[..., Any], cache: Any,
          calls_original_below: int = 0) -> Callable[..., Any]:
    """``kernel`` carrying the primitive cache it runs on and the kernel it falls back to;
    ``calls_original_below``: it hands arrays of fewer elements to that kernel, always (what
    the CPU backend's grouped updates of traced steps rely on, ``mpcore_cpu.compile``)."""
    kernel.cache = cache  # type: ignore[attr-defined]
    kernel.original = original  # type: ignore[attr-defined]
    kernel.calls_original_below = calls_original_below  # type: ignore[attr-defined]
    return kernel


#: kernel name -> maker, for the kernels the CPU backend has.
MAKERS = {"sgd_update": make_sgd_update, "rmsprop_update": make_rmsprop_update,
          "adam_update": make_adam_update, "unscale_and_check": make_unscale_and_check}
