"""``Model.summary``: the layers, their output shapes, dtype policies and parameter counts."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from mpcore.core import arguments as _args
from mpcore.layers.base import InputLayer

#: The widths of the output shape, policy and parameter count columns; the layer column takes
#: the rest of ``line_length``.
_FIXED_COLUMNS = (22, 18, 12)


def summary(model: Any, print_fn: Callable[[str], Any] | None = None,
            line_length: int = 88) -> None:
    out = print_fn or (lambda s: print(s, file=sys.stdout))
    line_length = _args.integer("line_length", line_length, sum(_FIXED_COLUMNS) + 20)
    cols = (line_length - sum(_FIXED_COLUMNS), *_FIXED_COLUMNS)
    rule = "_" * line_length
    out(f'Model: "{model.name}"')
    out(rule)
    out(_row(("Layer (type)", "Output Shape", "Policy", "Param #"), cols))
    out("=" * line_length)
    for layer in model.layers:
        try:
            shape = str(layer.output_shape)
        except AttributeError:
            shape = "?"
        if isinstance(layer, InputLayer):
            shape = str(layer.batch_shape)
        out(_row((f"{layer.name} ({type(layer).__name__})", shape,
                  layer.dtype_policy.name, str(layer.count_params())), cols))
    out("=" * line_length)
    trainable = sum(v.size for v in model.trainable_weights)
    total = model.count_params()
    out(f"Total params: {total:,}")
    out(f"Trainable params: {trainable:,}")
    out(f"Non-trainable params: {total - trainable:,}")
    out(rule)


def _row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "".join(f" {v:<{w - 1}}" if len(v) < w - 1 else f" {v[:w - 2]}~"
                   for v, w in zip(values, widths))
