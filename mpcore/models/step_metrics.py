"""A step's metrics: what the loss tracker and each compiled metric add, computed inside the
step (so a traced step computes them on the device too), and added to the running values after
it. A metric with an ``update_state`` of its own (not by contribution) is updated after the
step, eagerly, from the step's predictions."""

from __future__ import annotations

from typing import Any

from mpcore import metrics as _metrics
from mpcore import ops
from mpcore.layers.base import flatten


def contributions(loss_tracker: _metrics.Mean, compiled: list[_metrics.Metric], loss: Any,
                  y: Any, y_pred: Any) -> list[Any]:
    """(total, count) for the loss tracker, then for each metric that updates by contribution."""
    n = flatten(y)[0].shape[0]
    pred = ops.stop_gradient(y_pred)
    return [loss_tracker.contribution(ops.stop_gradient(loss), float(n)),
            *(m.contribution(y, pred) for m in compiled  # type: ignore[attr-defined]
              if _metrics.updates_by_contribution(m))]


def update(loss_tracker: _metrics.Mean, compiled: list[_metrics.Metric], added: list[Any],
           y: Any, y_pred: Any) -> None:
    """Add a step's :func:`contributions`; update the other metrics from ``y_pred``."""
    by_contribution = [m for m in compiled if _metrics.updates_by_contribution(m)]
    for metric, (total, count) in zip([loss_tracker, *by_contribution], added):
        metric.accumulate(total, count)  # type: ignore[attr-defined]
    for metric in compiled:
        if not _metrics.updates_by_contribution(metric):
            metric.update_state(y, ops.stop_gradient(y_pred))
