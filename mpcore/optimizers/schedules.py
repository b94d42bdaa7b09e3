"""Learning rate schedules, Keras 3's (``keras.optimizers.schedules``): names, arguments,
defaults, formulas and configs.

A schedule is given to an optimizer as its ``learning_rate``; the optimizer calls it with its
``iterations`` (the number of updates applied so far) before each update. The formulas are
Python floats (float64), not Keras' float32, so rates may differ from Keras' in the last
float32 bits. The built-in schedules are computed by the optimizer on the device from its
``iterations`` variable, the same float64 expressions in ops
(:mod:`mpcore.optimizers.device_schedules`), so a traced step records them and reads nothing
back; a user's own (and a CosineDecayRestarts with no finite tables) is called on the host and
keeps a traced step's update whole (replayed eagerly, calling the schedule again).

The cosine of CosineDecay and CosineDecayRestarts is :func:`mpcore.optimizers.cosine_math.cos`
(IEEE basic operations, the same bits on the host and every device), within 1 ulp of
``math.cos``, not Keras' backend ``cos``: a rate may differ from Keras' by an ulp or two of
the initial rate. CosineDecayRestarts finds its restart exactly
(:func:`~mpcore.optimizers.cosine_math.restart_index`), where Keras' ``log`` formula can put a
period's first step in the period before; past the last restart of a ``t_mul < 1`` schedule
the rate is NaN, as Keras'.

>>> s = ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
>>> s(10), s(20)
(0.05, 0.025)
>>> deserialize(serialize(s)).get_config() == s.get_config()
True
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

from mpcore.core import arguments as _args
from mpcore.optimizers import cosine_math as _cm


class LearningRateSchedule:
    """Base class: a subclass implements ``__call__(step) -> float`` and ``get_config()``
    (the keyword arguments of its constructor, so that ``from_config`` remakes it)."""

    def __call__(self, step: int) -> float:
        raise NotImplementedError(f"Learning rate schedule '{type(self).__name__}' must "
                                  "override `__call__(self, step)`.")

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError(f"Learning rate schedule '{type(self).__name__}' must "
                                  "override `get_config()` in order to be serializable.")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LearningRateSchedule:
        return cls(**config)

    def __repr__(self) -> str:
        try:
            args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        except NotImplementedError:
            args = "..."
        return f"{type(self).__name__}({args})"


def _step(step: Any) -> float:
    """The optimizer's step as a float (an int, or anything with ``__index__``/``__float__``
    such as a NumPy scalar or a 0-d array)."""
    return _args.number("step", step if not hasattr(step, "item") else step.item())


def _decay_steps(name: str, value: Any) -> Any:
    # Keras' check: a step count of 0 would divide by 0
    _args.number(name, value, 0.0, low_open=True)
    return value


class _StepDecay(LearningRateSchedule):
    """What ExponentialDecay and InverseTimeDecay share (Keras 3's arguments, checks and config
    keys): the progress ``step / decay_steps``, floored with ``staircase=True``."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, decay_rate: float,
                 staircase: bool = False, name: str = "") -> None:
        _args.number("initial_learning_rate", initial_learning_rate)
        _args.number("decay_rate", decay_rate)
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = _decay_steps("decay_steps", decay_steps)
        self.decay_rate = decay_rate
        self.staircase = _args.flag("staircase", staircase)
        self.name = name

    def _progress(self, step: int) -> float:
        p = _step(step) / self.decay_steps
        return math.floor(p) if self.staircase else p

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "decay_rate": self.decay_rate,
                "staircase": self.staircase, "name": self.name}


class ExponentialDecay(_StepDecay):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)`` (the exponent an integer,
    ``floor(step / decay_steps)``, with ``staircase=True``)."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, decay_rate: float,
                 staircase: bool = False, name: str = "ExponentialDecay") -> None:
        super().__init__(initial_learning_rate, decay_steps, decay_rate, staircase, name)

    def __call__(self, step: int) -> float:
        return float(self.initial_learning_rate) * float(self.decay_rate) ** self._progress(step)

class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[0]`` while ``step <= boundaries[0]``, ``values[i]`` while
    ``boundaries[i-1] < step <= boundaries[i]``, ``values[-1]`` after ``boundaries[-1]``."""

    def __init__(self, boundaries: Sequence[float], values: Sequence[float],
                 name: str = "PiecewiseConstant") -> None:
        if isinstance(boundaries, str) or not isinstance(boundaries, Sequence):
            raise ValueError(f"boundaries must be a list of numbers, got {boundaries!r}")
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise ValueError(f"values must be a list of numbers, got {values!r}")
        if len(boundaries) != len(values) - 1:
            raise ValueError("The length of boundaries should be 1 less than the length of "
                             f"values. Received: boundaries={list(boundaries)} of length "
                             f"{len(boundaries)}, and values={list(values)} of length "
                             f"{len(values)}.")
        checked = [_args.number("boundaries[i]", b) for b in boundaries]
        for v in values:
            _args.number("values[i]", v)
        if any(a >= b for a, b in itertools.pairwise(checked)):
            # an unsorted list would skip values without a word
            raise ValueError(f"boundaries must be strictly increasing, got {list(boundaries)}")
        self.boundaries = list(boundaries)
        self.values = list(values)
        self.name = name

    def __call__(self, step: int) -> float:
        s = _step(step)
        for boundary, value in zip(self.boundaries, self.values):
            if s <= boundary:
                return float(value)
        return float(self.values[-1])

    def get_config(self) -> dict[str, Any]:
        return {"boundaries": self.boundaries, "values": self.values, "name": self.name}


class PolynomialDecay(LearningRateSchedule):
    """``(initial - end) * (1 - step / decay_steps) ** power + end`` with ``step`` held at
    ``decay_steps``; ``cycle=True`` restarts with ``decay_steps`` times the next multiple."""

    def __init__(self, initial_learning_rate: float, decay_steps: float,
                 end_learning_rate: float = 0.0001, power: float = 1.0, cycle: bool = False,
                 name: str = "PolynomialDecay") -> None:
        _args.number("initial_learning_rate", initial_learning_rate)
        _args.number("end_learning_rate", end_learning_rate)
        _args.number("power", power)
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = _decay_steps("decay_steps", decay_steps)
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.cycle = _args.flag("cycle", cycle)
        self.name = name

    def __call__(self, step: int) -> float:
        s, steps = _step(step), float(self.decay_steps)
        if self.cycle:
            steps *= 1.0 if s == 0 else math.ceil(s / steps)
        else:
            s = min(s, steps)
        p = s / steps
        initial, end = float(self.initial_learning_rate), float(self.end_learning_rate)
        return (initial - end) * (1 - p) ** float(self.power) + end

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "end_learning_rate": self.end_learning_rate,
                "power": self.power, "cycle": self.cycle, "name": self.name}


class InverseTimeDecay(_StepDecay):
    """``initial_learning_rate / (1 + decay_rate * step / decay_steps)`` (``floor`` of the
    ratio with ``staircase=True``)."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, decay_rate: float,
                 staircase: bool = False, name: str = "InverseTimeDecay") -> None:
        super().__init__(initial_learning_rate, decay_steps, decay_rate, staircase, name)

    def __call__(self, step: int) -> float:
        return float(self.initial_learning_rate) / (
            1.0 + float(self.decay_rate) * self._progress(step))


class CosineDecay(LearningRateSchedule):
    """Cosine decay from ``initial_learning_rate`` to ``alpha`` times it over ``decay_steps``;
    with ``warmup_target``, first a linear warm-up from ``initial_learning_rate`` to
    ``warmup_target`` over ``warmup_steps``, then the decay from ``warmup_target`` (Keras 3's
    warm-up)."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, alpha: float = 0.0,
                 name: str = "CosineDecay", warmup_target: float | None = None,
                 warmup_steps: float = 0) -> None:
        _args.number("initial_learning_rate", initial_learning_rate)
        _args.number("alpha", alpha)
        if warmup_target is not None:
            _args.number("warmup_target", warmup_target)
        _args.number("warmup_steps", warmup_steps, 0.0)
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = _decay_steps("decay_steps", decay_steps)
        self.alpha = alpha
        self.name = name
        self.warmup_steps = warmup_steps
        self.warmup_target = warmup_target

    def __call__(self, step: int) -> float:
        s, steps = _step(step), float(self.decay_steps)
        initial, alpha = float(self.initial_learning_rate), float(self.alpha)
        if self.warmup_target is None:
            return initial * _cm.cosine_decayed(min(s, steps) / steps, alpha)
        target, warmup = float(self.warmup_target), float(self.warmup_steps)
        s = min(s, steps + warmup)
        if s < warmup:
            return (target - initial) * (s / warmup) + initial
        return target * _cm.cosine_decayed((s - warmup) / steps, alpha)

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "alpha": self.alpha, "name": self.name,
                "warmup_target": self.warmup_target, "warmup_steps": self.warmup_steps}


class CosineDecayRestarts(LearningRateSchedule):
    """SGDR: cosine decay over ``first_decay_steps``, then restarts, each period ``t_mul``
    times longer and its peak ``m_mul`` times the previous one."""

    def __init__(self, initial_learning_rate: float, first_decay_steps: float,
                 t_mul: float = 2.0, m_mul: float = 1.0, alpha: float = 0.0,
                 name: str = "SGDRDecay") -> None:
        _args.number("initial_learning_rate", initial_learning_rate)
        _args.number("t_mul", t_mul, 0.0, low_open=True)
        _args.number("m_mul", m_mul)
        _args.number("alpha", alpha)
        self.initial_learning_rate = initial_learning_rate
        self.first_decay_steps = _decay_steps("first_decay_steps", first_decay_steps)
        self._t_mul = t_mul
        self._m_mul = m_mul
        self.alpha = alpha
        self.name = name

    def __call__(self, step: int) -> float:
        fraction = _step(step) / float(self.first_decay_steps)
        t_mul, m_mul = float(self._t_mul), float(self._m_mul)
        # the device's tables where it has them (the same numbers as the formulas below)
        tables = _cm.restart_tables(float(self.first_decay_steps), t_mul, m_mul)
        table = tables if isinstance(tables, _cm.RestartTables) else None
        if t_mul == 1.0:
            restart = math.floor(fraction)
            fraction -= restart
        else:
            # the exact restart: Keras' log formula can put a boundary step in the period
            # before (cosine_math.restart_index)
            found = (table.index(fraction) if table is not None
                     else _cm.restart_index(fraction, t_mul))
            if found is None:        # past a shrinking schedule's last restart, as Keras
                return math.nan
            restart = found
            start, length = ((table.starts[restart], table.lengths[restart]) if table else
                             (_cm.period_start(t_mul, restart), _cm.power(t_mul, restart)))
            fraction = (fraction - start) / length
        peak = (table.peak(restart) if table is not None and table.peaks is not None
                else _cm.power(m_mul, restart))
        alpha = float(self.alpha)
        decayed = 0.5 * peak * (1.0 + _cm.cos(math.pi * fraction))
        return float(self.initial_learning_rate) * ((1 - alpha) * decayed + alpha)

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "first_decay_steps": self.first_decay_steps, "t_mul": self._t_mul,
                "m_mul": self._m_mul, "alpha": self.alpha, "name": self.name}


_BUILT_IN: dict[str, type[LearningRateSchedule]] = {
    cls.__name__: cls for cls in (ExponentialDecay, PiecewiseConstantDecay, PolynomialDecay,
                                  InverseTimeDecay, CosineDecay, CosineDecayRestarts)}
_MODULE = "mpcore.optimizers.schedules"


def serialize(schedule: LearningRateSchedule) -> dict[str, Any]:
    """Keras 3's form of a serialized object: module, class name, config and registered name
    (None for a built-in; the class name for another, found again through ``custom_objects``
    or its module)."""
    if not isinstance(schedule, LearningRateSchedule):
        raise TypeError(f"serialize takes a LearningRateSchedule, got {schedule!r}")
    cls = type(schedule)
    built_in = _BUILT_IN.get(cls.__name__) is cls
    return {"module": _MODULE if built_in else cls.__module__, "class_name": cls.__name__,
            "config": schedule.get_config(),
            "registered_name": None if built_in else cls.__name__}


def deserialize(config: dict[str, Any], custom_objects: dict[str, Any] | None = None
                ) -> LearningRateSchedule:
    """The schedule that :func:`serialize` described: a built-in by its class name, another
    from ``custom_objects`` or from its module."""
    if not isinstance(config, dict) or "class_name" not in config:
        raise ValueError(f"a serialized schedule is a dict with 'class_name' and 'config', got "
                         f"{config!r}")
    name = config["class_name"]
    cls = (custom_objects or {}).get(name) or _BUILT_IN.get(name)
    module = config.get("module")
    if cls is None and module and module != _MODULE:
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, LearningRateSchedule)):
        raise ValueError(f"unknown learning rate schedule {name!r}; built-in: "
                         f"{', '.join(_BUILT_IN)} (pass others in custom_objects)")
    return cls.from_config(dict(config.get("config", {})))


__all__ = ["CosineDecay", "CosineDecayRestarts", "ExponentialDecay", "InverseTimeDecay",
           "LearningRateSchedule", "PiecewiseConstantDecay", "PolynomialDecay", "deserialize",
           "serialize"]
