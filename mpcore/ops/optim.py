"""Optimizer updates as ops: SGD (momentum, Nesterov), RMSprop and Adam/AdamW, with Keras'
formulas, updating float32 variables and slots in place.

Each uses the backend's fused kernel (``sgd_update`` ... in ``OPTIONAL_KERNELS``) when the
backend has one, the variable is float32 and ``fused`` is true: one kernel call per variable.
Otherwise the same float32 arithmetic runs as ops, in the same order, and the results are
assigned. ``flag`` is None or the device flag of ``unscale_and_check``/``all_finite``: when it
is false every variable and slot keeps its value (the fused kernels skip the write; the
composite path selects the old values on the device), so a skipped step needs no host read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.core.tensor import Tensor, Variable
from mpcore.ops.creation import constant
from mpcore.ops.dispatch import cast
from mpcore.ops.elementwise import add, divide, multiply, power, sqrt, subtract, where
from mpcore.ops.shapes import concat, getitem, reshape


def _fused_kernel(name: str, variable: Variable, fused: bool) -> Callable[..., None] | None:
    if not fused or variable._dtype != "float32":
        return None
    return variable._backend.kernels().get(name)


def _data(x: Tensor | None) -> Any:
    return None if x is None else x.data


def _rate(learning_rate: float | Tensor) -> Any:
    """A rate for a kernel: a number, or a device scalar's array (a schedule's rate)."""
    return learning_rate.data if isinstance(learning_rate, Tensor) else learning_rate


def _mark_updated(*variables: Variable | None) -> None:
    for v in variables:
        if v is not None:
            v.mark_updated()


def _assign(flag: Tensor | None, updates: list[tuple[Variable, Tensor, Tensor]]) -> None:
    """Assign each (variable, new value, old value), or keep the old values where ``flag`` is
    false; every value is computed before the first assignment."""
    if flag is not None:
        updates = [(v, where(flag, new, old), old) for v, new, old in updates]
    for variable, value, _ in updates:
        variable.assign(value)


def sgd_update(variable: Variable, gradient: Tensor, velocity: Variable | None,
               learning_rate: float | Tensor, momentum: float, nesterov: bool,
               flag: Tensor | None = None, fused: bool = True) -> None:
    """``v = momentum*v - lr*g; var += v`` (Nesterov: ``var += momentum*v - lr*g``); plain
    ``var -= lr*g`` without a velocity. ``learning_rate``: a number or a float32 device
    scalar (shape (); a schedule's rate, read on the device)."""
    kernel = _fused_kernel("sgd_update", variable, fused)
    if kernel is not None:
        kernel(variable.data, gradient.data, _data(velocity), _rate(learning_rate), momentum,
               nesterov, _data(flag))
        _mark_updated(variable, velocity)
        return
    # uncopied reads: each is used before its variable is assigned
    var = variable.current_value()
    g_lr = multiply(gradient, learning_rate)
    if velocity is None:
        _assign(flag, [(variable, subtract(var, g_lr), var)])
        return
    old_v = velocity.current_value()
    v = subtract(multiply(old_v, momentum), g_lr)
    new_var = add(var, subtract(multiply(v, momentum), g_lr)) if nesterov else add(var, v)
    _assign(flag, [(variable, new_var, var), (velocity, v, old_v)])


def rmsprop_update(variable: Variable, gradient: Tensor, velocity: Variable,
                   momentum_slot: Variable | None, learning_rate: float | Tensor, rho: float,
                   momentum: float, epsilon: float, flag: Tensor | None = None,
                   fused: bool = True) -> None:
    """Keras' RMSprop: ``ms = rho*ms + (1-rho)*g^2``; ``inc = lr*g/sqrt(ms + eps)``;
    ``var -= inc`` (with momentum: ``mom = momentum*mom + inc; var -= mom``).
    ``learning_rate``: a number or a float32 device scalar (as :func:`sgd_update`'s)."""
    kernel = _fused_kernel("rmsprop_update", variable, fused)
    if kernel is not None:
        kernel(variable.data, gradient.data, velocity.data, _data(momentum_slot),
               _rate(learning_rate), rho, momentum, epsilon, _data(flag))
        _mark_updated(variable, velocity, momentum_slot)
        return
    var, old_ms = variable.current_value(), velocity.current_value()
    ms = add(multiply(old_ms, rho), multiply(multiply(gradient, gradient), 1.0 - rho))
    inc = divide(multiply(gradient, learning_rate), sqrt(add(ms, epsilon)))
    if momentum_slot is None:
        _assign(flag, [(variable, subtract(var, inc), var), (velocity, ms, old_ms)])
        return
    old_mom = momentum_slot.current_value()
    mom = add(multiply(old_mom, momentum), inc)
    _assign(flag, [(variable, subtract(var, mom), var), (velocity, ms, old_ms),
                   (momentum_slot, mom, old_mom)])


def adam_rates(iterations: Tensor, learning_rate: float | Tensor, beta_1: float,
               beta_2: float, weight_decay: float = 0.0, fused: bool = True) -> Tensor:
    """Adam's step size and decay for the step after ``iterations`` (the int64 step count on
    the device, shape ()), as a float32 tensor of shape (2,): ``alpha = lr*sqrt(1 -
    b2^t)/(1 - b1^t)`` with ``t = iterations + 1``, and ``lr*weight_decay``. ``learning_rate``
    is a number or a float64 (float32 where the device has no float64) tensor of shape (1,)
    or () (a schedule's rate on the device, :mod:`mpcore.optimizers.device_schedules`).

    Computed on the device in float64 and rounded once to float32, the formula the host used
    when it computed them in Python (the same values, so eager steps keep their results); an
    eager step and each replay of a traced one run this same kernel, so they agree bit for bit.
    A device without float64 (OpenCL without ``cl_khr_fp64``) computes in float32."""
    be = iterations._backend
    kernel = be.kernels().get("adam_rates") if fused else None
    if kernel is not None:
        lr = learning_rate.data if isinstance(learning_rate, Tensor) else float(learning_rate)
        return Tensor(kernel(iterations.data, lr, float(beta_1), float(beta_2),
                             float(weight_decay)), be, "float32")
    # shape (1,), not (): NumPy makes a 0-d float64 result a np.float64 scalar, which a trace
    # would take for a Python constant (a float subclass) and fold
    t = cast(reshape(add(iterations, 1), (1,)), "float64")
    root = sqrt(subtract(1.0, power(float(beta_2), t)))
    lr: float | Tensor
    if isinstance(learning_rate, Tensor):
        lr = cast(reshape(learning_rate, (1,)), "float64")
        decay = cast(multiply(lr, float(weight_decay)), "float32")
    else:
        lr = float(learning_rate)
        decay = constant([lr * float(weight_decay)], "float32", backend=be)
    # lr * sqrt(..) / (..) in Python's order: the product first (lr * root == root * lr)
    alpha = divide(multiply(root, lr), subtract(1.0, power(float(beta_1), t)))
    return concat([cast(alpha, "float32"), decay])


def adam_update(variable: Variable, gradient: Tensor, m_slot: Variable, v_slot: Variable,
                rates: Tensor, beta_1: float, beta_2: float, epsilon: float,
                weight_decay: float = 0.0, flag: Tensor | None = None,
                fused: bool = True) -> None:
    """Keras' Adam: ``m += (g - m)(1 - b1)``; ``v += (g^2 - v)(1 - b2)``;
    ``var -= alpha*m / (sqrt(v) + eps)``, ``alpha`` and the decay ``lr*wd`` read on the device
    from ``rates`` (:func:`adam_rates`). ``weight_decay`` > 0 first decays ``var -= lr*wd*var``
    (decoupled, AdamW)."""
    kernel = _fused_kernel("adam_update", variable, fused)
    if kernel is not None:
        kernel(variable.data, gradient.data, m_slot.data, v_slot.data, rates.data, beta_1,
               beta_2, epsilon, weight_decay, _data(flag))
        _mark_updated(variable, m_slot, v_slot)
        return
    old_var = var = variable.current_value()
    old_m, old_v = m_slot.current_value(), v_slot.current_value()
    if weight_decay:
        var = subtract(var, multiply(var, getitem(rates, 1)))
    alpha = getitem(rates, 0)
    m = add(old_m, multiply(subtract(gradient, old_m), 1.0 - beta_1))
    v = add(old_v, multiply(subtract(multiply(gradient, gradient), old_v), 1.0 - beta_2))
    update = divide(multiply(m, alpha), add(sqrt(v), epsilon))
    _assign(flag, [(variable, subtract(var, update), old_var), (m_slot, m, old_m),
                   (v_slot, v, old_v)])
