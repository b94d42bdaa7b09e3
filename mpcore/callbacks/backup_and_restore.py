"""Keras 3's BackupAndRestore: resume a ``fit`` that was interrupted, at the epoch it had
reached, with what it had trained.

The backup is one mpcore checkpoint (:mod:`mpcore.checkpoint`: weights, optimizer slots and
iterations, the loss scale and its counters, the step count and ``mp.random``'s state, written
atomically under a checksum) in ``backup_dir``, with the epoch and batch stored alongside. A
backup made at an epoch's end resumes exactly: the next ``fit`` with this callback restores it
at ``on_train_begin`` and starts at the following epoch, with the same shuffles, so it ends
with the weights an uninterrupted run ends with. A backup made every ``save_freq`` batches
restores that batch's state and starts again at the start of its epoch, as Keras does (the
epoch's first batches are trained a second time).
"""

from __future__ import annotations

import contextlib
import os

from mpcore.callbacks.base import Callback
from mpcore.checkpoint import checkpoint as _checkpoint
from mpcore.core import arguments as _args

_FILE = "latest.mpck"


class BackupAndRestore(Callback):
    """Back up the training state in ``backup_dir`` at each epoch end (``save_freq="epoch"``)
    or every ``save_freq`` batches (an integer), and restore it when ``fit`` begins; the next
    epoch ``fit`` runs is the one after the backup's. ``delete_checkpoint=True`` removes the
    backup when ``fit`` ends normally (after its last epoch or an early stop), so a later
    ``fit`` starts afresh; an exception leaves it for the next ``fit``. The folder is this
    callback's: use it for nothing else. Keras' ``double_checkpoint`` is not needed: the
    checkpoint is replaced atomically, never left half written."""

    reads_batch_results = False

    def __init__(self, backup_dir: str | os.PathLike[str], save_freq: str | int = "epoch",
                 delete_checkpoint: bool = True) -> None:
        super().__init__()
        if not backup_dir:
            raise ValueError("Empty `backup_dir` argument passed")
        if save_freq != "epoch" and (isinstance(save_freq, bool)
                                     or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError("Invalid value for argument `save_freq`. Received: "
                             f"save_freq={save_freq!r}. Expected either 'epoch' or an integer "
                             ">= 1 (a number of batches).")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = _args.flag("delete_checkpoint", delete_checkpoint)
        self._path = os.path.join(self.backup_dir, _FILE)
        self._current_epoch = 0
        self._batches_since_save = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._current_epoch = 0
        self._batches_since_save = 0
        if not os.path.exists(self._path):
            return
        model = self.model
        if not model.weights:
            raise ValueError("To use the BackupAndRestore callback, your model must be built "
                             f"before you call `fit()`: model {model.name!r} has no weights "
                             "yet. Build it beforehand by calling it on a batch of data (or "
                             "give it an mp.Input).")
        extra = _checkpoint.restore(self._path, model)
        epoch = _args.integer("the backup's epoch", extra.get("epoch"), 0)
        self._current_epoch = epoch
        # fit reads this once, right after on_train_begin (Keras' attribute of the same name)
        model._initial_epoch = epoch

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._current_epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._current_epoch = epoch + 1
        if self.save_freq == "epoch":
            self._save(batch=0)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if self.save_freq == "epoch":
            return
        self._batches_since_save += 1
        if self._batches_since_save >= self.save_freq:
            self._batches_since_save = 0
            self._save(batch=batch + 1)

    def _save(self, batch: int) -> None:
        # the epoch to resume at: the next one after an epoch's end, else this one again
        _checkpoint.save(self._path, self.model, epoch=self._current_epoch, batch=batch)

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if not self.delete_checkpoint:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        # the folder goes if nothing else is in it (Keras removes the whole folder; files a
        # user put there are not this callback's to delete)
        with contextlib.suppress(OSError):
            os.rmdir(self.backup_dir)
