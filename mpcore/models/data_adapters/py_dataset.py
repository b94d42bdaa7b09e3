"""``mp.utils.PyDataset`` (alias ``mp.utils.Sequence``): Keras 3's base class for a dataset
written in Python, one batch per index.

Subclass it, call ``super().__init__(**kwargs)``, and write ``__len__`` (the number of
batches) and ``__getitem__(index)`` (one whole batch: ``x``, ``(x,)``, ``(x, y)`` or
``(x, y, sample_weight)``); ``on_epoch_begin`` and ``on_epoch_end`` are called around each
epoch of ``fit`` (and around ``evaluate``/``predict``). ``workers``, ``use_multiprocessing``
and ``max_queue_size`` tell ``fit`` how to load it: ``workers`` threads call ``__getitem__``
ahead of the step, at most ``max_queue_size`` batches ahead. ``use_multiprocessing=True`` is
refused by ``fit`` with a clear error (threads only: mpcore does not fork processes holding
device memory).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any


class PyDataset:
    """Keras 3's ``keras.utils.PyDataset``: ``__init__(workers=1, use_multiprocessing=False,
    max_queue_size=10)``, ``__len__``, ``__getitem__``, ``num_batches``, ``on_epoch_begin``,
    ``on_epoch_end``."""

    def __init__(self, workers: int = 1, use_multiprocessing: bool = False,
                 max_queue_size: int = 10) -> None:
        self._workers = workers
        self._use_multiprocessing = use_multiprocessing
        self._max_queue_size = max_queue_size

    def _warn_if_super_not_called(self) -> None:
        # Keras 3's: a subclass that forgot super().__init__ gets the defaults, and a warning
        missing = [name for name in ("_workers", "_use_multiprocessing", "_max_queue_size")
                   if not hasattr(self, name)]
        if not missing:
            return
        self._workers = getattr(self, "_workers", 1)
        self._use_multiprocessing = getattr(self, "_use_multiprocessing", False)
        self._max_queue_size = getattr(self, "_max_queue_size", 10)
        warnings.warn("Your `PyDataset` class should call `super().__init__(**kwargs)` in its "
                      "constructor. `**kwargs` can include `workers`, `use_multiprocessing`, "
                      "`max_queue_size`. Do not pass these arguments to `fit()`, as they will "
                      "be ignored.", stacklevel=3)

    @property
    def workers(self) -> int:
        self._warn_if_super_not_called()
        return self._workers

    @workers.setter
    def workers(self, value: int) -> None:
        self._workers = value

    @property
    def use_multiprocessing(self) -> bool:
        self._warn_if_super_not_called()
        return self._use_multiprocessing

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        self._use_multiprocessing = value

    @property
    def max_queue_size(self) -> int:
        self._warn_if_super_not_called()
        return self._max_queue_size

    @max_queue_size.setter
    def max_queue_size(self, value: int) -> None:
        self._max_queue_size = value

    def __getitem__(self, index: int) -> Any:
        """The batch at position ``index``."""
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__(index), "
                                  "returning one batch")

    @property
    def num_batches(self) -> int | None:
        """The number of batches (``len(self)``), or None for an infinite dataset."""
        if hasattr(self, "__len__"):
            return len(self)  # type: ignore[arg-type]
        raise NotImplementedError(f"{type(self).__name__} must implement __len__ (or the "
                                  "num_batches property, None for an infinite dataset)")

    def __iter__(self) -> Iterator[Any]:
        """Every batch in order (endless where ``num_batches`` is None), no parallelism."""
        count = self.num_batches
        indices = itertools.count() if count is None else range(count)
        for index in indices:
            yield self[index]

    def on_epoch_begin(self) -> None:
        """Called at the start of every epoch."""

    def on_epoch_end(self) -> None:
        """Called at the end of every epoch (change the data between epochs here)."""


#: Keras' older name, kept by Keras 3 as an alias.
Sequence = PyDataset
