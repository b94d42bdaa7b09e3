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


#: Every control all-gather exchanges this many float64s: the control point's tag, then its
#: values, padded. Ranks that reach different control points (one in evaluate, the other in
#: fit) then still exchange buffers of one size, and the tags say so, instead of MPI pairing
#: mismatched collectives and each rank reading the other's numbers as its own.
CONTROL_WIDTH = 8
#: tag -> the control point's name, for the ones this process has reached (every rank runs
#: the same program, so another rank's tag is usually known here too)
_POINTS: dict[float, str] = {}


def known(*points: str) -> None:
    """Name control points before any rank reaches them, so a rank can say where another is."""
    for point in points:
        _POINTS[digest(point)] = point


def tensors_point(what: str) -> str:
    """The control point of :func:`check_same_tensors` for ``what``."""
    return f"{what} (their number, values, and a signature of their shapes and dtypes)"


def agree(engine: Any, what: str, names: Sequence[str], values: Sequence[float]) -> None:
    """All-gather ``values`` at the control point ``what`` (a barrier when there are none):
    a DistributionError on every rank when the ranks are at different control points, or
    when their values differ (naming each rank's)."""
    if len(values) >= CONTROL_WIDTH:
        raise ValueError(f"a control point takes at most {CONTROL_WIDTH - 1} values")
    tag = digest(what)
    _POINTS[tag] = what
    row = [tag, *map(float, values)] + [0.0] * (CONTROL_WIDTH - 1 - len(values))
    per_rank = engine.allgather_values(row, what)
    if any(r[0] != tag for r in per_rank):
        at = [f"rank {r}: {_POINTS.get(got[0], 'another collective')}"
              for r, got in enumerate(per_rank)]
        raise DistributionError("the ranks are at different collectives (every rank must "
                                "make the same calls: fit, evaluate, save_weights ...):\n  "
                                + "\n  ".join(at))
    error = disagreement(what, [r[1:1 + len(values)] for r in per_rank], names)
    if error is not None:
        raise error


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
    return digest(repr([(tuple(s), d) for s, d in zip(shapes, dtypes)]))


def digest(text: str) -> float:
    """52 bits of a hash of ``text`` (exact in a float64)."""
    return float(struct.unpack(">Q", hashlib.sha256(text.encode()).digest()[:8])[0] >> 12)


def check_same_tensors(engine: Any, what: str, tensors: Sequence[Any]) -> None:
    """Every rank holds as many ``tensors``, of the same shapes and dtypes, or every rank
    raises a :class:`DistributionError` naming each rank's (one small all-gather)."""
    values = sum(math.prod(t.shape) for t in tensors)
    mine = [len(tensors), values, signature([t.shape for t in tensors],
                                            [t.dtype for t in tensors])]
    agree(engine, tensors_point(what), ("variables", "values", "signature"), mine)
