"""Keras 3's ``Layer.add_loss``: losses a layer adds while it is called (an activity
regularizer, a KL term), which ``Model.compute_loss`` and the built-in steps add to the
compiled loss.

As in Keras 3, the outermost layer call on tensors clears the losses of that layer and of every
layer below it, so ``model.losses`` holds the losses of the last forward pass only (a layer
called twice in one pass adds twice). A traced step records the kernels that compute the
losses, so a replay adds the same terms to the loss; the list itself is Python state that a
replay does not refill, so the built-in steps clear it once they have added it, and a step's
own code reads ``self.losses`` inside the step (``Layer._trace_ignored_attributes`` lets the
Python-state check pass it, for that reason).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.symbolic import flatten


class _Depth(threading.local):
    value = 0


_depth = _Depth()


def _walk(layer: Any) -> Iterator[Any]:
    """``layer`` and every layer below it, each once."""
    seen: set[int] = set()
    todo = [layer]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(current._sublayers())


@contextlib.contextmanager
def call_scope(layer: Any) -> Iterator[None]:
    """Around a layer's ``call``: the outermost call clears the losses below it first."""
    depth = _depth.value
    if depth == 0:
        clear(layer)
    _depth.value = depth + 1
    try:
        yield
    finally:
        _depth.value = depth


def add(layer: Any, loss: Any) -> None:
    """``layer.add_loss(loss)``: a tensor (or a structure of tensors) computed in ``call``."""
    for value in flatten(loss):
        if not isinstance(value, Tensor):
            raise TypeError(f"layer {layer.name!r}: add_loss takes tensors computed from the "
                            f"layer's inputs or weights, got {type(value).__name__}")
        layer._losses.append(value)


def collect(layer: Any) -> list[Tensor]:
    """The losses ``layer`` and the layers below it added in their last forward pass."""
    return [loss for current in _walk(layer) for loss in current._losses]


def clear(layer: Any) -> None:
    for current in _walk(layer):
        current._losses.clear()


def with_added(loss: Tensor, layer: Any) -> Tensor:
    """``loss`` plus the sum of every loss added below ``layer`` (each summed to a scalar in
    float32, as Keras 3's ``_aggregate_additional_loss``); the list cleared after."""
    added = collect(layer)
    if not added:
        return loss
    total = loss
    for value in added:
        total = ops.add(total, ops.sum(ops.cast(value, "float32")))
    clear(layer)
    return total
