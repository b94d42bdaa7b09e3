"""Keras 3's customisation points of a Model's steps: ``train_step(data)``, ``test_step(data)``
and ``predict_step(data)``, with ``compute_loss``, ``metrics`` and the metrics' ``result()``
dict a step returns, which goes to the progress bar, the callbacks and History.

``data`` is what fit gives each step, as Keras 3's: ``x``, ``(x,)``, ``(x, y)`` or
``(x, y, sample_weight)`` (:func:`unpack_x_y_sample_weight`). A model that keeps the built-in
steps trains through the fused path (one traced step that updates the metrics on the device,
no logs per step); an overridden step runs as written, traced as the built-in ones are under
``jit_compile`` (its metric updates replay: a metric's state is variables), and its returned
logs are read on the host when the progress bar or a callback asks for them.
"""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.core.tensor import Tensor
from mpcore.layers import added_losses as _added_losses
from mpcore.models import compile_utils as _compile


def unpack_x_y_sample_weight(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` from ``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sw)`` (Keras 3's
    ``keras.utils.unpack_x_y_sample_weight``)."""
    if isinstance(data, list):
        data = tuple(data)
    if not isinstance(data, tuple):
        return data, None, None
    if len(data) == 1:
        return data[0], None, None
    if len(data) == 2:
        return data[0], data[1], None
    if len(data) == 3:
        return data[0], data[1], data[2]
    raise ValueError("data is x, (x,), (x, y) or (x, y, sample_weight); got a tuple of "
                     f"{len(data)} elements")


def pack_x_y_sample_weight(x: Any, y: Any = None, sample_weight: Any = None) -> Any:
    """The inverse of :func:`unpack_x_y_sample_weight` (Keras 3's)."""
    if y is None:
        return (x,) if not isinstance(x, tuple) else x
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def host_logs(logs: Any, where: str) -> dict[str, Any]:
    """A step's returned logs as Python values: tensors read on the host (a 0-d one as a
    float), a nested dict flattened one level as Keras 3 does (``compile_metrics``)."""
    if not isinstance(logs, dict):
        raise TypeError(f"{where} must return a dict of metric names to values (Keras 3's "
                        f"``return {{m.name: m.result() for m in self.metrics}}``), got "
                        f"{type(logs).__name__}")
    out: dict[str, Any] = {}
    for key, value in logs.items():
        if isinstance(value, dict):
            out.update(host_logs(value, where))
        elif isinstance(value, Tensor):
            out[str(key)] = float(value) if value.size == 1 else value.numpy()
        else:
            out[str(key)] = value
    return out


class Steps:
    """Mixed into Model: the overridable steps and what they use."""

    loss: Any
    optimizer: Any
    compiled_metrics: list[Any]
    _loss_tracker: Any

    # --- the steps ------------------------------------------------------------------------
    def train_step(self, data: Any, y: Any = None) -> dict[str, Any]:
        """One training step on ``data`` (Keras 3's signature; ``train_step(x, y)`` works
        too): the built-in fused step, then the running metrics as a dict of floats. Override
        it to customise training, returning ``{m.name: m.result() for m in self.metrics}``."""
        x, y, sample_weight = unpack_x_y_sample_weight(data if y is None else (data, y))
        # the step's computation itself, not _train_batch: called as super().train_step(data)
        # from an overridden step, this runs inside that step's trace, where _train_batch's
        # own trace (cached on the model) and step count (the loop counts the overridden
        # step) would be Python state the trace refuses
        _, y_pred = self._train_compute(x, y, sample_weight)  # type: ignore[attr-defined]
        self._update_after_step(y, y_pred)  # type: ignore[attr-defined]
        return self._results(True)  # type: ignore[attr-defined,no-any-return]

    def test_step(self, data: Any, y: Any = None) -> dict[str, Any]:
        """One evaluation step on ``data``: the built-in step, then the running metrics."""
        x, y, sample_weight = unpack_x_y_sample_weight(data if y is None else (data, y))
        _, y_pred = self._test_compute(x, y, sample_weight)  # type: ignore[attr-defined]
        self._update_after_step(y, y_pred)  # type: ignore[attr-defined]  (as train_step)
        return self._results(True)  # type: ignore[attr-defined,no-any-return]

    def predict_step(self, data: Any) -> Any:
        """The model's outputs for ``data``'s ``x`` (override it to post-process them)."""
        x, _, _ = unpack_x_y_sample_weight(data)
        return self(x, training=False)  # type: ignore[operator]

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None,
                     sample_weight: Any = None, training: bool = True) -> Tensor:
        """The compiled loss of ``y`` and ``y_pred`` (weighted by ``sample_weight``) plus the
        losses the layers added (``add_loss``), as Keras 3's ``Model.compute_loss``."""
        if self.loss is None:
            raise RuntimeError("compute_loss needs a loss: model.compile(loss=...), or "
                               "compute the loss in train_step yourself")
        # with the losses layers added in the forward pass (Layer.add_loss), as Keras 3's
        return _added_losses.with_added(self.loss(y, y_pred, sample_weight), self)

    def compute_metrics(self, x: Any, y: Any, y_pred: Any,
                        sample_weight: Any = None) -> dict[str, Any]:
        """Keras 3's ``Model.compute_metrics``: the compiled metrics updated from ``y`` and
        ``y_pred``, then :meth:`get_metrics_result`. As in Keras 3 the loss tracker is the
        step's to update, and ``x`` is not used; ``sample_weight`` is not either (the
        compiled metrics are unweighted: Keras 3 weights only ``weighted_metrics``)."""
        del x, sample_weight
        loss = self._compile_loss  # type: ignore[attr-defined]
        names = loss.names if loss is not None else ["output"]
        ys = _compile.outputs_list(y, names, "y")
        preds = _compile.outputs_list(y_pred, names, "y_pred")
        for metric in self.compiled_metrics:
            i = getattr(metric, "output", 0)   # which output a metric of several belongs to
            metric.update_state(ys[i], ops.stop_gradient(preds[i]))
        return self.get_metrics_result()

    def get_metrics_result(self) -> dict[str, Any]:
        """Keras 3's: each of :attr:`metrics`' ``result()`` by name (a metric whose result is
        a dict adds its items); device values inside a traced step, as ``result()`` is."""
        out: dict[str, Any] = {}
        for metric in self.metrics:
            result = metric.result()
            if isinstance(result, dict):
                out.update(result)
            else:
                out[metric.name] = result
        return out

    @property
    def metrics(self) -> list[Any]:
        """The loss tracker (named ``"loss"``), each output's loss tracker (several outputs)
        and the compiled metrics, in that order."""
        return self._tracked_metrics()  # type: ignore[attr-defined,no-any-return]

    # --- how the loops run them ---------------------------------------------------------
    def _overrides(self, name: str) -> bool:
        """Whether the model's class overrides step ``name`` (so the loops call it)."""
        return getattr(type(self), name) is not getattr(Steps, name)

    def _custom_step(self, kind: str, data: Any) -> Any:
        """An overridden step on ``data``, traced under ``jit_compile`` as the built-in
        steps are (a trace per batch shape, replayed after)."""
        fn = getattr(self, f"{kind}_step")
        return self._step(f"custom_{kind}", fn, data)  # type: ignore[attr-defined]
