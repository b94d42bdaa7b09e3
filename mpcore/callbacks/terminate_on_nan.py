"""Keras 3's TerminateOnNaN: stop training when the loss becomes NaN or infinite."""

from __future__ import annotations

import math
from typing import Any

from mpcore.callbacks.base import Callback
from mpcore.core import arguments as _args


def _bad(loss: Any) -> bool:
    try:
        return not math.isfinite(float(loss))
    except (TypeError, ValueError):
        return False


class TerminateOnNaN(Callback):
    """At each batch end, a NaN or infinite ``logs["loss"]`` (the epoch's running mean, which
    stays non-finite once a batch's loss was) sets ``model.stop_training`` after printing why;
    ``raise_error=True`` raises RuntimeError instead, so no ``on_train_end`` runs (a
    BackupAndRestore keeps its backup). Having this hook, it makes ``fit`` read the loss at
    each batch end (a host read per batch, as in Keras). Under a distribution the batch logs
    hold no loss; the epoch's is checked at its end."""

    def __init__(self, raise_error: bool = False) -> None:
        super().__init__()
        self.raise_error = _args.flag("raise_error", raise_error)

    def _check(self, where: str, logs: dict[str, float] | None) -> None:
        loss = (logs or {}).get("loss")
        if loss is None or not _bad(loss):
            return
        if self.raise_error:
            raise RuntimeError(f"NaN or Inf loss encountered at {where}. Loss value: {loss}. "
                               "Terminating training immediately.")
        print(f"{where.capitalize()}: Invalid loss, terminating training", flush=True)
        self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._check(f"batch {batch}", logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if not self.model.stop_training:
            self._check(f"the end of epoch {epoch + 1}", logs)
