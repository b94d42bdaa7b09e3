"""Faults of a distributed job: the collective deadline, and the error raised when ranks
disagree.

Every wait on another rank has a deadline, ``MPCORE_COLLECTIVE_TIMEOUT`` seconds (default
:data:`DEFAULT_TIMEOUT_S`): an engine that passes it prints which rank gave up on what and aborts
the whole job, so a rank that died or hung never leaves the others waiting forever. Ranks that
disagree (on the variables, the loss scale, the step) get a :class:`DistributionError` naming
each rank's value at the first collective, before any buffer is exchanged.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence
from typing import Any

TIMEOUT_ENV = "MPCORE_COLLECTIVE_TIMEOUT"
#: Long enough for a slow rank to load its data or build its kernels before the first
#: collective, short enough that a dead job does not hold a machine for long.
DEFAULT_TIMEOUT_S = 300.0


class DistributionError(RuntimeError):
    """Ranks disagree, or an engine cannot do what was asked."""


def collective_timeout() -> float:
    """Seconds a collective may wait for the other ranks (``MPCORE_COLLECTIVE_TIMEOUT``)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        # inf is refused too: every wait has a deadline
        raise ValueError(f"{TIMEOUT_ENV} must be a finite number of seconds > 0, got "
                         f"{text!r} (unset: {DEFAULT_TIMEOUT_S:g})")
    return value


def timeout_message(rank: int, size: int, what: str, timeout: float) -> str:
    return (f"mpcore.distribution: rank {rank} of {size}: {what} did not finish within "
            f"{timeout:g} s ({TIMEOUT_ENV}): another rank failed, stopped or is stuck; "
            "aborting the job")


def disagreement(what: str, per_rank: Sequence[Sequence[float]],
                 names: Sequence[str]) -> DistributionError | None:
    """An error naming each rank's values when the ranks' ``per_rank`` rows differ, else
    None."""
    first = list(per_rank[0])
    if all(list(row) == first for row in per_rank):
        return None
    lines = [f"rank {r}: " + ", ".join(f"{n}={_show(v)}" for n, v in zip(names, row))
             for r, row in enumerate(per_rank)]
    return DistributionError(f"the ranks disagree on {what}:\n  " + "\n  ".join(lines))


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def signature(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> float:
    """52 bits of a hash of ``shapes`` and ``dtypes`` (exact in a float64)."""
    text = repr([(tuple(s), d) for s, d in zip(shapes, dtypes)]).encode()
    return float(struct.unpack(">Q", hashlib.sha256(text).digest()[:8])[0] >> 12)


def check_same_tensors(engine: Any, what: str, tensors: Sequence[Any]) -> None:
    """Every rank holds as many ``tensors``, of the same shapes and dtypes, or every rank
    raises a :class:`DistributionError` naming each rank's (one small all-gather)."""
    values = sum(math.prod(t.shape) for t in tensors)
    mine = [len(tensors), values, signature([t.shape for t in tensors],
                                            [t.dtype for t in tensors])]
    error = disagreement(f"{what} (their number, values, and a signature of their shapes "
                         "and dtypes)", engine.allgather_values(mine),
                         ("variables", "values", "signature"))
    if error is not None:
        raise error
