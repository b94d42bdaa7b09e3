"""Activation functions by name. Each returns its result in the dtype of its input: softmax is
computed in float32 (a *deny* op) and cast back, so a float16 layer stays float16 while a
``dtype="float32"`` layer outputs float32, as in the guide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore import ops
from mpcore.tensor import Tensor

Activation = Callable[[Tensor], Tensor]


def linear(x: Tensor) -> Tensor:
    return x


def relu(x: Tensor) -> Tensor:
    return ops.relu(x)


def sigmoid(x: Tensor) -> Tensor:
    return ops.sigmoid(x)


def tanh(x: Tensor) -> Tensor:
    return ops.tanh(x)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return ops.cast(ops.softmax(x, axis), x.dtype)


def gelu(x: Tensor, approximate: bool = False) -> Tensor:
    return ops.gelu(x, approximate=approximate)


ACTIVATIONS: dict[str, Activation] = {
    "linear": linear, "relu": relu, "sigmoid": sigmoid, "tanh": tanh, "softmax": softmax,
    "gelu": gelu,
}


def get(identifier: Any) -> Activation:
    """An activation from a name, a callable, or None (linear)."""
    if identifier is None:
        return linear
    if isinstance(identifier, str):
        if identifier not in ACTIVATIONS:
            raise ValueError(f"unknown activation {identifier!r}; valid names: "
                             f"{', '.join(ACTIVATIONS)}")
        return ACTIVATIONS[identifier]
    if callable(identifier):
        return identifier  # type: ignore[no-any-return]
    raise TypeError(f"an activation is a name or a callable, got {identifier!r}")


def name_of(fn: Activation) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
