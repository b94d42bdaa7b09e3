"""Merge layers, Keras 3's: ``Add``, ``Subtract``, ``Multiply``, ``Average``, ``Maximum``,
``Minimum`` and ``Concatenate``, each also as a function (``mp.layers.add([a, b])``).

A merge layer takes a list of tensors. The elementwise ones broadcast as Keras' do (each axis
after the batch axis equal or 1; an input of lower rank gets axes of size 1 after its batch
axis), and compute in the layer's compute dtype like any layer: ``Add`` of two 16-bit
activations is a 16-bit add (an *infer* op), so a residual block stays in 16 bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers.base import Layer, Shape


def _shapes(layer: Layer, input_shape: Any, at_least: int = 1) -> list[Shape]:
    where = f"{type(layer).__name__} {layer.name!r}"
    if not isinstance(input_shape, (list, tuple)) or not input_shape or not all(
            isinstance(s, tuple) for s in input_shape):
        raise ValueError(f"{where}: a merge layer is called on a list of tensors, got input "
                         f"shape {input_shape}")
    if len(input_shape) < at_least:
        raise ValueError(f"{where} needs at least {at_least} inputs, got {len(input_shape)}")
    batches = {s[0] for s in input_shape if s} - {None}
    if len(batches) > 1:
        raise ValueError(f"{where}: cannot merge tensors with different batch sizes, got "
                         f"shapes {list(input_shape)}")
    return list(input_shape)


def _broadcast(where: str, a: Shape, b: Shape, shapes: Sequence[Shape]) -> Shape:
    """The broadcast of two shapes without their batch axes (Keras' rule), or an error."""
    if len(a) < len(b):
        a, b = b, a
    out = list(a[:len(a) - len(b)])
    for i, j in zip(a[len(a) - len(b):], b):
        if i is None or j is None:
            out.append(None)
        elif i == 1 or j == 1 or i == j:
            out.append(j if i == 1 else i)
        else:
            raise ValueError(f"{where}: inputs have incompatible shapes {list(shapes)} (each "
                             "axis after the batch axis must be equal or 1)")
    return tuple(out)


class Merge(Layer):
    """Base of the elementwise merge layers: checks the shapes, then ``_merge_function``."""

    _at_least = 1

    def build(self, input_shape: Any) -> None:
        shapes = _shapes(self, input_shape, self._at_least)
        where = f"{type(self).__name__} {self.name!r}"
        out: Shape = shapes[0][1:]
        for s in shapes[1:]:
            out = _broadcast(where, out, s[1:], shapes)
        self._reshape_required = len({len(s) for s in shapes}) > 1

    def call(self, inputs: Any) -> Tensor:
        if not isinstance(inputs, (list, tuple)):
            raise ValueError(f"{type(self).__name__} {self.name!r}: a merge layer is called on "
                             f"a list of tensors, got {type(inputs).__name__}")
        xs = list(inputs)
        if self._reshape_required:  # Keras: axes of size 1 after the batch axis
            rank = max(x.ndim for x in xs)
            for i, x in enumerate(xs):
                while x.ndim < rank:
                    x = ops.expand_dims(x, 1)
                xs[i] = x
        return self._merge_function(xs)

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        raise NotImplementedError


def _fold(fn: Callable[[Tensor, Tensor], Tensor], xs: list[Tensor]) -> Tensor:
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


class Add(Merge):
    """The sum of its inputs (the residual connection)."""

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return _fold(ops.add, inputs)


class Subtract(Merge):
    """``inputs[0] - inputs[1]``: exactly two inputs."""

    def build(self, input_shape: Any) -> None:
        if isinstance(input_shape, (list, tuple)) and len(input_shape) != 2:
            raise ValueError(f"Subtract {self.name!r} takes exactly 2 inputs, got "
                             f"{len(input_shape)}")
        super().build(input_shape)

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return ops.subtract(inputs[0], inputs[1])


class Multiply(Merge):
    """The elementwise product of its inputs."""

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return _fold(ops.multiply, inputs)


class Average(Merge):
    """The elementwise mean of its inputs."""

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return ops.divide(_fold(ops.add, inputs), float(len(inputs)))


class Maximum(Merge):
    """The elementwise maximum of its inputs."""

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return _fold(ops.maximum, inputs)


class Minimum(Merge):
    """The elementwise minimum of its inputs."""

    def _merge_function(self, inputs: list[Tensor]) -> Tensor:
        return _fold(ops.minimum, inputs)


class Concatenate(Layer):
    """Its inputs joined along ``axis`` (the last by default); every other axis must match."""

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"Concatenate {self.name!r}: axis must be an int, got {axis!r}")
        self.axis = axis

    def build(self, input_shape: Any) -> None:
        shapes = _shapes(self, input_shape)
        where = f"Concatenate {self.name!r}"
        ranks = {len(s) for s in shapes}
        rank = len(shapes[0])
        if len(ranks) > 1 or not -rank <= self.axis < rank:
            raise ValueError(f"{where}: inputs must have one rank and axis {self.axis} must be "
                             f"within it, got shapes {shapes}")
        axis = self.axis % rank
        for i in range(1, rank):
            sizes = {s[i] for s in shapes} - {None}
            if i != axis and len(sizes) > 1:
                raise ValueError(f"{where} needs inputs with matching shapes except along "
                                 f"axis {self.axis}, got shapes {shapes}")

    def call(self, inputs: Any) -> Tensor:
        return ops.concat(list(inputs), axis=self.axis)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis}


def add(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Add(**kwargs)(inputs)``."""
    return Add(**kwargs)(list(inputs))


def subtract(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Subtract(**kwargs)(inputs)``."""
    return Subtract(**kwargs)(list(inputs))


def multiply(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Multiply(**kwargs)(inputs)``."""
    return Multiply(**kwargs)(list(inputs))


def average(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Average(**kwargs)(inputs)``."""
    return Average(**kwargs)(list(inputs))


def maximum(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Maximum(**kwargs)(inputs)``."""
    return Maximum(**kwargs)(list(inputs))


def minimum(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``Minimum(**kwargs)(inputs)``."""
    return Minimum(**kwargs)(list(inputs))


def concatenate(inputs: Sequence[Any], axis: int = -1, **kwargs: Any) -> Any:
    """``Concatenate(axis=axis, **kwargs)(inputs)``."""
    return Concatenate(axis=axis, **kwargs)(list(inputs))
