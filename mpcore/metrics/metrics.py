"""Metrics: running values kept on the device (a total and a count per metric), read on the host
only when ``result()`` is asked for, so updating them costs no host round trip per step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore import ops
from mpcore.core import dtypes as _dtypes
from mpcore.core.naming import by_name
from mpcore.core.tensor import Tensor, Variable
from mpcore.tracing.function import in_traced_step


class Metric:
    """Base class: ``update_state(y_true, y_pred, sample_weight=None)``, ``result()`` (a Python
    float), ``reset_state()``; calling the metric updates it and returns the result."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).__name__.lower()

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def result(self) -> float:
        raise NotImplementedError

    def reset_state(self) -> None:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """Keras 3's config of a metric: its name and dtype (mpcore's metrics are float32)."""
        return {"name": self.name, "dtype": "float32"}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Metric:
        config = dict(config)
        dtype = config.pop("dtype", "float32")
        if dtype not in (None, "float32"):
            raise ValueError(f"{cls.__name__}: mpcore's metrics accumulate in float32, got "
                             f"dtype={dtype!r}")
        return cls(**config)

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        """Keras' ``metric(...)``: ``update_state(...)``, then the running ``result()`` (a host
        read; loops that care about speed call ``update_state`` and read ``result`` once)."""
        self.update_state(*args, **kwargs)
        return self.result()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


class Mean(Metric):
    """The (weighted) mean of every value it has seen."""

    def __init__(self, name: str = "mean") -> None:
        super().__init__(name)
        self._make_variables(None)

    def reset_state(self) -> None:
        # assigned, not replaced: a traced step that resets the metric replays the reset
        self._total.assign(ops.zeros_like(self._total))
        self._count.assign(ops.zeros_like(self._count))

    def _make_variables(self, backend: Any) -> None:
        """The float32 total and count (Keras 3's metric variables), on ``backend`` (None: the
        current one); made with the metric, so a traced step that updates it creates none."""
        self._total = Variable(0.0, dtype="float32", trainable=False, backend=backend,
                               name=f"{self.name}/total", autocast=False)
        self._count = Variable(0.0, dtype="float32", trainable=False, backend=backend,
                               name=f"{self.name}/count", autocast=False)

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        """Add ``values``; ``sample_weight`` is a number (weights every value) or a tensor
        broadcastable to ``values``."""
        self.accumulate(*self.contribution(values, sample_weight))

    def contribution(self, values: Any, sample_weight: Any = None) -> tuple[Tensor,
                                                                            Tensor | float]:
        """What :meth:`update_state` adds, as ``(total, count)``, without adding it: a traced
        step computes it on the device and :meth:`accumulate` adds it after the step."""
        v = values if isinstance(values, Tensor) else ops.constant(values)
        if v.dtype != "float32" and v.dtype != "float64":
            v = ops.cast(v, "float32")
        if sample_weight is None:
            return ops.sum(v), float(v.size)
        if isinstance(sample_weight, (int, float)):
            return (ops.multiply(ops.sum(v), float(sample_weight)),
                    float(v.size) * float(sample_weight))
        w = sample_weight if isinstance(sample_weight, Tensor) else ops.constant(
            sample_weight, dtype=v.dtype)
        w = ops.cast(w, v.dtype)
        if w.shape != v.shape:
            w = ops.broadcast_to(ops.reshape(w, w.shape + (1,) * (v.ndim - w.ndim)), v.shape)
        return ops.sum(ops.multiply(v, w)), ops.sum(w)

    def accumulate(self, total: Tensor, count: Tensor | float) -> None:
        """Add a :meth:`contribution` to the running total and count: two float32 variables
        (Keras 3's metric variables, on the backend of the first contribution), updated by
        assignments, so a traced step that updates the metric updates it at every replay
        exactly as eagerly (a Python attribute would keep the trace's value)."""
        if total.backend is not self._total.backend:
            # the values moved to another backend: so does the state (read on the host once)
            kept = self.totals()
            self._make_variables(total.backend)
            self._total.assign(kept[0])
            self._count.assign(kept[1])
        self._total.assign_add(ops.cast(total, "float32"))
        self._count.assign_add(count if isinstance(count, float) else ops.cast(count, "float32"))

    @property
    def variables(self) -> list[Variable]:
        """The metric's state (Keras' ``metric.variables``): the total and the count."""
        return [self._total, self._count]

    def totals(self) -> tuple[float, float]:
        """The running (weighted) total and count, read on the host (to add other ranks')."""
        return float(self._total), float(self._count)

    def result(self) -> Any:
        """The mean so far (0 before any value): a Python float, or inside a traced step a
        0-d tensor (a device value the step returns: a float would be the trace's forever),
        so Keras' ``return {m.name: m.result() for m in self.metrics}`` works in a step."""
        if in_traced_step():
            count = self._count
            # divide_no_nan: 0 while the count is 0
            safe = ops.where(ops.equal(count, 0.0), ops.ones_like(count), count)
            return ops.where(ops.equal(count, 0.0), ops.zeros_like(self._total),
                             ops.divide(self._total, safe))
        if not float(self._count):
            return 0.0
        # the float32 quotient, as the traced step's: the same number either way
        return float(ops.divide(self._total, self._count))


class MeanMetricWrapper(Mean):
    """The mean of ``fn(y_true, y_pred)`` over every example seen."""

    def __init__(self, fn: Callable[[Any, Any], Tensor], name: str | None = None) -> None:
        super().__init__(name or getattr(fn, "__name__", "metric"))
        self.fn = fn

    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        self.accumulate(*self.contribution(y_true, y_pred, sample_weight))

    def contribution(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> tuple[Tensor, Tensor | float]:
        return super().contribution(self.fn(y_true, y_pred), sample_weight)


def updates_by_contribution(metric: Metric) -> bool:
    """Whether ``metric`` updates through :meth:`Mean.contribution` (so a traced step can
    compute its update): Mean and MeanMetricWrapper and their subclasses that keep their
    ``update_state``, not a metric with an ``update_state`` of its own."""
    return type(metric).update_state in (Mean.update_state, MeanMetricWrapper.update_state)


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else ops.constant(x)


def _as_labels(y: Tensor, like: Tensor) -> Tensor:
    """Integer labels of shape ``like.shape[:-1]`` from (N,) or (N, 1) labels."""
    if y.ndim == like.ndim and y.shape[-1] == 1:
        y = ops.reshape(y, y.shape[:-1])
    if not _dtypes.is_integer(y.dtype):
        y = ops.cast(y, "int64")
    return y


def sparse_categorical_accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """1.0 where ``argmax(y_pred)`` equals the integer label, else 0.0."""
    pred = _tensor(y_pred)
    labels = _as_labels(_tensor(y_true), pred)
    return ops.cast(ops.equal(ops.argmax(pred, -1), labels), "float32")


def categorical_accuracy(y_true: Any, y_pred: Any) -> Tensor:
    pred = _tensor(y_pred)
    return ops.cast(ops.equal(ops.argmax(pred, -1), ops.argmax(_tensor(y_true), -1)),
                    "float32")


def binary_accuracy(y_true: Any, y_pred: Any, threshold: float = 0.5) -> Tensor:
    pred = ops.cast(ops.greater(_tensor(y_pred), threshold), "float32")
    return ops.mean(ops.cast(ops.equal(pred, ops.cast(_tensor(y_true), "float32")), "float32"),
                    axis=-1)


def matched_accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """The accuracy the shapes call for, by Keras 3's rule for ``metrics=["accuracy"]`` with a
    loss that does not name one: binary for one output column, sparse categorical for integer
    labels (a rank lower than the predictions', or one column against several), else
    categorical."""
    pred, true = _tensor(y_pred), _tensor(y_true)
    if pred.ndim and pred.shape[-1] == 1:
        return binary_accuracy(true, pred)
    if true.ndim < pred.ndim or (true.ndim and true.shape[-1] == 1 and pred.shape[-1] > 1):
        return sparse_categorical_accuracy(true, pred)
    return categorical_accuracy(true, pred)


def accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """Exact equality of predictions and labels."""
    return ops.cast(ops.equal(_tensor(y_true), _tensor(y_pred)), "float32")


def _error(y_true: Any, y_pred: Any) -> Tensor:
    """``y_true - y_pred`` in float32: a metric's state is float32 whatever the policy."""
    return ops.subtract(ops.cast(_tensor(y_true), "float32"), ops.cast(_tensor(y_pred), "float32"))


def mean_squared_error(y_true: Any, y_pred: Any) -> Tensor:
    """Per sample: the mean over the last axis of ``(y_true - y_pred) ** 2`` (Keras 3's)."""
    return ops.mean(ops.square(_error(y_true, y_pred)), axis=-1)


def mean_absolute_error(y_true: Any, y_pred: Any) -> Tensor:
    """Per sample: the mean over the last axis of ``|y_true - y_pred|`` (Keras 3's)."""
    return ops.mean(ops.abs(_error(y_true, y_pred)), axis=-1)


class MeanSquaredError(MeanMetricWrapper):
    def __init__(self, name: str = "mean_squared_error") -> None:
        super().__init__(mean_squared_error, name)


class MeanAbsoluteError(MeanMetricWrapper):
    def __init__(self, name: str = "mean_absolute_error") -> None:
        super().__init__(mean_absolute_error, name)


class RootMeanSquaredError(Mean):
    """The square root of the mean squared error over every element seen (Keras 3's: the
    mean of the squares is accumulated, its root taken when read)."""

    def __init__(self, name: str = "root_mean_squared_error") -> None:
        super().__init__(name)

    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        self.accumulate(*self.contribution(y_true, y_pred, sample_weight))

    def contribution(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> tuple[Tensor, Tensor | float]:
        return super().contribution(ops.square(_error(y_true, y_pred)), sample_weight)

    def result(self) -> Any:
        mean = super().result()
        if isinstance(mean, Tensor):
            return ops.sqrt(mean)
        # the float32 root, as the traced step's
        return float(ops.sqrt(ops.divide(self._total, self._count))) if mean else 0.0


class SparseCategoricalAccuracy(MeanMetricWrapper):
    def __init__(self, name: str = "sparse_categorical_accuracy") -> None:
        super().__init__(sparse_categorical_accuracy, name)


class CategoricalAccuracy(MeanMetricWrapper):
    def __init__(self, name: str = "categorical_accuracy") -> None:
        super().__init__(categorical_accuracy, name)


class BinaryAccuracy(MeanMetricWrapper):
    def __init__(self, name: str = "binary_accuracy", threshold: float = 0.5) -> None:
        super().__init__(lambda t, p: binary_accuracy(t, p, threshold), name)
        self.threshold = threshold

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "threshold": self.threshold}


class Accuracy(MeanMetricWrapper):
    def __init__(self, name: str = "accuracy") -> None:
        super().__init__(accuracy, name)


_BY_NAME: dict[str, Callable[[], Metric]] = {
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "categorical_accuracy": CategoricalAccuracy,
    "binary_accuracy": BinaryAccuracy,
    "mean": Mean,
    "mean_squared_error": MeanSquaredError, "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError, "mae": MeanAbsoluteError,
    "root_mean_squared_error": RootMeanSquaredError,
}
_ACCURACY_BY_LOSS = {
    "SparseCategoricalCrossentropy": SparseCategoricalAccuracy,
    "CategoricalCrossentropy": CategoricalAccuracy,
    "BinaryCrossentropy": BinaryAccuracy,
}


def get(identifier: Any, loss: Any = None) -> Metric:
    """A Metric from a name, a Metric, or a function ``(y_true, y_pred) -> values``.

    ``"accuracy"``/``"acc"`` picks the accuracy that matches ``loss``, as Keras does (sparse
    categorical for SparseCategoricalCrossentropy ...), and keeps the name the user wrote; for
    any other loss (a plain function, say) the shapes decide (:func:`matched_accuracy`)."""
    if isinstance(identifier, Metric):
        return identifier
    if isinstance(identifier, str):
        key = identifier.lower()
        if key in ("accuracy", "acc"):
            cls = _ACCURACY_BY_LOSS.get(type(loss).__name__)
            if cls is None:     # a loss function, or a loss that names no accuracy
                return MeanMetricWrapper(matched_accuracy, name=identifier)
            return cls(name=identifier)  # type: ignore[call-arg]
        cls = by_name("metric", _BY_NAME, identifier, also_valid=("accuracy", "acc"))
        # the name the user wrote, as Keras 3's history keys ("mae", not "mean_absolute_error")
        return cls(name=identifier) if key in ("mse", "mae") else cls()
    if callable(identifier):
        return MeanMetricWrapper(identifier)
    raise TypeError(f"a metric is a name, a Metric or a callable, got {identifier!r}")
