"""Embedding: integer ids to rows of a float32 table, with Keras 3's names and config keys."""

from __future__ import annotations

import operator
import warnings
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor, Variable
from mpcore.layers.base import Layer
from mpcore.layers.config import refuse_unsupported
from mpcore.tracing.function import in_traced_step


def _positive_int(layer: str, name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    try:
        n = operator.index(value)   # ints and NumPy integers, never a float such as 10.0
    except TypeError:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    return n


class Embedding(Layer):
    """Turns non-negative integer ids of any shape into rows of ``embeddings``, a float32
    table of shape ``(input_dim, output_dim)``: output shape ``(*ids.shape, output_dim)``.

    Precision rule (Keras 3's ``Embedding.call``): ids are never cast to a float dtype (the
    layer takes its inputs as they come; ids neither int32 nor int64 are cast to int32, as
    Keras does); the rows are gathered from the float32 table and the gathered rows cast to
    the compute dtype, so under a mixed policy only the rows read are cast and the gradient,
    a scatter-add of rows (``take``'s gradient), sums repeated ids in float32.

    An id outside ``[0, input_dim)`` is a ValueError naming ``input_dim`` and the id, in an
    eager call on every backend (two reductions read back to the host). A traced step cannot
    read the host, so there the backend's ``take`` decides: an IndexError on the CPU and on
    OpenCL (at the next host read there), a NaN row on CUDA (see ``mp.ops.take``).

    ``mask_zero=True`` is kept and reported by :meth:`compute_mask`; mpcore's layers do not
    propagate masks yet.
    """

    #: Ids are never cast to the compute dtype (a float16 id loses integers above 2048).
    _autocast = False

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer: Any = "uniform",
                 embeddings_regularizer: Any = None, embeddings_constraint: Any = None,
                 mask_zero: bool = False, weights: Any = None, **kwargs: Any) -> None:
        if kwargs.pop("input_length", None) is not None:   # Keras 3 drops it with this warning
            warnings.warn("Argument `input_length` is deprecated. Just remove it.", stacklevel=2)
        refuse_unsupported("Embedding", activity_regularizer=kwargs.pop("activity_regularizer",
                                                                        None),
                           lora_rank=kwargs.pop("lora_rank", None),
                           quantization_config=kwargs.pop("quantization_config", None))
        super().__init__(**kwargs)
        where = f"Embedding {self.name!r}"
        self.input_dim = _positive_int(where, "input_dim", input_dim)
        self.output_dim = _positive_int(where, "output_dim", output_dim)
        refuse_unsupported(where, embeddings_regularizer=embeddings_regularizer,
                           embeddings_constraint=embeddings_constraint)
        self.embeddings_initializer = embeddings_initializer
        self.mask_zero = bool(mask_zero)
        if weights is not None:      # Keras' initial table: [table] or the table itself
            self.build()
            self.set_weights(weights if isinstance(weights, list) and len(weights) == 1
                             else [weights])

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return                    # built by weights= in the constructor, or directly
        self.embeddings: Variable = self.add_weight(
            "embeddings", (self.input_dim, self.output_dim), self.embeddings_initializer)
        self.built = True

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        ids = inputs
        if ids.dtype not in ("int32", "int64"):
            ids = ops.cast(ids, "int32")
        if not in_traced_step():
            self._check_ids(ids)
        # gather in float32, then cast only the rows read (Keras 3's order)
        return ops.cast(ops.take(self.embeddings, ids, axis=0), self.compute_dtype)

    def _check_ids(self, ids: Tensor) -> None:
        if ids.size == 0:
            return
        # two reductions on the device, two scalars read back (not the ids themselves)
        low, high = int(ops.min(ids)), int(ops.max(ids))
        bad = low if low < 0 else high if high >= self.input_dim else None
        if bad is not None:
            raise ValueError(f"Embedding {self.name!r}: ids must be in [0, input_dim) = "
                             f"[0, {self.input_dim}), got id {bad} (the ids span {low}..{high})")

    def compute_mask(self, inputs: Any, mask: Any = None) -> Tensor | None:
        """Keras' mask: where the ids are not 0, when ``mask_zero``; else None."""
        return ops.not_equal(inputs, 0) if self.mask_zero else None

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "embeddings_initializer": self.embeddings_initializer,
                "embeddings_regularizer": None, "activity_regularizer": None,
                "embeddings_constraint": None, "mask_zero": self.mask_zero,
                "quantization_config": None}
