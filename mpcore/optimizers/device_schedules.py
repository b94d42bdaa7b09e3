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

Not here, kept whole (their rate computed on the host at each replay): CosineDecay and
CosineDecayRestarts (``cos``, and ``log`` before a ``floor``, are not kernels bit-identical
to the host's libm: a float64 ulp before the floor of a restart changes the rate), a user's own
schedule (Python arithmetic), and a device without float64 (OpenCL without ``cl_khr_fp64``).
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.optimizers import schedules as _s

#: Below this every float64 is exact as an int64, above it every float64 is an integer.
_EXACT = float(2**52)


def why_not(schedule: Any, backend: Any) -> str | None:
    """Why ``schedule`` is not evaluated on ``backend``'s device (None: it is)."""
    if type(schedule) not in _RULES:
        name = type(schedule).__name__
        if type(schedule) in (_s.CosineDecay, _s.CosineDecayRestarts):
            return f"learning-rate schedule {name}: cos is not a device kernel yet"
        return (f"learning-rate schedule {name}: not a built-in one, its __call__ runs in "
                "Python at each step")
    runtime = getattr(backend, "runtime", None)
    if runtime is not None and getattr(runtime, "fp64", True) is False:
        return "learning-rate schedule: the device has no float64 (cl_khr_fp64)"
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


_RULES: dict[type, Any] = {_s.ExponentialDecay: _exponential, _s.InverseTimeDecay: _inverse_time,
                           _s.PiecewiseConstantDecay: _piecewise,
                           _s.PolynomialDecay: _polynomial}
