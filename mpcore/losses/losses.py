"""Losses, computed in float32 whatever the model's policy (16-bit predictions are cast up
first), reduced to the mean over the batch by default (Keras' "sum_over_batch_size").

Probabilities are clipped to ``[1e-7, 1 - 1e-7]`` before the log, as Keras does; with
``from_logits=True`` the log-softmax / log-sigmoid is computed stably from the logits instead
(``SparseCategoricalCrossentropy`` then uses the fused ``sparse_softmax_cross_entropy`` op).
As Keras, predictions that come straight out of the float32 ``softmax`` activation are scored
from its logits (see :func:`mpcore.layers.activations.softmax_logits`) by the cross-entropies:
the same loss and gradient within float32 rounding, without the clip, the log and their
backward passes, and exact where the clip would have capped a probability below 1e-7 (a loss
of at most 16.1 becomes the true, larger one).

Label ranges are not checked here per step (that would be a host read per step); ``Model.fit``
checks them once per call on the host, and the fused ``sparse_softmax_cross_entropy`` kernel
(used with and without ``from_logits``) checks its own inputs: at once on the CPU, at the next
host read on a device.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core import dtypes as _dtypes
from mpcore.core.naming import by_name
from mpcore.core.tensor import Tensor
from mpcore.layers import activations as _activations

EPSILON = 1e-7
REDUCTIONS = ("sum_over_batch_size", "sum", "none")


def _float(x: Any) -> Tensor:
    t = ops.constant(x) if not isinstance(x, Tensor) else x
    if t.dtype != "float64" and t.dtype != "float32":
        cast = ops.cast(t, "float32")
        _activations.carry_logits(t, cast)
        return cast
    return t


def _labels(y_true: Any) -> Tensor:
    t = y_true if isinstance(y_true, Tensor) else ops.constant(y_true)
    if not _dtypes.is_integer(t.dtype):
        t = ops.cast(t, "int32")
    return t


class Loss:
    """Base class: ``loss(y_true, y_pred, sample_weight=None)`` -> a float32 scalar (or
    per-example values with ``reduction="none"``)."""

    def __init__(self, reduction: str = "sum_over_batch_size", name: str | None = None) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(REDUCTIONS)}")
        self.reduction = reduction
        self.name = name or _snake_name(type(self).__name__)

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        """Per-example losses (shape (N,) for (N, C) predictions)."""
        raise NotImplementedError

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Tensor:
        values = self.call(y_true, _float(y_pred))
        if sample_weight is not None:
            values = ops.multiply(values, _weights_like(sample_weight, values))
        if self.reduction == "none":
            return values
        if self.reduction == "sum":
            return ops.sum(values)
        return ops.mean(values)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "reduction": self.reduction}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Loss:
        """The loss ``get_config`` describes: ``type(loss).from_config(loss.get_config())``."""
        return cls(**config)


def _weights_like(sample_weight: Any, values: Tensor) -> Tensor:
    """Sample weights in the losses' dtype (float64 weights would make a float64 loss) and
    shape, as Keras 3: ``(N,)`` or ``(N, 1)`` per sample, broadcast over the other axes of
    per-element losses (a sequence's ``(N, T)``), or one weight per element."""
    w = _float(sample_weight)
    if w.dtype != values.dtype:
        w = ops.cast(w, values.dtype)
    if w.shape == values.shape:
        return w
    if w.size == values.size:
        return ops.reshape(w, values.shape)
    if values.ndim >= 1 and w.size == values.shape[0]:
        per_sample = ops.reshape(w, (values.shape[0],) + (1,) * (values.ndim - 1))
        return ops.broadcast_to(per_sample, values.shape)
    raise ValueError(f"sample_weight of shape {w.shape} does not fit losses of shape "
                     f"{values.shape}: give one weight per sample or per loss value")


def _snake_name(cls: str) -> str:
    import re

    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", cls).lower()


def _check_classes(where: str, y_pred: Tensor) -> None:
    if y_pred.ndim < 1:
        raise ValueError(f"{where}: predictions need a class axis, got shape {y_pred.shape}")


class SparseCategoricalCrossentropy(Loss):
    """Cross-entropy between integer labels (N, ...) or (N, ..., 1) and class scores
    (N, ..., C); with ``reduction="none"`` one loss per label, in the labels' shape."""

    def __init__(self, from_logits: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.from_logits = bool(from_logits)

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        _check_classes(self.name, y_pred)
        labels = _labels(y_true)
        if labels.ndim == y_pred.ndim and labels.shape[-1] == 1:
            labels = ops.reshape(labels, labels.shape[:-1])
        if labels.shape != y_pred.shape[:-1]:
            raise ValueError(f"{self.name}: labels of shape {labels.shape} do not match "
                             f"predictions of shape {y_pred.shape} (expected labels "
                             f"{y_pred.shape[:-1]})")
        logits = y_pred if self.from_logits else _activations.softmax_logits(y_pred)
        if logits is None:
            # As Keras: the clipped log-probabilities as logits. The fused op checks the labels
            # on every backend; a one_hot product scored a label out of range as a silent zero.
            logits = ops.log(ops.clip_by_value(y_pred, EPSILON, 1.0 - EPSILON))
        if y_pred.ndim == 2:
            return ops.sparse_softmax_cross_entropy(labels, logits)
        # the fused op takes (N, C): other ranks go through it flat, and the per-example losses
        # keep the labels' shape ((N, T) for (N, T, C) predictions), as Keras'
        flat = ops.sparse_softmax_cross_entropy(ops.reshape(labels, (-1,)),
                                                ops.reshape(logits, (-1, y_pred.shape[-1])))
        return ops.reshape(flat, labels.shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


class CategoricalCrossentropy(Loss):
    """Cross-entropy between one-hot (or soft) labels and class scores, both (N, C)."""

    def __init__(self, from_logits: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.from_logits = bool(from_logits)

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        _check_classes(self.name, y_pred)
        target = ops.cast(_float(y_true), y_pred.dtype)
        if target.shape != y_pred.shape:
            raise ValueError(f"{self.name}: labels of shape {target.shape} do not match "
                             f"predictions of shape {y_pred.shape}")
        logits = y_pred if self.from_logits else _activations.softmax_logits(y_pred)
        if logits is not None:
            logp = ops.log_softmax(logits, axis=-1)
        else:
            logp = ops.log(ops.clip_by_value(y_pred, EPSILON, 1.0 - EPSILON))
        return ops.negative(ops.sum(ops.multiply(target, logp), axis=-1))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


class MeanSquaredError(Loss):
    """Mean over the last axis of ``(y_pred - y_true)**2``."""

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        target = ops.cast(_float(y_true), y_pred.dtype)
        if target.shape != y_pred.shape:
            raise ValueError(f"{self.name}: targets of shape {target.shape} do not match "
                             f"predictions of shape {y_pred.shape}")
        return ops.mean(ops.square(ops.subtract(y_pred, target)), axis=-1)


class BinaryCrossentropy(Loss):
    """Binary cross-entropy, averaged over the last axis."""

    def __init__(self, from_logits: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.from_logits = bool(from_logits)

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        target = ops.cast(_float(y_true), y_pred.dtype)
        if target.shape != y_pred.shape:
            raise ValueError(f"{self.name}: labels of shape {target.shape} do not match "
                             f"predictions of shape {y_pred.shape}")
        if self.from_logits:
            # max(x, 0) - x*z + log(1 + exp(-|x|)): no overflow for large |x|
            x = y_pred
            values = ops.add(ops.subtract(ops.relu(x), ops.multiply(x, target)),
                             ops.log(ops.add(ops.exp(ops.negative(ops.abs(x))), 1.0)))
        else:
            p = ops.clip_by_value(y_pred, EPSILON, 1.0 - EPSILON)
            values = ops.negative(ops.add(ops.multiply(target, ops.log(p)),
                                          ops.multiply(ops.subtract(1.0, target),
                                                       ops.log(ops.subtract(1.0, p)))))
        return ops.mean(values, axis=-1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


def sparse_categorical_crossentropy(y_true: Any, y_pred: Any, from_logits: bool = False) -> Tensor:
    return SparseCategoricalCrossentropy(from_logits, reduction="none")(y_true, y_pred)


def categorical_crossentropy(y_true: Any, y_pred: Any, from_logits: bool = False) -> Tensor:
    return CategoricalCrossentropy(from_logits, reduction="none")(y_true, y_pred)


def mean_squared_error(y_true: Any, y_pred: Any) -> Tensor:
    return MeanSquaredError(reduction="none")(y_true, y_pred)


def binary_crossentropy(y_true: Any, y_pred: Any, from_logits: bool = False) -> Tensor:
    return BinaryCrossentropy(from_logits, reduction="none")(y_true, y_pred)


_BY_NAME: dict[str, type[Loss]] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "mean_squared_error": MeanSquaredError, "mse": MeanSquaredError,
    "binary_crossentropy": BinaryCrossentropy,
}


def get(identifier: Any) -> Loss:
    """A Loss from a name, a Loss instance, or a callable ``(y_true, y_pred) -> values``."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        return by_name("loss", _BY_NAME, identifier)()
    if callable(identifier):
        return LossFunctionWrapper(identifier)
    raise TypeError(f"a loss is a name, a Loss or a callable, got {identifier!r}")


class LossFunctionWrapper(Loss):
    """A plain function ``fn(y_true, y_pred) -> per-example values`` as a Loss."""

    def __init__(self, fn: Any, **kwargs: Any) -> None:
        super().__init__(name=kwargs.pop("name", getattr(fn, "__name__", "loss")), **kwargs)
        self.fn = fn

    def call(self, y_true: Any, y_pred: Tensor) -> Tensor:
        return _float(self.fn(y_true, y_pred))
