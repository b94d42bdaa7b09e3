"""The built-in learning-rate schedules evaluated on the device, from the optimizer's int64
``iterations`` variable, so that a traced step records its rate and reads no step count back
(issue 34, item 1).

Each is composed from ops, in float64 on shape (1,) tensors (NumPy makes a 0-d float64 result
a ``np.float64``, a float subclass a trace would take for a Python constant), in the order of
the host's Python expression (:mod:`mpcore.optimizers.schedules`: Python floats, float64), so
the device rate is the host's float64 value; SGD and RMSprop round it to float32 on the device
as their kernels rounded the host's float, Adam takes it in float64 (``adam_rates``). The
hyperparameters folded into constants are computed on the host as Python does. ``floor`` and
``ceil`` of a progress ``>= 0`` are an int64 cast (truncation), exact below 2**52, where every
float64 is an integer already; ``pow`` is the backend's float64 ``power`` (libm's on the CPU,
the device's double ``pow`` on OpenCL with ``cl_khr_fp64`` and CUDA).

CosineDecay and CosineDecayRestarts use no ``cos`` and no ``pow`` kernel: their cosine is
:func:`mpcore.optimizers.cosine_math.cos`, IEEE basic operations written once and run here on
float64 tensors (about 80 kernel calls on shape (1,), or one where the backend has the
optional ``ieee_cos`` kernel, the CPU's) and on the host on Python floats, so the two are the
same bits on every backend; CosineDecayRestarts' restart is counted against a
table of period starts and its powers ``t_mul**restart``, ``m_mul**restart`` gathered from
tables the host computed with Python's ``**`` (:func:`~mpcore.optimizers.cosine_math.
restart_tables`, kept on the device once per backend).

Not here, kept whole (their rate computed on the host at each replay): a CosineDecayRestarts
whose tables would not fit (``t_mul < 1``, whose schedule ends; ``t_mul`` so close to 1, or
with ``t_mul == 1`` an ``m_mul`` so close to 1, that more than
:data:`~mpcore.optimizers.cosine_math.MAX_TABLE` entries are needed; a negative ``m_mul``), a
built-in schedule some of whose rates are negative or not finite (:func:`rate_problem`: the
host refuses such a rate at its step, before the update), a user's own schedule (Python
arithmetic), and a device without float64 (OpenCL without ``cl_khr_fp64``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.ops.dispatch import finish as _finish
from mpcore.optimizers import cosine_math as _cm
from mpcore.optimizers import schedules as _s

_EXACT = _cm.EXACT


def why_not(schedule: Any, backend: Any) -> str | None:
    """Why ``schedule`` is not evaluated on ``backend``'s device (None: it is)."""
    name = type(schedule).__name__
    if type(schedule) not in _RULES:
        return (f"learning-rate schedule {name}: not a built-in one, its __call__ runs in "
                "Python at each step")
    if type(schedule) is _s.CosineDecayRestarts:
        tables = _restart_tables(schedule)
        if isinstance(tables, str):
            return f"learning-rate schedule {name}: {tables}"
    problem = rate_problem(schedule)
    if problem is not None:
        return (f"learning-rate schedule {name}: {problem}; the optimizer refuses such a rate "
                "by name at the step that reaches it, a check on the host: not recorded")
    runtime = getattr(backend, "runtime", None)
    if runtime is not None and getattr(runtime, "fp64", True) is False:
        return "learning-rate schedule: the device has no float64 (cl_khr_fp64)"
    return None


def rate_problem(schedule: Any) -> str | None:
    """Why some step of a built-in ``schedule`` may have a rate that is negative or not finite
    (None: every rate is a finite number >= 0). The device computes a rate without a look at
    it, so such a schedule is kept whole: the host's ``optimizer.learning_rate`` refuses the
    rate at the step that reaches it, as for a user's schedule, instead of a traced (or eager)
    step applying it. Each schedule's rates lie between the extremes checked here (a cosine
    between its start and ``alpha`` times it, a warm-up between its ends, a decay of the
    step count between its first rate and its last)."""
    s = schedule
    if type(s) is _s.CosineDecay:
        initial, alpha = float(s.initial_learning_rate), float(s.alpha)
        rates = {"initial_learning_rate": initial}
        start = initial
        if s.warmup_target is not None:
            start = rates["warmup_target"] = float(s.warmup_target)
        rates["the final rate (alpha times the decay's start)"] = start * alpha
        return _first_invalid(rates)
    if type(s) is _s.CosineDecayRestarts:
        tables = _restart_tables(s)
        if isinstance(tables, str):
            return None                       # kept whole already (why_not says why)
        initial, alpha = float(s.initial_learning_rate), float(s.alpha)
        rates = {"initial_learning_rate": initial,
                 "the rate at a period's end (alpha times initial_learning_rate)":
                     initial * alpha}
        for label, peak in zip(("largest", "smallest"), _peak_range(tables)):
            rates[f"the rate at the {label} peak (m_mul**restart = {peak!r})"] = (
                initial * ((1 - alpha) * peak + alpha))
        return _first_invalid(rates)
    if type(s) is _s.PiecewiseConstantDecay:
        return _first_invalid({f"values[{i}]": float(v) for i, v in enumerate(s.values)})
    if type(s) is _s.PolynomialDecay:
        if float(s.power) < 0:
            return (f"power={s.power} < 0: (1 - step / decay_steps) ** power is infinite at "
                    "the decay's end")
        return _first_invalid({"initial_learning_rate": float(s.initial_learning_rate),
                               "end_learning_rate": float(s.end_learning_rate)})
    if type(s) is _s.InverseTimeDecay and float(s.decay_rate) < 0:
        return f"decay_rate={s.decay_rate} < 0: the denominator reaches zero"
    if type(s) is _s.ExponentialDecay and float(s.decay_rate) < 0:
        return f"decay_rate={s.decay_rate} < 0: its powers are NaN or alternate in sign"
    if type(s) in (_s.ExponentialDecay, _s.InverseTimeDecay):
        try:
            last = s(_LAST_STEP)              # (both are monotone in the step)
        except (OverflowError, ZeroDivisionError):
            last = math.inf
        return _first_invalid({"initial_learning_rate": float(s.initial_learning_rate),
                               f"the rate at step {_LAST_STEP}": last})
    return None


@functools.lru_cache(maxsize=64)
def _peak_range(tables: _cm.RestartTables) -> tuple[float, float]:
    """The largest and smallest of ``m_mul**restart`` (tables are made once per configuration,
    and a table may hold tens of thousands of peaks: not walked at every step)."""
    peaks = tables.peaks if tables.peaks is not None else (1.0,)
    return max(peaks), min(peaks)


#: The largest step an int64 ``iterations`` counts.
_LAST_STEP = 2**63 - 1


def _first_invalid(rates: dict[str, float]) -> str | None:
    for what, rate in rates.items():
        if not (rate >= 0.0 and math.isfinite(rate)):
            return f"{what} is {rate!r}, not a finite number >= 0"
    return None


def device_rate(schedule: Any, iterations: Tensor) -> Tensor:
    """``schedule(iterations)`` on the device: a float64 tensor of shape (1,), the value
    Python computes (:func:`why_not` must be None)."""
    step = ops.cast(ops.reshape(iterations, (1,)), "float64")
    return _RULES[type(schedule)](schedule, step)


def _const(value: float, like: Tensor) -> Tensor:
    return ops.constant([float(value)], "float64", backend=like.backend)


def _floor(x: Tensor) -> Tensor:
    """``floor(x)`` for ``x >= 0``: truncation, exact (the int64 cast) below 2**52."""
    whole = ops.cast(ops.cast(ops.minimum(x, _EXACT), "int64"), "float64")
    return ops.where(ops.less(x, _EXACT), whole, x)


def _ceil(x: Tensor) -> Tensor:
    """``ceil(x)`` for ``x >= 0``."""
    down = _floor(x)
    return ops.where(ops.less(down, x), ops.add(down, 1.0), down)


def _progress(s: _s.ExponentialDecay | _s.InverseTimeDecay, step: Tensor) -> Tensor:
    p = ops.divide(step, float(s.decay_steps))
    return _floor(p) if s.staircase else p


def _exponential(s: _s.ExponentialDecay, step: Tensor) -> Tensor:
    # float(initial) * float(rate) ** progress
    return ops.multiply(ops.power(_const(s.decay_rate, step), _progress(s, step)),
                        float(s.initial_learning_rate))


def _inverse_time(s: _s.InverseTimeDecay, step: Tensor) -> Tensor:
    # float(initial) / (1.0 + float(rate) * progress)
    return ops.divide(_const(s.initial_learning_rate, step),
                      ops.add(ops.multiply(_progress(s, step), float(s.decay_rate)), 1.0))


def _piecewise(s: _s.PiecewiseConstantDecay, step: Tensor) -> Tensor:
    # the first value whose boundary the step has not passed (step <= boundary)
    rate = _const(s.values[-1], step)
    for boundary, value in reversed(list(zip(s.boundaries, s.values))):
        rate = ops.where(ops.less_equal(step, float(boundary)), _const(value, step), rate)
    return rate


def _polynomial(s: _s.PolynomialDecay, step: Tensor) -> Tensor:
    steps = float(s.decay_steps)
    if s.cycle:
        # steps *= 1.0 if s == 0 else ceil(s / steps)
        times = ops.where(ops.equal(step, 0.0), _const(1.0, step),
                          _ceil(ops.divide(step, steps)))
        total: Tensor = ops.multiply(times, steps)
        p = ops.divide(step, total)
    else:
        p = ops.divide(ops.minimum(step, steps), steps)
    initial, end = float(s.initial_learning_rate), float(s.end_learning_rate)
    # (initial - end) * (1 - p) ** power + end
    decayed = ops.power(ops.subtract(1.0, p), float(s.power))
    return ops.add(ops.multiply(decayed, initial - end), end)


class _Device:
    """:func:`mpcore.optimizers.cosine_math.cos`'s primitives in float64 ops."""

    @staticmethod
    def floor(x: Tensor) -> Tensor:
        return _floor(x)

    where = staticmethod(ops.where)
    equal = staticmethod(ops.equal)

    @staticmethod
    def fused_cos(x: Tensor) -> Tensor | None:
        """The backend's ``ieee_cos`` kernel, where it has one: one call where the basic
        operations are about 80 (recorded as one step; no gradient flows to a step count)."""
        kernel = x.backend.kernels().get("ieee_cos")
        if kernel is None:
            return None
        return _finish("ieee_cos", (x,), kernel(x._data), x.backend, "float64")


_DEVICE = _Device()


def _cosine_decay(s: _s.CosineDecay, step: Tensor) -> Tensor:
    # the host's expressions (schedules.CosineDecay.__call__), its branch a where
    steps = float(s.decay_steps)
    initial, alpha = float(s.initial_learning_rate), float(s.alpha)
    if s.warmup_target is None:
        return initial * _cm.cosine_decayed(ops.minimum(step, steps) / steps, alpha, _DEVICE)
    target, warmup = float(s.warmup_target), float(s.warmup_steps)
    at = ops.minimum(step, steps + warmup)
    decay = target * _cm.cosine_decayed((at - warmup) / steps, alpha, _DEVICE)
    if warmup == 0.0:      # (the host never takes the warm-up branch: no 0/0 computed)
        return decay
    warm = (target - initial) * (at / warmup) + initial
    return ops.where(ops.less(at, warmup), warm, decay)


def _restart_tables(s: _s.CosineDecayRestarts) -> _cm.RestartTables | str:
    return _cm.restart_tables(float(s.first_decay_steps), float(s._t_mul), float(s._m_mul))


def _table(tables: _cm.RestartTables, name: str, values: tuple[float, ...],
           like: Tensor) -> Tensor:
    """A table's device copy on ``like``'s backend, made once (a trace reads it as a
    constant)."""
    key = (name, like.backend)
    found = tables.on_device.get(key)
    if found is None:
        found = tables.on_device[key] = ops.constant(list(values), "float64",
                                                     backend=like.backend)
    return found


def _gather(tables: _cm.RestartTables, name: str, values: tuple[float, ...],
            at: Tensor) -> Tensor:
    return ops.take(_table(tables, name, values, at), at, 0)


def _restarts(s: _s.CosineDecayRestarts, step: Tensor) -> Tensor:
    # the host's expressions (schedules.CosineDecayRestarts.__call__) with its tables
    tables = _restart_tables(s)
    assert isinstance(tables, _cm.RestartTables)
    fraction = step / float(s.first_decay_steps)
    if tables.t_mul == 1.0:
        restart = _floor(fraction)
        fraction = fraction - restart
    else:
        # how many period starts after the first are at or below the fraction (a float64
        # count of 0s and 1s, exact), as the host's bisect
        starts = _table(tables, "boundaries", tables.boundaries, step)
        restart = ops.sum(ops.cast(ops.less_equal(starts, fraction), "float64"), axis=0,
                          keepdims=True)
        at = ops.cast(restart, "int64")
        start = _gather(tables, "starts", tables.starts, at)
        fraction = (fraction - start) / _gather(tables, "lengths", tables.lengths, at)
    peak: Tensor | float = 1.0
    if tables.peaks is not None:
        last = float(len(tables.peaks) - 1)     # t_mul == 1: every later power is this one
        at = ops.cast(ops.minimum(restart, last), "int64")
        peak = _gather(tables, "peaks", tables.peaks, at)
    alpha = float(s.alpha)
    decayed = 0.5 * peak * (1.0 + _cm.cos(math.pi * fraction, _DEVICE))
    return float(s.initial_learning_rate) * ((1 - alpha) * decayed + alpha)


_RULES: dict[type, Any] = {_s.ExponentialDecay: _exponential, _s.InverseTimeDecay: _inverse_time,
                           _s.PiecewiseConstantDecay: _piecewise,
                           _s.PolynomialDecay: _polynomial, _s.CosineDecay: _cosine_decay,
                           _s.CosineDecayRestarts: _restarts}
