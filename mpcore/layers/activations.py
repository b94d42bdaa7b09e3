"""Activation functions by name. Each returns its result in the dtype of its input: softmax is
computed in float32 (a *deny* op) and cast back, so a float16 layer stays float16 while a
``dtype="float32"`` layer outputs float32, as in the guide."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.mixed_precision import amp_hooks as _amp

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


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Computed in float32 (a *deny* op), returned in the input's dtype."""
    return ops.cast(ops.log_softmax(x, axis), x.dtype)


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (Keras 3's ``silu``, also named ``swish``)."""
    return ops.multiply(x, ops.sigmoid(x))


swish = silu


def softplus(x: Tensor) -> Tensor:
    """``log(1 + exp(x))``, as ``max(x, 0) + log(1 + exp(-|x|))`` so it cannot overflow;
    float32 inside (exp and log are *deny* ops), the input's dtype out."""
    t = ops.cast(x, "float64" if x.dtype == "float64" else "float32")
    y = ops.add(ops.relu(t), ops.log(ops.add(ops.exp(ops.negative(ops.abs(t))), 1.0)))
    return ops.cast(y, x.dtype)


def softsign(x: Tensor) -> Tensor:
    return ops.divide(x, ops.add(ops.abs(x), 1.0))


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """``x`` where positive, else ``alpha * (exp(x) - 1)`` (exp in float32)."""
    t = ops.cast(x, "float64" if x.dtype == "float64" else "float32")
    neg = ops.multiply(ops.subtract(ops.exp(ops.minimum(t, 0.0)), 1.0), alpha)
    return ops.cast(ops.where(ops.greater(t, 0.0), t, neg), x.dtype)


def relu6(x: Tensor) -> Tensor:
    return ops.minimum(ops.relu(x), 6.0)


def leaky_relu(x: Tensor, negative_slope: float = 0.2) -> Tensor:
    """Keras 3's default slope, 0.2."""
    return ops.maximum(x, ops.multiply(x, negative_slope))


def hard_sigmoid(x: Tensor) -> Tensor:
    """Keras 3's: ``relu6(x + 3) / 6``."""
    return ops.divide(relu6(ops.add(x, 3.0)), 6.0)


def hard_silu(x: Tensor) -> Tensor:
    return ops.multiply(x, hard_sigmoid(x))


hard_swish = hard_silu


def exponential(x: Tensor) -> Tensor:
    return ops.cast(ops.exp(x), x.dtype)


def mish(x: Tensor) -> Tensor:
    return ops.multiply(x, ops.tanh(softplus(x)))


ACTIVATIONS: dict[str, Activation] = {
    "linear": linear, "relu": relu, "sigmoid": sigmoid, "tanh": tanh, "softmax": softmax,
    "gelu": gelu, "log_softmax": log_softmax, "silu": silu, "swish": swish,
    "softplus": softplus, "softsign": softsign, "elu": elu, "relu6": relu6,
    "leaky_relu": leaky_relu, "hard_sigmoid": hard_sigmoid, "hard_silu": hard_silu,
    "hard_swish": hard_swish, "exponential": exponential, "mish": mish,
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
