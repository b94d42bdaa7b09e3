"""The data adapters (Keras 3's ``trainers/data_adapters``): each gives ``fit``, ``evaluate``
and ``predict`` passes over its data as batches ``(x, y, sample_weight, rows)`` on the device
(``y`` and ``sample_weight`` None where the data has none; ``rows``: the global batch's).

- :class:`ArrayAdapter`: arrays (or dicts and lists of them) moved to the device once and
  sliced there; a shuffled pass gathers with one ``take`` per array from a permutation drawn
  from ``mp.random`` (the same on every rank under a distribution). The fast path.
- :class:`GeneratorAdapter`: a Python generator (any iterator). Its first batch is read at
  once, to check its structure; its length is unknown (``num_batches`` None) unless
  ``steps_per_epoch`` says it; it is one stream, consumed across epochs as Keras does, and it
  is never shuffled (Keras warns that ``shuffle`` is ignored; so does mpcore). The prefetch
  thread reads up to its queue's depth ahead: batches read but not trained on when ``fit``
  ends are gone from the generator (as with Keras' tf.data prefetch).
- :class:`PyDatasetAdapter`: a ``mp.utils.PyDataset``: ``len`` batches a pass, their order
  shuffled when ``shuffle`` (Keras 3's ``random.Random(epoch)`` order), ``on_epoch_begin`` and
  ``on_epoch_end`` called around each epoch; ``workers`` threads load it.

The host adapters load batches on worker threads (:mod:`.prefetch`) while the step runs, as
host arrays (:mod:`.host_batches`); the main thread moves each to the device, where the traced
step reads it. ``prefetch=False`` (``MPCORE_PREFETCH=0``) loads them in the main thread, for
comparison (``benchmarks/data_prefetch.py``) and debugging.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mpcore import ops
from mpcore.core import random as _random
from mpcore.distribution import sharding as _sharding
from mpcore.layers.base import flatten
from mpcore.models import data as _data
from mpcore.models.data_adapters import host_batches as _host
from mpcore.models.data_adapters.prefetch import OrderedPool, Prefetcher
from mpcore.models.data_adapters.py_dataset import PyDataset
from mpcore.plugins import settings as _settings

#: One batch on the device: x, y, sample_weight (None where absent) and its global rows.
Batch = tuple[Any, Any, Any, int]


def prefetch_enabled() -> bool:
    """Whether host batches are loaded on worker threads (``MPCORE_PREFETCH=0``: not)."""
    return _settings.env_choice("MPCORE_PREFETCH", ("1", "0")) == "1"


class DataAdapter:
    """A source of passes over the data."""

    #: batches in one pass, None where unknown (a generator) or endless
    num_batches: int | None = None
    #: samples in one pass, where known (arrays)
    samples: int | None = None
    #: whether each pass starts over (arrays, a PyDataset), or all passes are one stream
    restartable: bool = True

    def begin_pass(self) -> Iterator[Batch]:
        """The batches of a new pass (a generator's: the rest of its one stream)."""
        raise NotImplementedError

    def on_epoch_begin(self) -> None:
        """Before each epoch."""

    def on_epoch_end(self) -> None:
        """After each epoch."""

    def close(self) -> None:
        """Stop the workers (at the end of fit, evaluate or predict, or on an error)."""


class ArrayAdapter(DataAdapter):
    """Arrays on the device (``x``, ``y``, ``sample_weight``: tensors or structures of them,
    ``y`` and ``sample_weight`` may be None), ``num_batches`` batches of ``batch_size`` rows
    a pass (a distribution's plan may leave out a last batch too small for every rank)."""

    def __init__(self, x: Any, y: Any, sample_weight: Any, samples: int, batch_size: int,
                 num_batches: int, shuffle: bool, train: bool, shard: bool = True) -> None:
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.samples, self.batch_size, self.num_batches = samples, batch_size, num_batches
        # shard: under a distribution each rank takes its share (not predict: every row)
        self.shuffle, self.train, self.shard = shuffle, train, shard
        self.backend = flatten(x)[0].backend

    def begin_pass(self) -> Iterator[Batch]:
        order = None
        if self.shuffle:  # drawn now, at the epoch's start, not at the first batch
            with _random.shared():  # the same shuffle on every rank
                order = ops.random_permutation(self.samples, backend=self.backend)
        return self._batches(order)

    def _batches(self, order: Any) -> Iterator[Batch]:
        n, size = self.samples, self.batch_size
        assert n is not None
        for step in range(self.num_batches or 0):
            lo, hi = step * size, min((step + 1) * size, n)
            # this rank's rows of the batch
            a, b = _sharding.shard(lo, hi, self.train) if self.shard else (lo, hi)
            yield (_data.rows(self.x, a, b, order),
                   None if self.y is None else _data.rows(self.y, a, b, order),
                   None if self.sample_weight is None else _data.rows(self.sample_weight, a, b,
                                                                      order),
                   hi - lo)


class _HostAdapter(DataAdapter):
    """Batches made on the host (a generator's, a PyDataset's), checked against the first
    batch, moved to the device in the main thread (``x`` through ``to_device_x``: matched to
    the model's inputs by name)."""

    kind = "data"

    def __init__(self, to_device_x: Callable[[Any], Any], class_weight: Any) -> None:
        self._to_device_x = to_device_x
        self._class_weight = class_weight
        self._first: list[tuple[str, tuple[int, ...]]] | None = None
        self._first_lock = threading.Lock()  # workers > 1: one of them sets the first
        self._loaders: list[Any] = []

    def _host_batch(self, raw: Any, index: int) -> tuple[Any, Any, Any]:
        """Runs on a worker thread: the standardised, checked host batch."""
        where = f"batch {index} of the {self.kind}"
        batch = _host.standardize(raw, where)
        if self._class_weight is not None:
            if batch[2] is not None:
                raise ValueError(f"{where} holds sample weights and fit was given "
                                 "class_weight: give one or the other")
            if batch[1] is None:
                raise ValueError(f"class_weight needs labels: {where} holds only x")
            if isinstance(batch[1], (list, tuple, dict)):
                raise ValueError("`class_weight` is only supported for Models with a single "
                                 f"output: {where} holds several label arrays")
            batch = (batch[0], batch[1],
                     _host.class_weight_to_sample_weights(batch[1], self._class_weight))
        with self._first_lock:
            sig = _host.check(batch, self._first, where)
            if self._first is None:
                self._first = sig
        return batch

    def _device(self, batch: tuple[Any, Any, Any]) -> Batch:
        x, y, sw = batch
        return (self._to_device_x(x), None if y is None else _data.to_device(y),
                None if sw is None else _data.to_device(sw), _host.rows(batch))

    def _run(self, host: Iterator[tuple[Any, Any, Any]]) -> Iterator[Batch]:
        for batch in host:
            yield self._device(batch)

    def close(self) -> None:
        loaders, self._loaders = self._loaders, []
        for loader in loaders:
            loader.close()


class GeneratorAdapter(_HostAdapter):
    """A Python generator: one stream for every epoch, prefetched on one thread."""

    kind = "generator"
    restartable = False

    def __init__(self, generator: Iterator[Any], to_device_x: Callable[[Any], Any],
                 depth: int = 10) -> None:
        super().__init__(to_device_x, None)
        try:
            first = next(generator)
        except StopIteration:
            raise ValueError("the generator given to the model yielded no batch: the "
                             "generator must yield at least one batch (x, y)") from None
        # read here, in the caller's thread, so a bad first batch fails before any thread
        self._first_batch = self._host_batch(first, 0)
        self._made = 1
        self._stream = self._host_stream(generator)
        self._depth = depth
        self._iterator: Iterator[Batch] | None = None

    def _host_stream(self, generator: Iterator[Any]) -> Iterator[Any]:
        yield self._first_batch
        for raw in generator:
            self._made += 1
            yield self._host_batch(raw, self._made - 1)

    def begin_pass(self) -> Iterator[Batch]:
        if self._iterator is None:
            if prefetch_enabled():
                worker = Prefetcher(self._stream, self._depth, "generator")
                self._loaders.append(worker)
                self._iterator = self._run(worker)
            else:
                self._iterator = self._run(self._stream)
        return self._iterator


class PyDatasetAdapter(_HostAdapter):
    """A PyDataset: a pass is ``num_batches`` indices (in a shuffled order if ``shuffle``),
    loaded ``max_queue_size`` ahead by ``workers`` threads."""

    kind = "PyDataset"

    def __init__(self, dataset: PyDataset, to_device_x: Callable[[Any], Any], shuffle: bool,
                 class_weight: Any) -> None:
        super().__init__(to_device_x, class_weight)
        self.dataset = dataset
        self.shuffle = shuffle
        self._epoch = 0
        workers, depth = dataset.workers, dataset.max_queue_size
        for name, value in (("workers", workers), ("max_queue_size", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{type(dataset).__name__}({name}=...) must be an integer >= 0, "
                                 f"got {value!r}")
        if dataset.use_multiprocessing:
            raise ValueError(f"{type(dataset).__name__}(use_multiprocessing=True) is not "
                             "supported by mpcore: it loads a PyDataset on threads (workers="
                             f"{workers}); set use_multiprocessing=False")
        # workers=0: loaded in the main thread, as Keras 3; max_queue_size=0 (Keras: a queue
        # without bound) is one batch ahead here, so memory stays bounded
        depth = max(1, depth)
        self.workers, self.depth = workers, depth
        self.num_batches = self._count()

    def _count(self) -> int | None:
        count = self.dataset.num_batches
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < 0):
            raise ValueError(f"{type(self.dataset).__name__}.__len__ must return a number of "
                             f"batches >= 0, got {count!r}")
        return count

    def on_epoch_begin(self) -> None:
        self.dataset.on_epoch_begin()
        self.num_batches = self._count()   # (the epoch's progress bar reads it)

    def on_epoch_end(self) -> None:
        self.dataset.on_epoch_end()
        self._epoch += 1

    def begin_pass(self) -> Iterator[Batch]:
        self.close()  # a pass left unfinished (steps_per_epoch) ends here
        # read again each pass, as Keras 3: on_epoch_end may change the dataset's length
        count = self.num_batches = self._count()
        if count is None:
            indices: Any = _endless()
        else:
            indices = list(range(count))
            if self.shuffle:
                random.Random(self._epoch).shuffle(indices)  # Keras 3's order for an epoch

        def fetch(index: int) -> tuple[Any, Any, Any]:
            return self._host_batch(self.dataset[index], index)

        if not prefetch_enabled() or self.workers == 0:
            return self._run(fetch(i) for i in indices)
        if self.workers > 1:
            worker: Any = OrderedPool(fetch, indices, self.workers, self.depth, "pydataset")
        else:
            worker = Prefetcher((fetch(i) for i in indices), self.depth, "pydataset")
        self._loaders.append(worker)
        return self._run(worker)


def _endless() -> Iterator[int]:
    i = 0
    while True:
        yield i
        i += 1
