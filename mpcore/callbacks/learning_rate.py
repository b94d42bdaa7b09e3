"""Keras 3's learning-rate callbacks: LearningRateScheduler (a rate per epoch from a function)
and ReduceLROnPlateau (a smaller rate when a monitored value stops improving).

Both set ``model.optimizer.learning_rate`` (a LossScaleOptimizer passes it to its inner
optimizer) and add the rate to the epoch's logs as ``"learning_rate"``, as Keras does; History
runs after them, so ``history.history["learning_rate"]`` holds it. An optimizer made with a
:class:`~mpcore.optimizers.schedules.LearningRateSchedule` refuses a rate set this way
(TypeError, Keras' rule).
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from typing import Any

from mpcore.callbacks.base import Callback, check_monitor, improved, mode_for
from mpcore.core import arguments as _args


def _optimizer(callback: Callback, owner: str) -> Any:
    opt = getattr(callback.model, "optimizer", None)
    if opt is None or not hasattr(opt, "learning_rate"):
        raise ValueError(f'{owner}: the optimizer must have a "learning_rate" attribute; '
                         f"compile the model with an mp.optimizers optimizer, got {opt!r}")
    return opt


def _float32(value: float) -> float:
    """``value`` rounded to float32 (the rate's dtype in Keras)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _verbose(value: Any) -> int:
    return _args.integer("verbose", value, 0)


def _takes_rate(schedule: Callable[..., Any]) -> bool:
    """Whether ``schedule`` takes (epoch, lr) rather than (epoch). Keras calls it with two and
    retries with one on any TypeError, which would also swallow a TypeError raised inside the
    schedule; the signature says which without calling it."""
    try:
        inspect.signature(schedule).bind(0, 0.0)
    except TypeError:
        return False
    except ValueError:   # no signature (some builtins): Keras' first try
        return True
    return True


class LearningRateScheduler(Callback):
    """At the start of each epoch, set the learning rate to ``schedule(epoch, lr)`` (or
    ``schedule(epoch)``), ``epoch`` counting from 0 and ``lr`` the current rate; ``verbose=1``
    prints each setting."""

    reads_batch_results = False

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise ValueError(f"schedule must be a function schedule(epoch, lr) or "
                             f"schedule(epoch) returning a float, got {schedule!r}")
        self.schedule = schedule
        self.verbose = _verbose(verbose)
        self._with_rate = _takes_rate(schedule)

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        opt = _optimizer(self, "LearningRateScheduler")
        if self._with_rate:
            rate = self.schedule(epoch, float(opt.learning_rate))
        else:
            rate = self.schedule(epoch)
        try:
            # a real, finite number >= 0 (Keras asks for a float; an int or a NumPy scalar
            # is taken too, a tensor, a string, a bool or NaN is not)
            rate = _args.number("learning_rate", rate, 0.0)
        except ValueError:
            raise ValueError(f"The output of the `schedule` function should be a float (a "
                             f"finite number >= 0). Got: {rate!r} at epoch {epoch}") from None
        opt.learning_rate = rate
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to "
                  f"{rate}.", flush=True)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(_optimizer(self, "LearningRateScheduler")
                                          .learning_rate)


class ReduceLROnPlateau(Callback):
    """Multiply the learning rate by ``factor`` (not below ``min_lr``) once ``monitor`` has
    not improved by more than ``min_delta`` for ``patience`` epochs, then wait ``cooldown``
    epochs before counting again. ``mode``: "min", "max" or "auto" (from the name: "max" for
    an accuracy, else "min"). An unknown ``monitor`` fails at ``on_train_begin`` (Keras warns
    at each epoch end and never reduces)."""

    reads_batch_results = False

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10,
                 verbose: int = 0, mode: str = "auto", min_delta: float = 1e-4,
                 cooldown: int = 0, min_lr: float = 0.0) -> None:
        super().__init__()
        if not isinstance(monitor, str):
            raise ValueError(f"monitor must be the name of a log key (e.g. 'val_loss'), got "
                             f"{monitor!r}")
        try:
            factor_f = _args.number("factor", factor, 0.0, 1.0, low_open=True, high_open=True)
        except ValueError:
            raise ValueError("ReduceLROnPlateau does not support a factor >= 1.0 (or <= 0): "
                             f"the factor must be in (0, 1). Received factor={factor!r}"
                             ) from None
        self.monitor = monitor
        self.factor = factor_f
        self.patience = _args.integer("patience", patience, 0)
        self.verbose = _verbose(verbose)
        self.mode = mode_for(monitor, mode)
        self.min_delta = abs(_args.number("min_delta", min_delta))
        self.cooldown = _args.integer("cooldown", cooldown, 0)
        self.min_lr = _args.number("min_lr", min_lr, 0.0)
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None   # Keras': the first value is an improvement
        self.cooldown_counter = 0
        self.wait = 0

    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        check_monitor("ReduceLROnPlateau", self.monitor, self.params)
        _optimizer(self, "ReduceLROnPlateau")
        self._reset()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        opt = _optimizer(self, "ReduceLROnPlateau")
        logs = logs if logs is not None else {}
        logs["learning_rate"] = float(opt.learning_rate)
        if self.monitor not in logs:
            raise KeyError(f"ReduceLROnPlateau monitors {self.monitor!r}, which is not in the "
                           f"logs; available: {', '.join(logs)}")
        current = logs[self.monitor]
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self.best is None or improved(self.mode, current, self.best, self.min_delta):
            self.best, self.wait = current, 0
        elif not self.in_cooldown():
            self.wait += 1
            if self.wait >= self.patience:
                old = float(opt.learning_rate)
                # float32's min_lr, as Keras compares: a rate already at min_lr stays
                if old > _float32(self.min_lr):
                    new = max(old * self.factor, self.min_lr)
                    opt.learning_rate = new
                    if self.verbose > 0:
                        print(f"\nEpoch {epoch + 1}: ReduceLROnPlateau reducing learning rate "
                              f"to {new}.", flush=True)
                    self.cooldown_counter = self.cooldown
                    self.wait = 0
