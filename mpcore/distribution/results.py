"""Metrics and the loss as global means: each rank's running (total, count) summed over the
ranks in one all-reduce of a few floats, then divided."""

from __future__ import annotations

from collections.abc import Sequence

from mpcore.distribution import api as _api
from mpcore.metrics.metrics import Mean, Metric


def results(metrics: Sequence[Metric]) -> list[float]:
    """Each metric's ``result()``, over every rank's samples under a distribution. A metric
    that is not a :class:`~mpcore.metrics.Mean` (no total and count to add) gives the mean
    of the ranks' results."""
    dist = _api.distribution()
    if dist is None:
        return [m.result() for m in metrics]
    values: list[float] = []
    for metric in metrics:
        values.extend(metric.totals() if isinstance(metric, Mean) else (metric.result(), 1.0))
    summed = dist.engine.allreduce_values(values, "sum")
    return [t / c if c else 0.0 for t, c in zip(summed[::2], summed[1::2])]
