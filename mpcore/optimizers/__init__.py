"""Optimizers: SGD (momentum, Nesterov), RMSprop, Adam and AdamW, with Keras' formulas.

An optimizer holds the hyperparameters, the float32 slots of each float32 master variable and
the step count; the update itself is an op (:mod:`mpcore.ops.optim`: ``sgd_update``,
``rmsprop_update``, ``adam_update``), one fused kernel per variable on a backend that has it,
the same float32 arithmetic as ops otherwise.

``learning_rate`` is a float or a callable ``schedule(step: int) -> float`` (called with
``iterations`` before each update), such as a Keras schedule of
:mod:`mpcore.optimizers.schedules` (``mp.optimizers.schedules.ExponentialDecay`` ...). Every
hyperparameter is checked when the optimizer is made (:mod:`mpcore.core.arguments`: a finite real
number in its range, not a bool or a string), a host schedule's rate at each step (the built-in
ones computed on the device, :mod:`mpcore.optimizers.device_schedules`, are not read back).
``_apply(grads, variables, flag)`` is what
:class:`~mpcore.optimizers.loss_scale_optimizer.LossScaleOptimizer` calls with the device flag of
``unscale_and_check``: when the flag is false, variables and slots keep their values (the fused
kernels skip the write; the composite path selects the old values on the device), so a skipped
step needs no host read of its own.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core import arguments as _args
from mpcore.core.naming import by_name
from mpcore.core.tensor import Tensor, Variable
from mpcore.optimizers import schedules
from mpcore.optimizers.base import LearningRate, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "LearningRate", "Optimizer", "RMSprop", "by_class_name", "get",
           "schedules"]


class SGD(Optimizer):
    """``v = momentum*v - lr*g; var += v`` (Nesterov: ``var += momentum*v - lr*g``); plain
    ``var -= lr*g`` without momentum."""

    _recorded_hyperparameters = ("_learning_rate", "momentum", "nesterov", "use_fused_kernels")
    _uses_step = False

    def __init__(self, learning_rate: LearningRate = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, name: str | None = None,
                 **options: Any) -> None:
        super().__init__(learning_rate, name, **options)
        self.momentum = _args.number("momentum", momentum, 0.0, 1.0)
        self.nesterov = _args.flag("nesterov", nesterov)

    def slot_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum > 0 else ()

    def _update_variable(self, var: Variable, grad: Tensor, slots: dict[str, Variable],
                         lr: float, step: int, flag: Tensor | None) -> None:
        ops.sgd_update(var, grad, slots.get("momentum"), lr, self.momentum, self.nesterov, flag,
                       self.use_fused_kernels)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


class RMSprop(Optimizer):
    """Keras' RMSprop: ``ms = rho*ms + (1-rho)*g^2``; ``inc = lr*g/sqrt(ms + eps)``;
    ``var -= inc`` (with momentum: ``mom = momentum*mom + inc; var -= mom``)."""

    _recorded_hyperparameters = ("_learning_rate", "rho", "momentum", "epsilon",
                                 "use_fused_kernels")
    _uses_step = False

    #: Keras 3's centered RMSprop, not implemented: only its default (off) is taken
    _keras_only_options = {"centered": False}

    def __init__(self, learning_rate: LearningRate = 0.001, rho: float = 0.9,
                 momentum: float = 0.0, epsilon: float = 1e-7, name: str | None = None,
                 **options: Any) -> None:
        super().__init__(learning_rate, name, **options)
        self.rho = _args.number("rho", rho, 0.0, 1.0, high_open=True)
        self.momentum = _args.number("momentum", momentum, 0.0, 1.0)
        # 0 would divide 0 by 0 where a weight's gradients have all been 0
        self.epsilon = _args.number("epsilon", epsilon, 0.0, low_open=True)

    def slot_names(self) -> tuple[str, ...]:
        return ("velocity", "momentum") if self.momentum > 0 else ("velocity",)

    def _update_variable(self, var: Variable, grad: Tensor, slots: dict[str, Variable],
                         lr: float, step: int, flag: Tensor | None) -> None:
        ops.rmsprop_update(var, grad, slots["velocity"], slots.get("momentum"), lr, self.rho,
                           self.momentum, self.epsilon, flag, self.use_fused_kernels)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum,
                "epsilon": self.epsilon}


class Adam(Optimizer):
    """Keras' Adam: ``m += (g - m)(1 - b1)``; ``v += (g^2 - v)(1 - b2)``;
    ``var -= alpha*m / (sqrt(v) + eps)`` with ``alpha = lr*sqrt(1 - b2^t)/(1 - b1^t)`` and
    ``t = iterations + 1`` (``iterations`` counts the applied updates: under a
    LossScaleOptimizer a skipped step is not counted, as in Keras 3). ``weight_decay`` > 0
    first decays ``var -= lr*wd*var`` (decoupled, AdamW).

    ``alpha`` and ``lr*wd`` are computed once per step on the device from
    ``iterations_variable`` (``ops.adam_rates``), so a traced step records the update kernel by
    kernel and reads no step count back."""

    _recorded_hyperparameters = ("_learning_rate", "beta_1", "beta_2", "epsilon",
                                 "weight_decay", "use_fused_kernels")
    _uses_step = False
    #: Keras 3's amsgrad, not implemented: only its default (off) is taken
    _keras_only_options = {"amsgrad": False}

    def __init__(self, learning_rate: LearningRate = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, weight_decay: float | None = None,
                 name: str | None = None, **options: Any) -> None:
        super().__init__(learning_rate, name, **options)
        self.beta_1 = _args.number("beta_1", beta_1, 0.0, 1.0, high_open=True)
        self.beta_2 = _args.number("beta_2", beta_2, 0.0, 1.0, high_open=True)
        # 0 would divide 0 by 0 where a weight's gradients have all been 0
        self.epsilon = _args.number("epsilon", epsilon, 0.0, low_open=True)
        self.weight_decay = (0.0 if weight_decay is None
                             else _args.number("weight_decay", weight_decay, 0.0))

    def slot_names(self) -> tuple[str, ...]:
        return ("m", "v")

    def _step_rates(self, learning_rate: Any) -> Tensor:
        var = self._iterations_var
        assert var is not None
        return ops.adam_rates(var, learning_rate, self.beta_1, self.beta_2, self.weight_decay,
                              self.use_fused_kernels)

    def _update_variable(self, var: Variable, grad: Tensor, slots: dict[str, Variable],
                         lr: Any, step: int, flag: Tensor | None) -> None:
        # lr: the step's (alpha, lr*weight_decay) on the device, from _step_rates
        ops.adam_update(var, grad, slots["m"], slots["v"], lr, self.beta_1, self.beta_2,
                        self.epsilon, self.weight_decay, flag, self.use_fused_kernels)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon, "weight_decay": self.weight_decay or None}


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.004, as Keras)."""

    _recorded_hyperparameters = Adam._recorded_hyperparameters

    def __init__(self, learning_rate: LearningRate = 0.001, weight_decay: float = 0.004,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 name: str | None = None, **options: Any) -> None:
        # None (no decay) is Adam's, as in Keras
        weight_decay = _args.number("weight_decay", weight_decay, 0.0)
        super().__init__(learning_rate, beta_1, beta_2, epsilon, weight_decay, name, **options)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "weight_decay": self.weight_decay}


_BY_NAME: dict[str, type[Optimizer]] = {"sgd": SGD, "rmsprop": RMSprop, "adam": Adam,
                                        "adamw": AdamW}


def by_class_name(name: str) -> type[Optimizer]:
    """The optimizer class called ``name`` ("Adam" ...), as a config names it."""
    classes = {cls.__name__: cls for cls in _BY_NAME.values()}
    if name not in classes:
        raise ValueError(f"unknown optimizer class {name!r}; valid: {', '.join(classes)}")
    return classes[name]


def get(identifier: Any) -> Optimizer:
    """An optimizer from a name (``"rmsprop"``, ``"adam"`` ...) or an Optimizer instance."""
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str):
        return by_name("optimizer", _BY_NAME, identifier)()
    raise TypeError(f"an optimizer is a name or an mp.optimizers.Optimizer, got {identifier!r}")
