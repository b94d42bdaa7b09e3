"""The NCCL engine: CuPy's ``cupy.cuda.nccl`` all-reduces and broadcasts CUDA arrays on the
device, on the current stream; small control values, the barrier and the bootstrap (rank 0's
unique id) go over MPI. Each collective is waited for with the MPI engine's deadline (an event
polled); past it the NCCL communicator is aborted, then the job."""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

from mpcore_mpi.engine import MpiCollectives
from mpcore_nccl.bootstrap import nccl_dtype, nccl_op, share_unique_id

from mpcore.core.backend import Backend
from mpcore.core.tensor import Tensor
from mpcore.distribution.collectives import Collectives, check_reduction
from mpcore.distribution.faults import timeout_message
from mpcore.plugins.extras import install_command


class NcclCollectives(Collectives):
    name = "nccl"
    priority = 10

    @classmethod
    def unavailable_reason(cls, backend: Backend) -> str | None:
        if backend.name != "cuda":
            return f"NCCL reduces CUDA arrays; the backend is {backend.name!r}"
        mpi = MpiCollectives.unavailable_reason(backend)
        if mpi is not None:
            return f"its bootstrap needs MPI: {mpi}"
        if find_spec("cupy") is None:
            return f"CuPy is not installed: {install_command('cuda')}"
        try:
            from cupy.cuda import nccl
        except Exception as exc:  # a CuPy that cannot load at all
            return f"CuPy does not load: {type(exc).__name__}: {exc}"
        if not getattr(nccl, "available", False):  # CuPy without the NCCL library
            return ("CuPy finds no NCCL library: pip install nvidia-nccl-cu12 (or -cu13; "
                    "cupy-cuda12x[ctk] does not install it)")
        return None

    def __init__(self, communicator: Any = None, timeout: float = 300.0) -> None:
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        self.mpi = MpiCollectives(communicator, timeout)
        self.rank, self.size, self.timeout = self.mpi.rank, self.mpi.size, timeout
        uid = share_unique_id(self.rank, nccl.get_unique_id, self.mpi.broadcast_values)
        try:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        except TypeError:  # CuPy 14 takes the id as bytes (the argument check runs before NCCL)
            self.comm = nccl.NcclCommunicator(self.size, bytes(b & 0xFF for b in uid), self.rank)

    def _wait(self, what: str) -> None:
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record()
        deadline = time.monotonic() + self.timeout
        while not event.done:
            if time.monotonic() > deadline:
                self.comm.abort()
                self.abort(timeout_message(self.rank, self.size, what, self.timeout))
            time.sleep(1e-5)

    def allreduce(self, x: Tensor, op: str = "sum", scale: float | None = None) -> Tensor:
        data = self.cupy.ascontiguousarray(x.data)
        if scale is not None:
            self.cupy.multiply(data, data.dtype.type(scale), out=data)
        stream = self.cupy.cuda.get_current_stream().ptr
        self.comm.allReduce(data.data.ptr, data.data.ptr, data.size, nccl_dtype(x.dtype),
                            nccl_op(check_reduction(op)), stream)
        self._wait(f"an NCCL all-reduce ({op}) of {data.size} {x.dtype} values")
        return Tensor(data, x.backend, x.dtype)

    def broadcast(self, x: Tensor, root: int = 0) -> Tensor:
        data = self.cupy.array(x.data, copy=True, order="C")  # never write into a variable
        stream = self.cupy.cuda.get_current_stream().ptr
        self.comm.bcast(data.data.ptr, data.size, nccl_dtype(x.dtype), root, stream)
        self._wait(f"an NCCL broadcast of {data.size} {x.dtype} values from rank {root}")
        return Tensor(data, x.backend, x.dtype)

    def allreduce_values(self, values: Sequence[float], op: str = "sum") -> list[float]:
        return self.mpi.allreduce_values(values, op)

    def allgather_values(self, values: Sequence[float],
                         what: str | None = None) -> list[list[float]]:
        return self.mpi.allgather_values(values, what)

    def broadcast_values(self, values: Sequence[float], root: int = 0) -> list[float]:
        return self.mpi.broadcast_values(values, root)

    def barrier(self, what: str) -> None:
        self.mpi.barrier(what)

    def abort(self, message: str) -> None:
        self.mpi.abort(message)
