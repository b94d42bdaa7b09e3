"""Activation functions by name. Each returns its result in the dtype of its input: softmax is
computed in float32 (a *deny* op) and cast back, so a float16 layer stays float16 while a
``dtype="float32"`` layer outputs float32, as in the guide."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from mpcore import ops
from mpcore.amp import hooks as _amp
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
    probs = ops.softmax(x, axis)
    deciding = _amp.deciding()
    if not deciding:
        # the layer's compute dtype; under automatic mixed precision the op's own decision
        # stands (softmax is a deny op: float32), as in the float32 graph it rewrites
        probs = ops.cast(probs, x.dtype)
    # under automatic mixed precision the logits are kept whatever the dtype softmax was
    # given (a user may allowlist it): the loss must take the same fused path as in the
    # float32 trace the rewrite follows (issue 18), and it computes from the logits in float32
    if (deciding or probs.dtype == "float32") and x.ndim and axis in (-1, x.ndim - 1):
        _remember_logits(probs, x)
    return probs


# The logits behind each live float32 softmax output (last axis), keyed by id: Tensor has
# __slots__ and an elementwise __eq__, so neither an attribute (Keras' ``_keras_logits``) nor a
# WeakKeyDictionary can hold them. An entry goes when its probabilities are freed.
_SOFTMAX_LOGITS: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}


def _remember_logits(probs: Tensor, logits: Tensor) -> None:
    key = id(probs)

    def forget(ref: weakref.ref[Tensor]) -> None:
        entry = _SOFTMAX_LOGITS.get(key)
        if entry is not None and entry[0] is ref:
            del _SOFTMAX_LOGITS[key]

    _SOFTMAX_LOGITS[key] = (weakref.ref(probs, forget), logits)


def softmax_logits(probs: Tensor) -> Tensor | None:
    """The float32 logits ``probs`` was computed from, when ``probs`` is the output of the
    ``softmax`` activation (last axis), else None. Probability losses use them, as Keras does,
    to compute the cross-entropy from the logits in one fused, stable op."""
    entry = _SOFTMAX_LOGITS.get(id(probs))
    if entry is None or entry[0]() is not probs:
        return None
    return entry[1]


def carry_logits(probs: Tensor, cast: Tensor) -> None:
    """``cast`` (a float32 cast of ``probs``) scores from the same logits as ``probs``: a loss
    casts 16-bit predictions up, as under an allowlisted softmax (automatic mixed precision)."""
    logits = softmax_logits(probs)
    if logits is not None and cast is not probs:
        _remember_logits(cast, logits)


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
