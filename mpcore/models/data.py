"""The arrays of fit, evaluate and predict: inputs matched to the model's inputs by name, moved
to the backend once, counted, checked (sparse labels), and sliced into batches there (the
adapters of :mod:`mpcore.models.data_adapters` use these)."""

from __future__ import annotations

import numbers
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import KerasTensor, flatten, map_structure
from mpcore.losses import losses as _losses


def match_inputs(data: Any, inputs: Any, model_name: str) -> Any:
    """``data`` with a dict matched to a functional model's ``inputs`` by name, as Keras: by
    the keys of a dict of inputs, else by the names of the ``mp.Input`` tensors. Any other
    structure is returned as it is (it is matched by position)."""
    if not isinstance(data, dict):
        return data
    if isinstance(inputs, dict):
        names = list(inputs)
    else:
        names = [kt.name for kt in flatten(inputs) if isinstance(kt, KerasTensor)]
    unknown = [k for k in data if k not in names]
    missing = [k for k in names if k not in data]
    if unknown or missing:
        problems = [f"{label} {', '.join(map(repr, keys))}"
                    for label, keys in (("unknown", unknown), ("missing", missing)) if keys]
        raise ValueError(f"model {model_name!r} takes inputs named {', '.join(map(repr, names))};"
                         f" the data has {' and '.join(problems)}")
    if isinstance(inputs, dict):
        return {k: data[k] for k in names}
    return [data[k] for k in names]


def is_nested_numbers(data: Any) -> bool:
    """True for a (nested) list or tuple of numbers, such as ``array.tolist()`` or
    ``list(array)``."""
    while isinstance(data, (list, tuple)) and data:
        data = data[0]
    # numbers.Number, not (int, float): ``list(array)`` holds NumPy scalars (np.float32 is no
    # float), and each would otherwise be taken as an input of its own, of 0 samples
    return isinstance(data, numbers.Number)


def to_device(data: Any) -> Any:
    """Every array of ``data`` as a tensor on the current backend (tensors stay as they are)."""
    if is_nested_numbers(data):
        return ops.constant(data)  # rows as Python lists: one array, not one input per row
    return map_structure(lambda a: a if isinstance(a, Tensor) else ops.constant(a), data)


def count(data: Any, what: str) -> int:
    """The number of samples (rows) of every array of ``data``, which must agree."""
    sizes = {t.shape[0] if t.ndim else 0 for t in flatten(data)}
    if len(sizes) != 1:
        raise ValueError(f"all arrays of {what} need the same number of samples, got sizes "
                         f"{sorted(sizes)}")
    return sizes.pop()


def rows(data: Any, start: int, stop: int, order: Tensor | None) -> Any:
    """Rows ``start:stop`` of every array of ``data``; of ``data[order]`` when ``order`` is
    a permutation (one ``take`` per array)."""
    if order is None:
        return map_structure(lambda t: t[start:stop], data)
    idx = order[start:stop]
    return map_structure(lambda t: ops.take(t, idx, 0), data)


def validate_labels(model: Any, x: Any, y: Any, what: str) -> None:
    """Once per fit/evaluate, on the host: sparse labels must index the output classes."""
    if not isinstance(model.loss, _losses.SparseCategoricalCrossentropy):
        return
    labels = flatten(y)[0]
    if labels.size == 0:
        return
    classes = _output_classes(model, x)
    if classes is None:
        return
    lo, hi = ops.min(labels).item(), ops.max(labels).item()
    if lo < 0 or hi >= classes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} holds label {bad}, but labels must be in [0, {classes}) "
                         f"for model {model.name!r}, whose output has {classes} classes")


def _output_classes(model: Any, x: Any) -> int | None:
    if model._is_graph:
        shape = model.outputs[0].shape
    else:
        shape = flatten(model(rows(x, 0, 1, None), training=False))[0].shape
    return shape[-1] if shape else None
