"""The callbacks' base (Callback, CallbackList, the per-batch logs) and History,
ModelCheckpoint, EarlyStopping, LambdaCallback, LossScaleHistory, LossScaleMonitor; the others
live beside this module, one per file as in Keras (``mpcore.callbacks`` exports them all).

``logs`` hold Python floats (already read from the device), so callbacks add no host reads of
their own except where they say so. As Keras does, ``fit`` reads the loss and metrics for
``on_train_batch_end``'s logs only where a callback has that hook (:func:`reads_batch_results`:
a host read per batch). ``fit`` lists the keys its epoch logs will hold in ``params["metrics"]``
(as Keras 2), so a callback checks the keys it needs at ``on_train_begin``, before any
training.
"""

from __future__ import annotations

import logging
import math
import os
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from mpcore.core import arguments as _args

logger = logging.getLogger("mpcore")


class Callback:
    """Base class; ``self.model`` is set by ``fit``."""

    #: Whether this class's own ``on_train_batch_end`` reads the loss and metrics from its logs
    #: (for those, ``fit`` reads them from the device at each batch end, as Keras does); looked
    #: up on the class that defines the hook (:func:`reads_batch_results`).
    reads_batch_results = True

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None: ...
    def on_train_end(self, logs: dict[str, float] | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None: ...
    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None: ...


class CallbackList(Callback):
    def __init__(self, callbacks: Sequence[Callback] | None = None) -> None:
        super().__init__()
        self.callbacks = list(callbacks or [])
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks must be mp.callbacks.Callback instances, got "
                                f"{type(cb).__name__}")

    def set_model(self, model: Any) -> None:
        for cb in self.callbacks:
            cb.set_model(model)

    def set_params(self, params: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.set_params(params)

    def _each(self, method: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, method)(*args)

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._each("on_train_begin", logs)

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self._each("on_train_end", logs)

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._each("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._each("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._each("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._each("on_train_batch_end", batch, logs)


def reads_batch_results(callbacks: Sequence[Callback]) -> bool:
    """Whether a callback's ``on_train_batch_end`` may read the loss and metrics from its
    logs: one that overrides the hook (or a LambdaCallback given one), unless the class that
    defines the hook says ``reads_batch_results = False`` there (a subclass that overrides the
    hook of one that says so reads, unless it says so too), or the instance says so itself
    (TensorBoard reads them only when it writes per batch)."""
    for cb in callbacks:
        if "reads_batch_results" in vars(cb):
            if cb.reads_batch_results:
                return True
        elif isinstance(cb, CallbackList):
            if reads_batch_results(cb.callbacks):
                return True
        elif "on_train_batch_end" in vars(cb):
            return True
        else:
            owner = next(c for c in type(cb).__mro__ if "on_train_batch_end" in vars(c))
            if owner is not Callback and vars(owner).get("reads_batch_results", True):
                return True
    return False


def per_batch_results(callbacks: Sequence[Callback], world_size: int) -> bool:
    """Whether ``fit`` reads the results into ``on_train_batch_end``'s logs: where
    :func:`reads_batch_results`, in one process. Under a distribution that read is one every
    rank must make at once, and a rank's callbacks may differ, so it is not made (logged)."""
    wanted = reads_batch_results(callbacks)
    if wanted and world_size > 1:
        logger.warning("on_train_batch_end's logs hold no loss or metrics under a distribution "
                       "(a read every rank would have to make at once); on_epoch_end's hold them")
        return False
    return wanted


def batch_logs(batch: int, size: int, results: dict[str, float] | None) -> dict[str, float]:
    """``on_train_batch_end``'s logs, as Keras gives them: "batch", "size" and the loss's and
    metrics' running results over the epoch so far (``fit`` reads them at the batch's end
    where :func:`reads_batch_results`; a metric named "batch" or "size" wins, as in Keras 2)."""
    return {"batch": batch, "size": size, **(results or {})}


class History(Callback):
    """``history.history``: metric name -> one value per epoch; ``history.epoch``;
    ``history.steps``: series with one value per training step, from callbacks that record
    them (:class:`LossScaleMonitor`)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []
        self.steps: dict[str, list[Any]] = {}

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)


class LossScaleHistory(Callback):
    """Records the loss scale after every training step (``scales``), and which steps were
    skipped (``skipped``); reads no device value (the scale lives on the host)."""

    reads_batch_results = False

    def __init__(self) -> None:
        super().__init__()
        self.scales: list[float] = []
        self.skipped: list[int] = []
        self._step = 0
        self._last_skipped = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        opt = getattr(self.model, "optimizer", None)
        scale = getattr(opt, "loss_scale", None)
        self.scales.append(float(scale()) if scale is not None else 1.0)
        skipped = getattr(opt, "skipped_steps", 0)
        if skipped > self._last_skipped:
            self.skipped.append(self._step)
        self._last_skipped = skipped
        self._step += 1


class LossScaleMonitor(LossScaleHistory):
    """Per training step: the loss scale after the step (``scales``), whether the step was
    applied (``applied``) and, for a skipped step, the variables whose gradients held Inf or
    NaN (``nonfinite``: a list per step, empty where it was applied; found only for skipped
    steps, one host read per variable). At the end of training the History carries them as
    ``history.steps["loss_scale"]``, ``["applied"]`` and ``["nonfinite"]``."""

    reads_batch_results = False

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[bool] = []
        self.nonfinite: list[list[str]] = []

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        # one fit's steps per History
        self.scales, self.skipped, self.applied, self.nonfinite = [], [], [], []
        self._step = 0
        self._last_skipped = getattr(getattr(self.model, "optimizer", None), "skipped_steps", 0)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        before = len(self.skipped)
        super().on_train_batch_end(batch, logs)
        opt = getattr(self.model, "optimizer", None)
        if hasattr(opt, "loss_scale"):
            skipped = len(self.skipped) > before
            names = list(getattr(opt, "last_nonfinite", [])) if skipped else []
        else:
            # no loss scaling: the optimizer's own finite check, one host read per step
            flag = getattr(opt, "last_flag", None)
            skipped = flag is not None and not bool(flag)
            names = []
            if skipped:
                self.skipped.append(len(self.scales) - 1)
                names = opt.nonfinite_variables()
        self.applied.append(not skipped)
        self.nonfinite.append(names)

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        history = getattr(self.model, "history", None)
        if history is not None:
            history.steps.update({"loss_scale": list(self.scales), "applied": list(self.applied),
                                  "nonfinite": [list(n) for n in self.nonfinite]})


class LambdaCallback(Callback):
    """Callbacks from plain functions: ``on_epoch_end=lambda epoch, logs: ...`` etc."""

    def __init__(self, **hooks: Callable[..., None]) -> None:
        super().__init__()
        valid = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
                 "on_train_batch_begin", "on_train_batch_end")
        for name, fn in hooks.items():
            if name not in valid:
                raise ValueError(f"unknown hook {name!r}; valid: {', '.join(valid)}")
            setattr(self, name, fn)


def improved(mode: str, current: float, best: float, min_delta: float) -> bool:
    """Whether ``current`` beats ``best`` by more than ``min_delta`` in ``mode`` ("min" or
    "max"); shared by the monitoring callbacks of this package."""
    if mode == "min":
        return current < best - min_delta
    return current > best + min_delta


def check_monitor(owner: str, monitor: str, params: dict[str, Any]) -> None:
    available = params.get("metrics")
    if available is not None and monitor not in available:
        raise ValueError(f"{owner} monitors {monitor!r}, which fit's logs will not hold; "
                         f"available: {', '.join(available)}")


def mode_for(monitor: str, mode: str) -> str:
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode must be auto, min or max, got {mode!r}")
    if mode != "auto":
        return mode
    return "max" if "acc" in monitor else "min"


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs;
    ``restore_best_weights`` puts back the weights of the best epoch."""

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0,
                 mode: str = "auto", restore_best_weights: bool = False) -> None:
        super().__init__()
        self.monitor = monitor
        self.min_delta = abs(_args.number("min_delta", min_delta))
        self.patience = _args.integer("patience", patience, 0)
        self.mode = mode_for(monitor, mode)
        self.restore_best_weights = _args.flag("restore_best_weights", restore_best_weights)
        self.stopped_epoch: int | None = None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        check_monitor("EarlyStopping", self.monitor, self.params)
        self.wait = 0
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_weights: list[Any] | None = None
        self.stopped_epoch = None

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        if self.monitor not in logs:
            raise KeyError(f"EarlyStopping monitors {self.monitor!r}, which is not in the logs; "
                           f"available: {', '.join(logs) or 'none'}")
        current = logs[self.monitor]
        if improved(self.mode, current, self.best, self.min_delta):
            self.best, self.wait = current, 0
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)


class ModelCheckpoint(Callback):
    """Write a checkpoint (or only the weights) after every epoch, atomically. ``filepath`` may
    hold ``{epoch}`` and log keys (``"ckpt-{epoch:02d}-{val_loss:.3f}.mpck"``);
    ``save_best_only`` writes only when ``monitor`` improved. A template that is not a format
    string fails here; one that names a key fit's logs will not hold fails at
    ``on_train_begin``, before any training."""

    def __init__(self, filepath: str | os.PathLike[str], monitor: str = "val_loss",
                 save_best_only: bool = False, save_weights_only: bool = False,
                 mode: str = "auto") -> None:
        super().__init__()
        self.filepath, self.monitor = os.fspath(filepath), monitor
        self._keys = _template_keys(self.filepath)
        self.save_best_only = _args.flag("save_best_only", save_best_only)
        self.save_weights_only = _args.flag("save_weights_only", save_weights_only)
        self.mode = mode_for(monitor, mode)
        self.best = math.inf if self.mode == "min" else -math.inf

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if self.save_best_only:
            check_monitor("ModelCheckpoint", self.monitor, self.params)
        available = self.params.get("metrics")
        if available is None:  # not run by fit: no keys to check against
            return
        valid = ["epoch", *available]
        for key in self._keys:
            if key not in valid:
                raise ValueError(f"ModelCheckpoint filepath {self.filepath!r} uses {key!r}, "
                                 f"which fit's logs will not hold; valid keys: "
                                 f"{', '.join(valid)}")
        try:
            self.filepath.format(epoch=1, **dict.fromkeys(available, 0.0))
        except (ValueError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"ModelCheckpoint filepath {self.filepath!r} cannot be formatted: "
                             f"{exc} (epoch is an integer, the logs' values are floats)") from None

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                raise KeyError(f"ModelCheckpoint monitors {self.monitor!r}, which is not in the "
                               f"logs; available: {', '.join(logs) or 'none'}")
            if not improved(self.mode, current, self.best, 0.0):
                return
            self.best = current
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save_checkpoint(path, epoch=epoch + 1)


def _template_keys(filepath: str) -> list[str]:
    """The keys that the format string ``filepath`` names."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(filepath)
                  if field is not None]
    except ValueError as exc:
        raise ValueError(f"ModelCheckpoint filepath {filepath!r} is not a valid format string: "
                         f"{exc}") from None
    keys = []
    for field in fields:
        key = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not key or key.isdigit():
            raise ValueError(f"ModelCheckpoint filepath {filepath!r} has a positional field "
                             f"{{{field}}}; name a key instead, e.g. {{epoch:02d}} or "
                             "{val_loss:.3f}")
        keys.append(key)
    return keys
