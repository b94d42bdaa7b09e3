"""Recycled buffers for the large outputs of the CPU backend's hot kernels.

A training step allocates the same large arrays every step (activations, their gradients,
GEMM outputs: 4 MB each for a 1024 x 1024 layer) and frees them at its end. Left to glibc, the
heap grows by fresh blocks in many steps whenever the order of frees and allocations varies
(gradients held until the cyclic GC ran did that to the custom loop; ``Model.fit`` still did it
afterwards: about 1500 page faults per step of the guide's MLP), and the kernel faults in and
zeroes every fresh page, a large share of a step in system time. Kernels that take
their outputs from a :class:`BufferPool` reuse the previous step's memory from the second
step on (0 faults per step on both paths).

A buffer is handed out as a view of a flat byte array that the pool keeps; every array derived
from it (views, reshapes, ``t.numpy()``) holds a reference to that base array, so the buffer is
idle again exactly when the base's reference count is back to the pool's own: when NumPy would
have freed the memory. Nothing is returned to the pool explicitly.

Buffers start on a 64-byte boundary (:func:`aligned_empty`). glibc places large blocks at 16
bytes past a page, so a plain ``np.empty`` row of a 1024-wide float32 matrix starts 16 bytes
into a cache line and every AVX-512 load of it spans two lines; aligned operands and outputs
make both the GEMMs and the elementwise passes of a step faster (benchmarks/ measures it).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from mpcore.plugins.settings import SettingError

#: Arrays smaller than this come from ``np.empty`` (glibc reuses small blocks well).
MIN_BYTES = 1 << 20
#: At most this many buffers of one size; beyond, a request is a plain ``np.empty``.
MAX_PER_SIZE = 32
#: Start address multiple of the pool's buffers: a cache line (and an AVX-512 vector).
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on an :data:`ALIGNMENT` boundary. Its ``base`` is
    the byte array that owns the memory (NumPy points every view at the owner)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _refcounts(bucket: list[np.ndarray]) -> list[int]:
    # every array made from a buffer holds its owner, not the buffer itself
    return [sys.getrefcount(buf.base) for buf in bucket]


#: What :func:`_refcounts` reports for a buffer only its bucket holds: measured through the
#: same function, so it holds whatever the interpreter's conventions for ``sys.getrefcount``.
_IDLE = _refcounts([aligned_empty((1,), np.uint8)])[0]


def default_limit() -> int:
    """``MPCORE_CPU_POOL_MB`` (default 1024) in bytes: the most memory the pool keeps; 0
    turns it off (every request is a plain ``np.empty``)."""
    raw = os.environ.get("MPCORE_CPU_POOL_MB", "")
    text = raw.strip() or "1024"
    try:
        mb = int(text)
    except ValueError:
        mb = -1
    if mb < 0:
        raise SettingError(f"MPCORE_CPU_POOL_MB={raw!r} is not valid; valid values: a whole "
                           "number of MB >= 0 (default 1024; 0 turns the pool off)")
    return mb << 20


class BufferPool:
    """``empty(shape, dtype)`` from recycled buffers of the same size in bytes.

    ``limit`` bounds the bytes the pool keeps (busy and idle): past it, requests are plain
    ``np.empty``. :meth:`clear` drops the pool's references (busy buffers stay valid: their
    arrays keep them)."""

    def __init__(self, limit: int | None = None, min_bytes: int = MIN_BYTES) -> None:
        # None: read from the environment at first use, so that a bad MPCORE_CPU_POOL_MB
        # fails the CPU backend's first use with its message instead of the plugin's import
        # (which would only drop the backend from the list, the reason shown in no error)
        self._limit = limit
        self.min_bytes = min_bytes
        self._buffers: dict[int, list[np.ndarray]] = {}
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def limit(self) -> int:
        if self._limit is None:
            self._limit = default_limit()
        return self._limit

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes or self.limit <= 0:
            return np.empty(shape, dtype)
        bucket = self._buffers.get(nbytes)
        if bucket is None:
            bucket = self._buffers[nbytes] = []
        for buf, refs in zip(bucket, _refcounts(bucket)):
            if refs <= _IDLE:
                self.hits += 1
                return buf.view(dtype).reshape(shape)
        self.misses += 1
        if len(bucket) >= MAX_PER_SIZE or self.nbytes + nbytes > self.limit:
            self._drop_idle()
            if len(bucket) >= MAX_PER_SIZE or self.nbytes + nbytes > self.limit:
                return np.empty(shape, dtype)
        # uint8 of the exact size: any dtype's view of it is aligned
        buf = aligned_empty((nbytes,), np.uint8)
        bucket.append(buf)
        self.nbytes += nbytes
        return buf.view(dtype).reshape(shape)

    def _drop_idle(self) -> None:
        """Forget every idle buffer (sizes a run no longer uses would otherwise stay)."""
        for size, bucket in list(self._buffers.items()):
            keep = [buf for buf, refs in zip(bucket, _refcounts(bucket)) if refs > _IDLE]
            self.nbytes -= size * (len(bucket) - len(keep))
            if keep:
                self._buffers[size] = keep
            else:
                del self._buffers[size]

    def clear(self) -> None:
        self._buffers.clear()
        self.nbytes = 0

    def info(self) -> dict[str, int]:
        idle = sum(size * sum(refs <= _IDLE for refs in _refcounts(bucket))
                   for size, bucket in self._buffers.items())
        return {"bytes": self.nbytes, "idle_bytes": idle, "buffers":
                sum(len(b) for b in self._buffers.values()), "hits": self.hits,
                "misses": self.misses, "limit": self.limit}


#: Recycled buffers for the large outputs of the CPU backend's kernels (one per process: it is
#: process memory that it recycles).
POOL = BufferPool()
