"""An adapter's epochs (Keras 3's ``trainers/epoch_iterator.py``): how many batches each
epoch takes, and what happens when the data runs out.

- No ``steps`` (``steps_per_epoch``, ``validation_steps``, evaluate's and predict's ``steps``):
  an epoch is one pass. A generator's first epoch is its whole stream (its length is then
  known, for the next epochs' progress bars); a generator cannot restart, so a later epoch
  that finds it exhausted warns "Your input ran out of data" and training stops
  (:attr:`EpochIterator.exhausted`). Keras 3 would go on with the generator's first batches
  again, which it keeps after peeking at them: a silent repeat, not done here.
- ``steps`` given: an epoch takes ``steps`` batches, and the next epoch goes on where it
  stopped (Keras 3's). Arrays and a PyDataset start a new pass when one ends; one that ends
  inside an epoch cuts that epoch short with Keras 3's warning, and the next epoch starts a
  new pass. A generator, which cannot start again, that ends before ``steps`` batches of an
  epoch is bad input (issue 33: "steps_per_epoch beyond a finite dataset: one clear error"),
  a ValueError saying how many batches it gave and what to change; Keras 3 warns "Your input
  ran out of data" there and stops, a message easy to miss in a long log (the README lists
  this among the differences).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

from mpcore.models.data_adapters.adapters import Batch, DataAdapter

RAN_OUT = ("Your input ran out of data; interrupting training. Make sure that your dataset or "
           "generator can generate at least `steps_per_epoch * epochs` batches.")


class EpochIterator:
    """Epochs of ``adapter``, each :meth:`batches` between :meth:`on_epoch_begin` and
    :meth:`on_epoch_end`."""

    def __init__(self, adapter: DataAdapter, steps: int | None, what: str) -> None:
        self.adapter, self.steps, self.what = adapter, steps, what
        if steps is None and adapter.restartable and adapter.num_batches is None:
            raise ValueError(f"{what}: the data is endless (num_batches is None): give "
                             "steps_per_epoch (or steps) to say how many batches an epoch has")
        self._current: Iterator[Batch] | None = None
        self._seen = 0                    # batches taken from the current pass
        self._taken = 0                   # batches taken in all (a generator's, for errors)
        self._learned: int | None = None  # a generator's length, after its first epoch
        #: the data cannot give the batches asked for: stop training after this epoch
        self.exhausted = False

    @property
    def num_batches(self) -> int | None:
        """Batches per epoch where known (None: a generator's first epoch)."""
        return self.steps or self.adapter.num_batches or self._learned

    def on_epoch_begin(self) -> None:
        self.adapter.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.adapter.on_epoch_end()

    def batches(self) -> Iterator[tuple[int, Batch]]:
        """This epoch's ``(step, batch)``."""
        adapter = self.adapter
        if self.steps is None:
            if adapter.restartable:
                yield from enumerate(adapter.begin_pass())
                return
            count = 0
            for count, batch in enumerate(adapter.begin_pass(), 1):
                yield count - 1, batch
            if count == 0:
                self._ran_out(stop=True)
            elif self._learned is None:
                self._learned = count
            return
        for step in range(self.steps):
            known = adapter.num_batches
            if known is not None and self._current is not None and self._seen >= known:
                self._current = None
                self._ran_out(stop=False, step=step)
                return
            if self._current is None:
                self._current, self._seen = adapter.begin_pass(), 0
            batch = next(self._current, None)
            if batch is None:
                self._current = None
                if not adapter.restartable:
                    raise ValueError(
                        f"{self.what}: the generator ran out of data after {self._taken} "
                        f"batch(es), at step {step} of an epoch of steps={self.steps}: a "
                        "generator cannot start again, so it must give at least steps x "
                        "epochs batches. Lower the steps (or epochs), or make the generator "
                        "endless (`while True:` around its loop), or use a mp.utils.PyDataset, "
                        "which starts a new pass when one ends")
                self._ran_out(stop=step == 0, step=step)
                return
            self._seen += 1
            self._taken += 1
            yield step, batch
        known = adapter.num_batches
        if known is not None and self._seen >= known:
            self._current = None  # the pass ended with the epoch: the next starts a new one

    def _ran_out(self, stop: bool, step: int = 0) -> None:
        if stop:
            self.exhausted = True
            message = RAN_OUT
        else:
            message = (f"Your input ran out of data after {step} of the {self.steps} steps of "
                       "this epoch; the epoch ends here and the next one starts a new pass "
                       "over the data (as Keras 3). Make sure that your data can generate at "
                       "least `steps_per_epoch` batches.")
        warnings.warn(f"{self.what}: {message}", UserWarning, stacklevel=5)
