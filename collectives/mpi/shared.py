"""Gradient buckets in MPI-3 shared memory, for a job whose ranks all live on one node.

MPICH's and Open MPI's all-reduce of a large buffer between ranks of one node pushes it
through small shared-memory cells: each rank copies its buffer in, the other's out, adds, and
copies the sums back (measured here: ~3.3 ms for 7.1 MB between 2 ranks, ~6% of a training
step of the guide's MLP). In a shared window (``MPI_Win_allocate_shared``, standard since
MPI-3) each rank sums one slice of the values: it writes the weighted parts of its gradients
that the other ranks sum into its staging row, adds its own part of its slice to theirs into
the row of sums, and then every rank reads the sums in place (~0.6 ms for the same bytes).

One window per dtype holds every bucket (bucket boundaries only matter to an all-reduce per
buffer), and a step waits at two barriers, each non-blocking with the collective deadline: the
staging rows are written, the slices are summed. The sums of one call stay valid until the
next: a rank writes sums only after the next call's first barrier, which every rank reaches
after it has read them, and a staging row is rewritten only after the last call's second
barrier, once every rank has read it. Each slice is summed once, in rank order, and read by
every rank, so the ranks get the same bits; for 2 ranks they are the bits of MPI's SUM
(``w0 + w1``: float addition commutes). Memory: the window is (ranks + 1) times the gradients,
of which each rank's own slice of its staging row is never touched (no page behind it): the
size of the gradients per rank.

The blocking calls MPI offers for shared memory (``Comm.Split_type``,
``Win.Allocate_shared``) come after a barrier with the deadline, so a rank that died before
them is found there; they run once (per set of buckets and dtype), not at every step.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from mpcore.core.tensor import Tensor

#: "0" turns the shared-memory buckets off (every bucket through MPI's all-reduce).
SHARED_ENV = "MPCORE_MPI_SHARED_MEMORY"


class _Window:
    """One dtype's window on rank 0's memory: row 0 the sums, row 1 + q rank q's staging
    row, ``n`` values each; ``slices[r]`` the values rank r sums."""

    def __init__(self, mpi: Any, node: Any, n: int, dtype: np.dtype) -> None:
        self.n, self.dtype = n, dtype
        size = node.Get_size()
        nbytes = (size + 1) * n * dtype.itemsize if node.Get_rank() == 0 else 0
        self.win = mpi.Win.Allocate_shared(nbytes, dtype.itemsize, comm=node)
        rows = np.frombuffer(self.win.Shared_query(0)[0], dtype=dtype, count=(size + 1) * n)
        self.sums, self.staging = rows[:n], rows[n:].reshape(size, n)
        self.slices = [(r * n // size, (r + 1) * n // size) for r in range(size)]


class SharedBuckets:
    """The shared-memory buckets of one MPI engine (``engine``: its ``comm``, ``wait``,
    ``barrier``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.enabled = os.environ.get(SHARED_ENV, "1").strip() != "0"
        self._node: Any = None
        self._usable: bool | None = None
        self._windows: dict[Hashable, _Window] = {}
        self._kept: list[_Window] = []  # a window replaced under its key stays mapped

    @property
    def on_one_node(self) -> bool | None:
        """Whether every rank of the job is on this node (None: not asked yet)."""
        return self._usable

    def usable(self, buckets: Sequence[Sequence[Tensor]]) -> bool:
        """Whether these buckets take this path: host arrays, on a job whose ranks share one
        node and all leave it on. The first call asks every rank (a rank with
        ``MPCORE_MPI_SHARED_MEMORY=0`` keeps them all on MPI's all-reduce: a rank in a
        barrier here and another in an all-reduce would pair collectives that differ)."""
        if self.engine.size < 2 or not all(isinstance(t.data, np.ndarray) and t.size
                                           for bucket in buckets for t in bucket):
            return False  # another backend's arrays: MPI's all-reduce through host copies
        if self._usable is None:
            eng = self.engine
            # a collective with the deadline before the blocking Split_type
            everyone = eng.allreduce_values([1.0 if self.enabled else 0.0], "min")[0] > 0.5
            node = eng.comm.Split_type(eng.MPI.COMM_TYPE_SHARED, key=eng.rank)
            self._usable = node.Get_size() == eng.size
            if self._usable:
                self._node = node
            else:
                node.Free()
            self.enabled = self.enabled and everyone
        return self.enabled and self._usable

    def allreduce(self, buckets: Sequence[Sequence[Tensor]], scale: float,
                  key: Hashable) -> list[list[Tensor]]:
        eng = self.engine
        # one window per dtype, its values in bucket order: bucket boundaries only matter
        # to an all-reduce per buffer, and one exchange for all of them waits twice
        places: list[list[tuple[np.dtype, int]]] = []
        sizes: dict[np.dtype, int] = {}
        for bucket in buckets:
            row = []
            for t in bucket:
                dtype = t.data.dtype
                row.append((dtype, sizes.get(dtype, 0)))
                sizes[dtype] = sizes.get(dtype, 0) + t.size
            places.append(row)
        windows = {dtype: self._window(key, dtype, n) for dtype, n in sizes.items()}
        # per dtype: (offset, flat values) of each of this rank's tensors
        flat: dict[np.dtype, list[tuple[int, np.ndarray]]] = {d: [] for d in sizes}
        for bucket, row in zip(buckets, places):
            for t, (dtype, offset) in zip(bucket, row):
                flat[dtype].append((offset, t.data.reshape(-1)))
        what = (f"the gradient buckets ({', '.join(f'{n} {d}' for d, n in sizes.items())} "
                "values) in shared memory")
        rank = eng.rank
        for dtype, window in windows.items():
            factor = dtype.type(scale)
            for r, (lo, hi) in enumerate(window.slices):
                if r != rank:
                    _weighted(flat[dtype], lo, hi, factor, window.staging[rank])
        eng.wait(eng.comm.Ibarrier(), f"a barrier ({what}: written)")
        for dtype, window in windows.items():
            _sum_slice(window, rank, flat[dtype], dtype.type(scale))
        eng.wait(eng.comm.Ibarrier(), f"a barrier ({what}: summed)")
        return [[Tensor(windows[dtype].sums[offset:offset + t.size].reshape(t.shape),
                        t.backend, t.dtype) for t, (dtype, offset) in zip(bucket, row)]
                for bucket, row in zip(buckets, places)]

    def _window(self, key: Hashable, dtype: np.dtype, n: int) -> _Window:
        # kept for the job's life, never freed: the sums handed out are views of it (one
        # window per set of trained variables and dtype: the core's key fixes the shapes)
        window = self._windows.get((key, dtype))
        if window is None or window.n != n:
            self.engine.barrier("the allocation of the gradient buckets' shared memory")
            window = _Window(self.engine.MPI, self._node, n, dtype)
            self._windows[(key, dtype)] = window
            self._kept.append(window)
        return window

def _weighted(parts: list[tuple[int, np.ndarray]], lo: int, hi: int, factor: Any,
              out: np.ndarray) -> None:
    """``out[lo:hi]`` = ``factor`` times the values ``lo:hi`` of ``parts`` (offset, flat
    array) laid end to end."""
    for offset, values in parts:
        a, b = max(lo, offset), min(hi, offset + values.size)
        if a < b:
            np.multiply(values[a - offset:b - offset], factor, out=out[a:b])


def _sum_slice(window: _Window, rank: int, mine: list[tuple[int, np.ndarray]],
               factor: Any) -> None:
    """The sums of ``rank``'s slice, in rank order (((w0 + w1) + w2) + ...), this rank's
    weighted values read from its own arrays, the others' from their staging rows."""
    lo, hi = window.slices[rank]
    if lo == hi:
        return
    total, staging = window.sums[lo:hi], window.staging[:, lo:hi]
    _weighted(mine, lo, hi, factor, window.sums)  # w_rank, into the sums
    if rank == 1:
        np.add(staging[0], total, out=total)  # w0 + w1 (float addition commutes)
    elif rank > 1:
        before = staging[0] + staging[1]
        for q in range(2, rank):
            before += staging[q]
        np.add(before, total, out=total)
    for q in range(rank + 1, len(window.slices)):
        np.add(total, staging[q], out=total)
