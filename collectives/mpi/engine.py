"""The MPI engine: mpi4py's non-blocking collectives on host buffers, each waited for with a
deadline (``Test`` polling; past the deadline the job is aborted with a message naming the
rank and the collective). CPU arrays are reduced in place; another backend's arrays go through
a host copy (``to_host``) and back (its ``asarray`` kernel). Gradient buckets of CPU arrays,
when every rank is on one node, are summed in MPI-3 shared memory (:mod:`mpcore_mpi.shared`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Hashable, Sequence
from importlib.util import find_spec
from typing import Any

import numpy as np
from mpcore_mpi.shared import SharedBuckets

from mpcore.core.backend import Backend
from mpcore.core.tensor import Tensor
from mpcore.distribution.collectives import MPI_HINT, Collectives, check_reduction
from mpcore.distribution.faults import DistributionError, timeout_message

# dtypes MPI reduces natively (16-bit gradients are averaged in float32: gradients.wire_dtype)
REDUCIBLE = ("float32", "float64", "int32", "int64", "uint8")
# spin this long before yielding the core between polls: a fast collective pays no sleep
_SPIN_S = 2e-3


_HOOKED = False


def abort_on_uncaught_exception(world: Any) -> None:
    """A rank launched as ``python script.py`` (not ``python -m mpi4py script.py``) that
    raises would only exit: the other ranks would wait for the collective deadline (300 s by
    default). Do what ``-m mpi4py`` does: after the traceback, abort the whole job. Installed
    once per process, chained to the ``sys.excepthook`` in place; not under ``-m mpi4py``,
    which aborts already."""
    global _HOOKED
    if _HOOKED or "mpi4py.run" in sys.modules:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        _let_the_launcher_forward_stderr()
        world.Abort(1)

    sys.excepthook = hook
    _HOOKED = True


#: How long a rank waits, after writing why it aborts, before MPI_Abort: mpiexec forwards each
#: rank's stderr through its proxies, and an abort that comes first can lose the message (seen
#: with MPICH when stderr is a pipe, as under pytest or a scheduler).
_FORWARD_S = 0.5


def _let_the_launcher_forward_stderr() -> None:
    sys.stderr.flush()
    time.sleep(_FORWARD_S)


class MpiCollectives(Collectives):
    name = "mpi"
    priority = 0

    @classmethod
    def unavailable_reason(cls, backend: Backend) -> str | None:
        if find_spec("mpi4py") is None:
            return f"mpi4py is not installed: {MPI_HINT}"
        return None

    def __init__(self, communicator: Any = None, timeout: float = 300.0) -> None:
        from mpi4py import MPI  # initialises MPI: only when a distribution is made

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if communicator is None else communicator
        if not isinstance(self.comm, MPI.Comm):
            raise TypeError(f"the mpi engine's communicator is an mpi4py Comm, got "
                            f"{type(communicator).__name__}")
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        if self.size > 1:
            abort_on_uncaught_exception(MPI.COMM_WORLD)
        self._ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        #: Gradient buckets in MPI-3 shared memory when every rank is on this node.
        self.shared = SharedBuckets(self)

    def wait(self, request: Any, what: str) -> None:
        """Poll ``request`` until done, or abort the job at the deadline."""
        if request.Test():
            return
        start = time.monotonic()
        deadline = start + self.timeout
        while not request.Test():
            now = time.monotonic()
            if now > deadline:
                self.abort(timeout_message(self.rank, self.size, what, self.timeout))
            if now - start > _SPIN_S:
                time.sleep(1e-4)
            else:  # a spinning rank lends its core to whatever else is runnable on it
                os.sched_yield()

    def abort(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        _let_the_launcher_forward_stderr()
        self.comm.Abort(1)

    # --- arrays -------------------------------------------------------------------------
    def _host(self, x: Tensor, what: str) -> tuple[np.ndarray, bool]:
        """A writable contiguous host buffer of ``x`` and whether it is ``x``'s own memory."""
        data = x.data
        if isinstance(data, np.ndarray) and data.flags.writeable and data.flags.c_contiguous:
            return data, True
        return np.ascontiguousarray(np.array(x.backend.to_host(data))), False

    def _back(self, x: Tensor, buf: np.ndarray, own: bool) -> Tensor:
        if own:
            return x
        be = x.backend
        return Tensor(be.kernel("asarray")(buf, x.dtype), be, x.dtype)

    def allreduce(self, x: Tensor, op: str = "sum", scale: float | None = None) -> Tensor:
        mpi_op = self._ops[check_reduction(op)]
        if x.dtype not in REDUCIBLE:
            raise DistributionError(f"the mpi engine reduces {', '.join(REDUCIBLE)}; got a "
                                    f"{x.dtype} tensor")
        buf, own = self._host(x, "allreduce")
        if scale is not None:
            np.multiply(buf, buf.dtype.type(scale), out=buf)
        self.wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, mpi_op),
                  f"an all-reduce ({op}) of {buf.size} {x.dtype} values")
        return self._back(x, buf, own)

    def allreduce_buckets(self, buckets: Sequence[Sequence[Tensor]], scale: float,
                          key: Hashable) -> list[list[Tensor]]:
        if all(t.dtype in REDUCIBLE for b in buckets for t in b) and self.shared.usable(buckets):
            return self.shared.allreduce(buckets, scale, key)
        return super().allreduce_buckets(buckets, scale, key)

    def broadcast(self, x: Tensor, root: int = 0) -> Tensor:
        buf, own = self._host(x, "broadcast")
        if own:
            buf = buf.copy()  # x may be a variable's value: never write into it
        raw = buf.reshape(-1).view(np.uint8)
        self.wait(self.comm.Ibcast([raw, self.MPI.BYTE], root=root),
                  f"a broadcast of {buf.size} {x.dtype} values from rank {root}")
        be = x.backend
        return Tensor(be.kernel("asarray")(buf, x.dtype), be, x.dtype)

    # --- control values -----------------------------------------------------------------
    def allreduce_values(self, values: Sequence[float], op: str = "sum") -> list[float]:
        buf = np.asarray(values, dtype=np.float64).copy()
        self.wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, self._ops[check_reduction(op)]),
                  f"an all-reduce ({op}) of {buf.size} control value(s)")
        return buf.tolist()

    def allgather_values(self, values: Sequence[float],
                         what: str | None = None) -> list[list[float]]:
        mine = np.asarray(values, dtype=np.float64)
        out = np.empty((self.size, mine.size), dtype=np.float64)
        self.wait(self.comm.Iallgather(mine, out),
                  f"an all-gather of {mine.size} control value(s)"
                  + (f" ({what})" if what else ""))
        return out.tolist()

    def broadcast_values(self, values: Sequence[float], root: int = 0) -> list[float]:
        buf = np.asarray(values, dtype=np.float64).copy()
        self.wait(self.comm.Ibcast(buf, root=root),
                  f"a broadcast of {buf.size} control value(s) from rank {root}")
        return buf.tolist()

    def barrier(self, what: str) -> None:
        self.wait(self.comm.Ibarrier(), f"a barrier ({what})")
