"""How ``fit`` and ``evaluate`` split a global batch: rank ``r`` of ``s`` takes the
contiguous rows ``[lo + n*r//s, lo + n*(r+1)//s)`` of the batch's ``n`` (already shuffled
with the permutation every rank drew from the same ``mp.random`` state), and weights its
gradients by its share. Only rank 0 draws a progress bar or prints."""

from __future__ import annotations

import logging
from typing import Any

from mpcore.distribution import api as _api
from mpcore.distribution.api import world_size

__all__ = ["begin_fit", "count_batches", "rows_of", "shard", "steps", "verbosity",
           "world_size"]

logger = logging.getLogger("mpcore")


def begin_fit(model: Any, verbose: int) -> int:
    """Before the first step of ``fit``: every rank takes rank 0's weights and random state.
    Returns the verbosity of this rank."""
    dist = _api.distribution()
    if dist is None:
        return verbose
    dist.synchronize_random()
    dist.broadcast_variables(model.weights)
    return verbosity(verbose)


def verbosity(verbose: int) -> int:
    """``verbose`` on rank 0, 0 (silent) on the others."""
    return verbose if _api.rank() == 0 else 0


def steps(n: int, batch_size: int, what: str) -> int:
    """The number of global batches of ``n`` samples: a last batch with fewer samples than
    there are ranks (some rank would get none) is left out, with a warning."""
    return count_batches(n, batch_size, _api.world_size(), _api.rank(), what)


def count_batches(n: int, batch_size: int, size: int, rank: int, what: str) -> int:
    """:func:`steps` for ``size`` ranks (``rank`` logs the warning when it is 0)."""
    full, rest = divmod(n, batch_size)
    if size == 1 or rest == 0 or rest >= size:
        return full + (rest > 0)
    if batch_size < size or full == 0:
        raise ValueError(f"{what} under a distribution of {size} ranks needs batch_size and "
                         f"the number of samples >= {size} (one sample per rank at least); "
                         f"got batch_size={batch_size}, {n} samples")
    if rank == 0:
        logger.warning("%s: the last batch of %d sample(s) is smaller than the number of "
                       "ranks (%d) and is left out", what, rest, size)
    return full


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
