"""Reshaping layers, Keras 3's: ``Reshape`` and ``Permute`` (``Flatten`` is in
:mod:`mpcore.layers.core`). Both leave the batch axis alone."""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import Layer


class Reshape(Layer):
    """Each example reshaped to ``target_shape`` (without the batch axis; one entry may be
    -1, inferred from the size)."""

    def __init__(self, target_shape: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            shape = tuple(int(d) for d in target_shape)
        except TypeError:
            raise TypeError(f"Reshape {self.name!r}: target_shape must be a tuple of ints, got "
                            f"{target_shape!r}") from None
        if sum(d == -1 for d in shape) > 1 or any(d < -1 or d == 0 for d in shape):
            raise ValueError(f"Reshape {self.name!r}: target_shape takes positive sizes and at "
                             f"most one -1, got {target_shape!r}")
        self.target_shape = shape

    def build(self, input_shape: Any) -> None:
        size = 1
        for d in input_shape[1:]:
            size *= d
        known = 1
        for d in self.target_shape:
            known *= d if d != -1 else 1
        fits = size % known == 0 if -1 in self.target_shape else size == known
        if not fits:
            raise ValueError(f"Reshape {self.name!r}: an example of shape "
                             f"{tuple(input_shape[1:])} ({size} values) cannot be reshaped "
                             f"to {self.target_shape}")

    def call(self, inputs: Tensor) -> Tensor:
        return ops.reshape(inputs, (inputs.shape[0], *self.target_shape))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "target_shape": self.target_shape}


class Permute(Layer):
    """The axes of each example reordered: ``dims`` is a permutation of 1..rank-1 (the batch
    axis, 0, stays first), e.g. ``Permute((2, 1))`` swaps the two axes of (batch, a, b)."""

    def __init__(self, dims: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dims = tuple(int(d) for d in dims)
        if sorted(self.dims) != list(range(1, len(self.dims) + 1)):
            raise ValueError(f"Permute {self.name!r}: dims must be a permutation of "
                             f"1..{len(self.dims)} (the batch axis is not permuted), got "
                             f"{dims!r}")

    def build(self, input_shape: Any) -> None:
        self._expect_input(len(self.dims) + 1, len(self.dims) + 1)

    def call(self, inputs: Tensor) -> Tensor:
        return ops.transpose(inputs, (0, *self.dims))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "dims": self.dims}
