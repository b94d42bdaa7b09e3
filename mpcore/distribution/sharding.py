"""How ``fit`` and ``evaluate`` split a global batch: rank ``r`` of ``s`` takes the
contiguous rows ``[lo + n*r//s, lo + n*(r+1)//s)`` of the batch's ``n`` (already shuffled
with the permutation every rank drew from the same ``mp.random`` state), and weights its
gradients by its share. Only rank 0 draws a progress bar or prints."""

from __future__ import annotations

import logging
from typing import Any

from mpcore.distribution import api as _api
from mpcore.distribution import faults as _faults
from mpcore.distribution.api import world_size

__all__ = ["agree_on_data", "begin_evaluate", "begin_fit", "count_batches", "plan", "rows_of",
           "shard", "steps", "verbosity", "world_size"]

logger = logging.getLogger("mpcore")


def begin_fit(model: Any, verbose: int) -> int:
    """Before the first step of ``fit``: every rank takes rank 0's weights and random state.
    Returns the verbosity of this rank."""
    dist = _api.distribution()
    if dist is None:
        return verbose
    dist.synchronize_random()
    dist.broadcast_variables(model.weights, FIT_WEIGHTS)
    return verbosity(verbose)


def begin_evaluate(model: Any) -> None:
    """Before ``evaluate``: every rank takes rank 0's weights, as ``fit`` does, so replicas
    that differ (a model built before ``set_distribution`` from other seeds) give rank 0's
    score rather than a mean of several models'. ``predict`` is not a collective (rank 0 may
    call it alone): it uses this rank's weights, rank 0's after fit or evaluate."""
    dist = _api.distribution()
    if dist is not None:
        dist.broadcast_variables(model.weights, EVALUATE_WEIGHTS)


def verbosity(verbose: int) -> int:
    """``verbose`` on rank 0, 0 (silent) on the others."""
    return verbose if _api.rank() == 0 else 0


def steps(n: int, batch_size: int, what: str) -> int:
    """The number of global batches of ``n`` samples: a last batch with fewer samples than
    there are ranks (some rank would get none) is left out, with a warning."""
    return count_batches(n, batch_size, _api.world_size(), _api.rank(), what)


def plan(what: str, samples: int, batch_size: int, validation_samples: int = 0,
         epochs: int = 1) -> int:
    """The number of global batches of ``fit`` or ``evaluate``, once every rank agrees on the
    data (:func:`agree_on_data`); ``fit``'s validation data is checked here too, before the
    first epoch rather than after it."""
    agree_on_data(what, samples, batch_size, validation_samples, epochs)
    if validation_samples:
        # rank 1: no warning here, evaluate warns of a left-out last batch each epoch
        count_batches(validation_samples, batch_size, _api.world_size(), 1,
                      f"{what}'s validation data (validation_data or validation_split)")
    return steps(samples, batch_size, what)


def count_batches(n: int, batch_size: int, size: int, rank: int, what: str) -> int:
    """:func:`steps` for ``size`` ranks (``rank`` logs the warning when it is 0).

    A ``batch_size`` below ``size`` raises even when it divides ``n``: every step would leave
    some rank without a sample (its loss a mean of nothing: NaN)."""
    full, rest = divmod(n, batch_size)
    if size > 1 and (batch_size < size or n < size):
        raise ValueError(f"{what} under a distribution of {size} ranks needs batch_size and "
                         f"the number of samples >= {size} (one sample per rank at least); "
                         f"got batch_size={batch_size}, {n} samples")
    if size == 1 or rest == 0 or rest >= size:
        return full + (rest > 0)
    if rank == 0:
        logger.warning("%s: the last batch of %d sample(s) is smaller than the number of "
                       "ranks (%d) and is left out", what, rest, size)
    return full


DATA = ("samples", "batch_size", "steps", "validation_samples", "epochs")


def agree_on_data(what: str, samples: int, batch_size: int, validation_samples: int = 0,
                  epochs: int = 1) -> None:
    """Before ``fit`` or ``evaluate`` starts: every rank has as many samples (and validation
    samples), the same batch size and epochs, or every rank raises a DistributionError naming
    each rank's values (one small all-gather). Without this check, ranks with different step
    counts would pair mismatched collectives (one rank's gradient header with the other's
    metric all-reduce) or, with the same step count, silently train on unequal shards."""
    dist = _api.distribution()
    if dist is None:
        return
    mine = [float(samples), float(batch_size), float(-(-samples // batch_size)),
            float(validation_samples), float(epochs)]
    _faults.agree(dist.engine, data_point(what), DATA, mine)


def data_point(what: str) -> str:
    """The control point of :func:`plan` for ``what`` (fit or evaluate)."""
    return (f"the data of {what} (every rank passes the same number of samples and the same "
            "batch_size: it is global)")


FIT_WEIGHTS = "the model's variables at the start of fit"
EVALUATE_WEIGHTS = "the model's variables at the start of evaluate"
# every rank can name where another rank is (one in evaluate, the other in fit)
_faults.known(data_point("fit"), data_point("evaluate"), _faults.tensors_point(FIT_WEIGHTS),
              _faults.tensors_point(EVALUATE_WEIGHTS))


def shard(lo: int, hi: int, train: bool) -> tuple[int, int]:
    """This rank's rows of the global batch ``[lo, hi)``; ``train``: its gradients are then
    weighted by its share of the batch."""
    dist = _api.distribution()
    if dist is None:
        return lo, hi
    start, stop = rows_of(lo, hi, dist.rank, dist.world_size)
    if train:
        dist.batch_fraction = (stop - start) / (hi - lo)
    return start, stop


def rows_of(lo: int, hi: int, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share of the rows ``[lo, hi)`` split over ``size`` ranks
    (the shares differ by at most one row, and together cover every row once)."""
    n = hi - lo
    return lo + n * rank // size, lo + n * (rank + 1) // size
