"""Activation layers beyond ``Activation`` (in :mod:`mpcore.layers.core`): ``Softmax``,
Keras 3's, with its mask and its axis (an int or a tuple of axes)."""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers import activations
from mpcore.layers.base import Layer


def large_negative(dtype: str) -> float:
    """What a masked-out logit gets: Keras' -1e9, or -3e4 in float16 (whose max is 65504)."""
    return -3e4 if dtype == "float16" else -1e9


class Softmax(Layer):
    """Softmax over ``axis`` (an int, or a tuple of axes normalised together), computed in
    float32 (a *deny* op) and returned in the compute dtype. ``mask`` (1 keep, 0 drop, of the
    inputs' shape or broadcastable to it) adds a large negative number to dropped logits."""

    def __init__(self, axis: int | tuple[int, ...] = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.axis = axis if isinstance(axis, int) else tuple(int(a) for a in axis)

    def call(self, inputs: Tensor, mask: Any = None) -> Tensor:
        x = inputs
        if mask is not None:
            keep = ops.cast(ops.convert_to_tensor(mask), x.dtype)
            x = ops.add(x, ops.multiply(ops.subtract(1.0, keep), large_negative(x.dtype)))
        if isinstance(self.axis, int):
            return activations.softmax(x, self.axis)
        if len(self.axis) == 1:
            return activations.softmax(x, self.axis[0])
        # several axes: exp(x - logsumexp(x)) in float32, shifted by the max for safety
        t = ops.cast(x, "float64" if x.dtype == "float64" else "float32")
        shifted = ops.subtract(t, ops.stop_gradient(ops.max(t, self.axis, keepdims=True)))
        lse = ops.log(ops.sum(ops.exp(shifted), self.axis, keepdims=True))
        return ops.cast(ops.exp(ops.subtract(shifted, lse)), x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis}
