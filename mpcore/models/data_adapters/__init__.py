"""The data of ``fit``, ``evaluate`` and ``predict`` (Keras 3's ``trainers/data_adapters``):
arrays, dicts and lists of arrays, Python generators and ``mp.utils.PyDataset``s, with
``sample_weight`` and ``class_weight``, as batches on the device.

Design (issue 33, item 5): one adapter per kind of data (:mod:`.adapters`), the epochs over it
(:mod:`.epoch_iterator`), host batches checked and converted on worker threads
(:mod:`.host_batches`, :mod:`.prefetch`). Arrays keep mpcore's fast path: moved to the device
once and sliced there, no thread. A generator or a PyDataset is loaded ahead of the step on
threads (PyDataset ``use_multiprocessing=True`` is refused with a clear error), and moved to
the device in the main thread. Under a distribution only arrays are taken (each rank slices
its share of every global batch; a generator has no such share).

Keras 3's rules on what goes with what: ``y`` and ``sample_weight`` only with arrays (a
generator or PyDataset yields them in its batches), ``class_weight`` with arrays and a
PyDataset of single-output batches, not with a generator or ``sample_weight``;
``validation_split`` only with arrays; ``shuffle`` does not reorder a generator (a warning)
and reorders a PyDataset's batches.
"""

from __future__ import annotations

import collections.abc
import warnings
from typing import Any

from mpcore.core.tensor import Tensor
from mpcore.distribution import sharding as _sharding
from mpcore.models import data as _data
from mpcore.models.data_adapters import host_batches as _host
from mpcore.models.data_adapters.adapters import (
    ArrayAdapter,
    Batch,
    DataAdapter,
    GeneratorAdapter,
    PyDatasetAdapter,
)
from mpcore.models.data_adapters.epoch_iterator import EpochIterator
from mpcore.models.data_adapters.py_dataset import PyDataset, Sequence

__all__ = ["ArrayAdapter", "Batch", "DataAdapter", "EpochIterator", "GeneratorAdapter",
           "PyDataset", "PyDatasetAdapter", "Sequence", "arrays", "fit_data", "get_adapter",
           "is_arrays", "split"]


def is_generator(x: Any) -> bool:
    """A Python generator or any other iterator (not an array, a tensor or a PyDataset)."""
    return isinstance(x, collections.abc.Iterator) and not isinstance(x, (Tensor, PyDataset))


def is_arrays(x: Any) -> bool:
    return not (is_generator(x) or isinstance(x, PyDataset))


def _unsupported(name: str, description: str, kind: str) -> ValueError:
    # Keras 3's raise_unsupported_arg
    return ValueError(f"When providing `x` as a {kind}, `{name}` should not be passed. "
                      f"Instead, {description} should be included as part of the {kind}.")


def arrays(model: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any,
           what: str) -> tuple[Any, Any, Any, int]:
    """``x``, ``y`` and the sample weights (from ``class_weight`` if given) on the device, and
    their number of samples, which must agree."""
    if class_weight is not None:
        if sample_weight is not None:
            raise ValueError("You cannot pass `class_weight` and `sample_weight` at the same "
                             "time: give one or the other")
        if y is None:
            raise ValueError(f"{what}: class_weight needs y (the labels)")
        several = len(model.output_names) > 1 if model._is_graph else False
        if several or isinstance(y, dict) or (isinstance(y, (list, tuple))
                                              and not _data.is_nested_numbers(y)):
            raise ValueError("`class_weight` is only supported for Models with a single "
                             "output.")
        sample_weight = _host.class_weight_to_sample_weights(y, class_weight)
    xd = model._x(x, what)
    n = _data.count(xd, "x")
    yd = None if y is None else _data.to_device(y)
    swd = None if sample_weight is None else _data.to_device(sample_weight)
    for part, name in ((yd, "y"), (swd, "sample_weight")):
        if part is not None and _data.count(part, name) != n:
            raise ValueError(f"x has {n} samples but {name} has {_data.count(part, name)}")
    return xd, yd, swd, n


def split(data: tuple[Any, Any, Any, int],
          validation_split: float) -> tuple[tuple[Any, Any, Any, int], tuple[Any, Any, Any, int]]:
    """The data and its last ``validation_split`` (Keras: held out before any shuffling)."""
    xd, yd, swd, n = data
    cut = int(n * (1.0 - validation_split))
    if cut < 1 or cut >= n:
        raise ValueError(f"validation_split={validation_split} leaves no training or no "
                         f"validation samples out of {n}")

    def part(lo: int, hi: int) -> tuple[Any, Any, Any, int]:
        return (_data.rows(xd, lo, hi, None),
                None if yd is None else _data.rows(yd, lo, hi, None),
                None if swd is None else _data.rows(swd, lo, hi, None), hi - lo)

    return part(0, cut), part(cut, n)


def array_adapter(data: tuple[Any, Any, Any, int], batch_size: int | None,
                  steps: int | None, shuffle: bool, train: bool,
                  num_batches: int | None = None, shard: bool = True) -> ArrayAdapter:
    """Arrays already on the device; ``batch_size`` None: 32, or ``ceil(n / steps)`` when
    ``steps`` is given (Keras 3's)."""
    xd, yd, swd, n = data
    size = batch_size or (max(1, -(-n // steps)) if steps else 32)
    return ArrayAdapter(xd, yd, swd, n, size,   # (integer ceilings: a batch_size of 1e40)
                        -(-n // size) if num_batches is None else num_batches,
                        shuffle, train, shard)


def get_adapter(model: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any,
                batch_size: int | None, steps: int | None, shuffle: bool, train: bool,
                what: str) -> DataAdapter:
    """The adapter of ``x`` (a generator, a PyDataset, or arrays)."""
    kind = ("generator" if is_generator(x) else "PyDataset" if isinstance(x, PyDataset)
            else None)
    if kind is None:
        if x is None:
            raise ValueError(f"{what} needs x")
        data = arrays(model, x, y, sample_weight, class_weight, what)
        if data[3] == 0:
            raise ValueError(f"{what} got no samples")
        return array_adapter(data, batch_size, steps, shuffle, train)
    if y is not None:
        raise _unsupported("y", "the targets", kind)
    if sample_weight is not None:
        raise _unsupported("sample_weight", "the sample weights", kind)
    if _sharding.world_size() > 1:
        raise ValueError(f"{what} under a distribution takes arrays (every rank slices its "
                         f"share of each global batch); got a {kind}")

    if batch_size is not None:   # Keras 3 ignores it without a word: it batches nothing
        warnings.warn(f"{what}: batch_size={batch_size} is ignored: a {kind} yields whole "
                      "batches (Keras 3: do not specify batch_size for such data)",
                      UserWarning, stacklevel=3)

    def to_device_x(xb: Any) -> Any:
        return model._x(xb, what)

    if kind == "generator":
        if class_weight is not None:
            raise ValueError("Argument `class_weight` is not supported for Python generator "
                             "inputs: yield (x, y, sample_weight) batches instead")
        if shuffle and train:
            warnings.warn("`shuffle=True` was passed, but will be ignored since the data `x` "
                          "was provided as a generator. The generator is expected to yield "
                          "already-shuffled data.", UserWarning, stacklevel=4)
        return GeneratorAdapter(x, to_device_x)
    if class_weight is not None:
        _host.check_class_weight(class_weight)
        if len(model.output_names) > 1 and model._is_graph:
            raise ValueError("`class_weight` is only supported for Models with a single "
                             "output.")
    adapter = PyDatasetAdapter(x, to_device_x, shuffle and train, class_weight)
    if adapter.num_batches == 0:
        raise ValueError(f"{what}: the {type(x).__name__} has no batches (len 0)")
    return adapter


def _described(value: Any) -> str:
    # "got tuple" said nothing about a tuple of the wrong length
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} element(s)"
    return type(value).__name__


def fit_data(model: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any,
             batch_size: int | None, validation_split: float, validation_data: Any,
             shuffle: bool, steps_per_epoch: int | None, validation_steps: int | None,
             epochs: int, need_y: bool) -> tuple[EpochIterator, Any, EpochIterator | None]:
    """``fit``'s training epochs and its validation: arrays ``(x, y, sample_weight, n)`` on
    the device (``validation_data`` arrays, or the last ``validation_split`` of the data,
    held out before any shuffling as Keras does), or the epochs of a validation generator or
    PyDataset (one iterator for all of fit: a generator goes on across validations)."""
    val_arrays: Any = None
    val_iter: EpochIterator | None = None
    if validation_data is not None:
        if isinstance(validation_data, (tuple, list)) and 2 <= len(validation_data) <= 3:
            vx, vy, vsw = (*validation_data, None)[:3]
            val_arrays = arrays(model, vx, vy, vsw, None, "validation_data")
            if val_arrays[3] == 0:
                raise ValueError("fit got no validation samples in validation_data")
            if need_y and val_arrays[1] is None:
                raise ValueError("validation_data needs y: (x_val, y_val)")
        elif is_generator(validation_data) or isinstance(validation_data, PyDataset):
            adapter = get_adapter(model, validation_data, None, None, None, None,
                                  validation_steps, False, False, "validation_data")
            val_iter = EpochIterator(adapter, validation_steps, "validation_data")
        else:
            raise ValueError("validation_data must be a tuple (x_val, y_val) or (x_val, y_val, "
                             "val_sample_weight), a generator or a PyDataset; got "
                             f"{_described(validation_data)}")
    if not is_arrays(x):
        if validation_split and validation_data is None:
            raise ValueError("`validation_split` is only supported for arrays (x as arrays, "
                             "not a generator or a PyDataset); pass validation_data instead")
        adapter = get_adapter(model, x, y, sample_weight, class_weight, batch_size,
                              steps_per_epoch, shuffle, True, "fit")
        return EpochIterator(adapter, steps_per_epoch, "fit"), val_arrays, val_iter
    if x is None or (need_y and y is None):
        raise ValueError("fit needs x and y")
    data = arrays(model, x, y, sample_weight, class_weight, "fit")
    if validation_split and validation_data is None:
        data, val_arrays = split(data, validation_split)
        if class_weight is not None:   # Keras 3 weighs the training samples only
            val_arrays = (val_arrays[0], val_arrays[1], None, val_arrays[3])
    n = data[3]
    if n == 0:
        raise ValueError("fit got no training samples")
    if data[1] is not None:
        _data.validate_labels(model, data[0], data[1], "y")
    if val_arrays is not None and val_arrays[1] is not None:
        _data.validate_labels(model, val_arrays[0], val_arrays[1], "the validation labels")
    size = batch_size or (max(1, -(-n // steps_per_epoch)) if steps_per_epoch else 32)
    # every rank the same data, before the first step
    count = _sharding.plan("fit", n, size, val_arrays[3] if val_arrays else 0, epochs)
    adapter = array_adapter(data, size, steps_per_epoch, shuffle, True, count)
    return EpochIterator(adapter, steps_per_epoch, "fit"), val_arrays, val_iter
