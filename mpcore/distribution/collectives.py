"""Collectives engines: the plugin point that moves buffers between the ranks of a job.

An engine is a subclass of :class:`Collectives` that a plugin returns from the hook
``mpcore_collectives`` (its package declares an entry point of the group ``mpcore``, as a
backend does). The built-ins are ``mpi`` (mpi4py: host buffers, any backend through its host
copies) and ``nccl`` (CuPy's NCCL: CUDA arrays on the device). Without a name, the available
engine of highest ``priority`` that can reduce the backend's arrays is chosen: NCCL for CUDA
arrays where it is installed, MPI otherwise.

Engines take and return :class:`~mpcore.Tensor` s (arrays) or lists of Python floats (small
control values: flags, metric totals, checks), so the core needs no array library. Every call
is collective: each rank makes the same calls in the same order, and every wait has the
deadline of :mod:`mpcore.distribution.faults`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from mpcore.distribution.faults import DistributionError
from mpcore.plugins.extras import install_command

if TYPE_CHECKING:
    from mpcore.core.backend import Backend
    from mpcore.core.tensor import Tensor

REDUCTIONS = ("sum", "min", "max")
MPI_HINT = (f"{install_command('mpi')} for the site's MPI, or {install_command('mpi-mpich')} "
            "for MPICH from PyPI")


def check_reduction(op: str) -> str:
    if op not in REDUCTIONS:
        raise ValueError(f"unknown reduction {op!r}; valid: {', '.join(REDUCTIONS)}")
    return op


class Collectives:
    """Base class of an engine. Construct with ``(communicator, timeout)``: an engine-specific
    communicator (None: every rank of the job) and the deadline in seconds of each wait."""

    name: ClassVar[str] = ""
    #: Among the engines that can reduce a backend's arrays, the highest priority is chosen.
    priority: ClassVar[int] = 0

    rank: int
    size: int

    @classmethod
    def unavailable_reason(cls, backend: Backend) -> str | None:
        """Why this engine cannot reduce ``backend``'s arrays here (None: it can). Cheap: no
        communication, no device opened."""
        raise NotImplementedError

    def __init__(self, communicator: Any = None, timeout: float = 300.0) -> None:
        raise NotImplementedError

    # --- arrays -------------------------------------------------------------------------
    def allreduce(self, x: Tensor, op: str = "sum", scale: float | None = None) -> Tensor:
        """``op`` of ``x`` (times ``scale`` first, where given) over the ranks. The caller
        gives ``x`` up: its memory may be reused for the result (and scaled in place)."""
        raise NotImplementedError

    def broadcast(self, x: Tensor, root: int = 0) -> Tensor:
        """Rank ``root``'s ``x`` on every rank (same shape and dtype everywhere)."""
        raise NotImplementedError

    def allreduce_buckets(self, buckets: Sequence[Sequence[Tensor]], scale: float,
                          key: Hashable) -> list[list[Tensor]]:
        """The sums over the ranks of the tensors of each bucket (a bucket holds one dtype),
        each rank's times ``scale`` first. ``key`` names the set of buckets (the same at
        every step): an engine may keep buffers for it and return views of them, so the sums
        are valid until the next call with the same ``key`` (the optimizer reads them at
        once). This default makes one flat all-reduce per bucket: a lone tensor weighted
        into a copy, several packed into one (weighted in place, the copy being ours)."""
        from mpcore import ops

        sums = []
        for bucket in buckets:
            if len(bucket) == 1:
                sums.append([self.allreduce(ops.multiply(bucket[0], scale), "sum")])
                continue
            total = self.allreduce(ops.concat([ops.reshape(t, (-1,)) for t in bucket]),
                                   "sum", scale=scale)
            out, offset = [], 0
            for t in bucket:
                out.append(ops.reshape(total[offset:offset + t.size], t.shape))
                offset += t.size
            sums.append(out)
        return sums

    # --- small control values (Python floats) --------------------------------------------
    def allreduce_values(self, values: Sequence[float], op: str = "sum") -> list[float]:
        raise NotImplementedError

    def allgather_values(self, values: Sequence[float],
                         what: str | None = None) -> list[list[float]]:
        """Every rank's ``values`` (same length everywhere), indexed by rank; ``what`` names
        the exchange in a deadline's message."""
        raise NotImplementedError

    def broadcast_values(self, values: Sequence[float], root: int = 0) -> list[float]:
        raise NotImplementedError

    def barrier(self, what: str) -> None:
        """Wait until every rank is here (``what`` names the wait in a timeout message)."""
        raise NotImplementedError

    def abort(self, message: str) -> None:
        """Print ``message`` and end every rank of the job (does not return)."""
        raise NotImplementedError


def engines() -> dict[str, type[Collectives]]:
    """Every engine the plugins provide, by name."""
    from mpcore.plugins.manager import get_plugins

    found: dict[str, type[Collectives]] = {}
    for batch in get_plugins().manager.hook.mpcore_collectives():
        for cls in batch or []:
            if not (isinstance(cls, type) and issubclass(cls, Collectives) and cls.name):
                raise TypeError(f"mpcore_collectives returned {cls!r}, not a named "
                                "mpcore.distribution.Collectives subclass")
            found.setdefault(cls.name, cls)
    return found


def choose(name: str | None, backend: Backend) -> type[Collectives]:
    """The engine called ``name``, or (None) the best available one for ``backend``; an
    error that names the engines and why each cannot be used."""
    found = engines()
    if name is not None and name not in found:
        raise ValueError(f"unknown collectives engine {name!r}; valid: "
                         f"{', '.join(sorted(found)) or 'none installed'}")
    candidates = [found[name]] if name is not None else sorted(
        found.values(), key=lambda c: -c.priority)
    reasons = []
    for cls in candidates:
        reason = cls.unavailable_reason(backend)
        if reason is None:
            return cls
        reasons.append(f"{cls.name}: {reason}")
    # the install hint only when no engine is installed: a reason that needs MPI says so
    # itself, and one that does not (NCCL on the CPU backend) would be misled by it
    found_none = "" if reasons else f"none is installed ({MPI_HINT})"
    raise DistributionError(f"no collectives engine can reduce arrays of the {backend.name!r} "
                            f"backend here: {'; '.join(reasons) or found_none}")
