"""A step's metrics. The loss tracker and each compiled metric that updates by contribution
(Mean and the MeanMetricWrappers: accuracy ...) are updated inside the step: their totals are
variables, so a traced step's replay updates them on the device exactly as the eager step
does, with no Python work per step. A metric with an ``update_state`` of its own is updated
after the step, eagerly, from the step's predictions."""

from __future__ import annotations

from typing import Any

from mpcore import ops
from mpcore.layers.base import flatten
from mpcore.metrics import metrics as _metrics


def update_in_step(loss_tracker: _metrics.Mean, output_losses: list[tuple[Any, Any]],
                   compiled: list[_metrics.Metric], loss: Any, ys: list[Any],
                   preds: list[Any]) -> None:
    """Add the step's loss, each output's loss (``(tracker, value)`` pairs) and what each
    metric that updates by contribution adds, from its output (``metric.output``)."""
    n = flatten(ys[0])[0].shape[0]
    loss_tracker.accumulate(*loss_tracker.contribution(ops.stop_gradient(loss), float(n)))
    for tracker, value in output_losses:
        tracker.accumulate(*tracker.contribution(ops.stop_gradient(value), float(n)))
    for m in compiled:
        if _metrics.updates_by_contribution(m):
            i = getattr(m, "output", 0)
            m.accumulate(*m.contribution(ys[i], ops.stop_gradient(preds[i])))  # type: ignore[attr-defined]


def update_after_step(compiled: list[_metrics.Metric], ys: list[Any], preds: list[Any]) -> None:
    """Update the metrics with an ``update_state`` of their own from their output."""
    for metric in compiled:
        if not _metrics.updates_by_contribution(metric):
            i = getattr(metric, "output", 0)
            metric.update_state(ys[i], ops.stop_gradient(preds[i]))
