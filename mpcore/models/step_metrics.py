"""A step's metrics. The loss tracker and each compiled metric that updates by contribution
(Mean and the MeanMetricWrappers: accuracy ...) are updated inside the step: their totals are
variables, so a traced step's replay updates them on the device exactly as the eager step
does, with no Python work per step. A metric with an ``update_state`` of its own is updated
after the step, eagerly, from the step's predictions."""

from __future__ import annotations

from typing import Any

from mpcore import metrics as _metrics
from mpcore import ops
from mpcore.layers.base import flatten


def update_in_step(loss_tracker: _metrics.Mean, compiled: list[_metrics.Metric], loss: Any,
                   y: Any, y_pred: Any) -> None:
    """Add the step's loss and what each metric that updates by contribution adds."""
    n = flatten(y)[0].shape[0]
    pred = ops.stop_gradient(y_pred)
    loss_tracker.accumulate(*loss_tracker.contribution(ops.stop_gradient(loss), float(n)))
    for m in compiled:
        if _metrics.updates_by_contribution(m):
            m.accumulate(*m.contribution(y, pred))  # type: ignore[attr-defined]


def update_after_step(compiled: list[_metrics.Metric], y: Any, y_pred: Any) -> None:
    """Update the metrics with an ``update_state`` of their own from ``y_pred``."""
    for metric in compiled:
        if not _metrics.updates_by_contribution(metric):
            metric.update_state(y, ops.stop_gradient(y_pred))
