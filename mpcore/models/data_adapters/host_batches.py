"""Batches a Python generator or a PyDataset yields, on the host: each standardised to
``(x, y, sample_weight)`` (Keras 3's ``x``, ``(x,)``, ``(x, y)``, ``(x, y, sample_weight)``),
its arrays made host arrays, and checked against the first batch: the same structure, and the
same shapes but for the batch axis (a batch of another shape would be a new trace of the step,
or a silent broadcast, so it is one clear error instead).

This module is the host boundary of the data: it runs in the prefetch worker thread on the
user's own host data, before ``ops.constant`` moves a batch to the device in the main thread.
That is why it may use NumPy (``np.asarray``, as ``ops.constant`` does with its input); nothing
else in the data adapters does. Keras 3's ``class_weight_to_sample_weights`` is here too: it
reads labels on the host, as Keras' does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mpcore.core.tensor import Tensor
from mpcore.layers.base import map_structure
from mpcore.models import data as _data

#: The names of a standardised batch's parts, for the error messages.
PARTS = ("x", "y", "sample_weight")


def standardize(batch: Any, where: str) -> tuple[Any, Any, Any]:
    """``batch`` as ``(x, y, sample_weight)`` (None for a missing part), its arrays on the
    host. A dict or an array alone is ``x`` (as Keras 3's PyDataset adapter takes it)."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        if isinstance(batch, (dict, Tensor)) or hasattr(batch, "shape"):
            batch = (batch,)
        else:
            raise ValueError(f"{where} must be a tuple (x,), (x, y) or (x, y, sample_weight), "
                             f"a dict of inputs or an array; got {type(batch).__name__}")
    if not 1 <= len(batch) <= 3:
        raise ValueError(f"{where} must be a tuple (x,), (x, y) or (x, y, sample_weight); got "
                         f"a tuple of {len(batch)} elements")
    parts = [_host(part) for part in batch]
    parts += [None] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def _host(part: Any) -> Any:
    if part is None:
        return None
    if _data.is_nested_numbers(part):
        return np.asarray(part)  # rows as Python lists: one array, as fit takes them
    return map_structure(lambda a: a if isinstance(a, Tensor) else np.asarray(a), part)


def signature(batch: tuple[Any, Any, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Each array's path and shape without the batch axis, in order (the structure too:
    a different structure gives different paths)."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for name, part in zip(PARTS, batch):
        if part is not None:
            _leaves(part, name, out)
    return out


def _leaves(value: Any, path: str, out: list[tuple[str, tuple[int, ...]]]) -> None:
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _leaves(v, f"{path}[{i}]", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _leaves(v, f"{path}[{k!r}]", out)
    else:
        shape = tuple(value.shape)
        if not shape:
            raise ValueError(f"{path} is a scalar: every array of a batch needs a batch axis")
        out.append((path, shape))


def check(batch: tuple[Any, Any, Any], first: list[tuple[str, tuple[int, ...]]] | None,
          where: str) -> list[tuple[str, tuple[int, ...]]]:
    """The batch's signature, after checking it against the first batch's (``first``) and
    that all its arrays have the same number of rows."""
    sig = signature(batch)
    rows = {shape[0] for _, shape in sig}
    if len(rows) > 1:
        sizes = ", ".join(f"{path}: {shape[0]}" for path, shape in sig)
        raise ValueError(f"{where}: its arrays need the same number of samples, got {sizes}")
    if first is None:
        return sig
    paths, first_paths = [p for p, _ in sig], [p for p, _ in first]
    if paths != first_paths:
        raise ValueError(f"{where} holds {', '.join(paths)}, but the first batch held "
                         f"{', '.join(first_paths)}: every batch needs the first one's "
                         "structure")
    for (path, shape), (_, want) in zip(sig, first):
        if shape[1:] != want[1:]:
            raise ValueError(f"{where}: {path} has shape {shape}, but the first batch's had "
                             f"{want}; every batch needs the first one's shape but for the "
                             "batch axis")
    return sig


def rows(batch: tuple[Any, Any, Any]) -> int:
    """The number of samples of a checked batch."""
    return signature(batch)[0][1][0]


def class_weight_to_sample_weights(y: Any, class_weight: Mapping[Any, float]) -> Any:
    """Keras 3's: one weight per sample from its class (integer labels, labels with a last
    axis of 1, or one-hot rows, taken by argmax); classes not in ``class_weight`` weigh 1."""
    table = check_class_weight(class_weight)
    labels = y.numpy() if isinstance(y, Tensor) else np.asarray(y)
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else labels[..., 0]
    if labels.ndim != 1:
        raise ValueError(f"class_weight needs one class per sample: labels of shape "
                         f"{y.shape} give {labels.shape}")
    labels = np.round(labels).astype("int64")
    return np.array([table.get(int(c), 1.0) for c in labels], dtype="float32")


def check_class_weight(class_weight: Any) -> dict[int, float]:
    """``class_weight`` as a dict of integer class -> float weight (Keras 3's checks)."""
    if not isinstance(class_weight, Mapping):
        raise ValueError("class_weight must be a dict of class indices to weights, got "
                         f"{type(class_weight).__name__}")
    table: dict[int, float] = {}
    for key, value in class_weight.items():
        try:
            table[int(key)] = float(value)
        except (TypeError, ValueError):
            raise ValueError("class_weight must be a dict with integer keys (class indices) "
                             f"and number values; got {key!r}: {value!r}") from None
        if isinstance(key, bool) or (isinstance(key, float) and not key.is_integer()):
            raise ValueError("class_weight must be a dict with integer keys (class indices); "
                             f"got the key {key!r}")
    return table
