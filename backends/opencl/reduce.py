"""Reduction kernels (``kernels/reduce.cl``): sum, mean, max, min over any axes, and argmax.

The reduced axes are brought together as the K of an (outer, K, inner) view, transposing only
where they are not adjacent. A long K over few output columns is split into chunks reduced in
passes, so that the device has enough work-items; 16-bit inputs accumulate in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .arrays import FLOATS, LOW, SCALAR, CLArray
from .views import ViewKernels


class ReduceKernels(ViewKernels):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the reductions."""

    def _as_outer_k_inner(self, x: CLArray,
                          axis: Any) -> tuple[CLArray, int, int, int, tuple[int, ...]]:
        """``x`` (transposed if needed) as (outer, K, inner) with the reduced axes in K; and
        the kept shape."""
        shape = tuple(x.shape)
        nd = len(shape)
        axes = tuple(range(nd)) if axis is None else tuple(sorted(a % max(nd, 1) for a in axis))
        kept = tuple(d for i, d in enumerate(shape) if i not in axes)
        real = [a for a in axes if shape[a] != 1]
        if real and real != list(range(real[0], real[-1] + 1)) and any(
                shape[i] != 1 for i in range(real[0], real[-1] + 1) if i not in axes):
            # reduced axes are not adjacent: move them last
            perm = tuple(i for i in range(nd) if i not in axes) + axes
            x = self._contiguous_view(x, perm)
            return x, math.prod(kept), math.prod(shape[a] for a in axes), 1, kept
        if not real:
            return x, math.prod(kept), 1, 1, kept
        first, last = real[0], real[-1]
        outer = math.prod(shape[:first])
        inner = math.prod(shape[last + 1:])
        return x, outer, math.prod(shape[a] for a in axes), inner, kept

    def _reduce(self, kind: str, x: CLArray, axis: Any, keepdims: bool,
                mean: bool = False) -> CLArray:
        dt = self._dt(x)
        shape = tuple(x.shape)
        nd = len(shape)
        axes = tuple(range(nd)) if axis is None else tuple(a % max(nd, 1) for a in axis)
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        xv, outer, k, inner, _ = self._as_outer_k_inner(x, axis)
        if k == 0:
            if kind != "sum":
                raise ValueError(f"zero-size array to reduction operation {kind} which has no "
                                 "identity")
            return self.full(out_shape, math.nan if mean else 0, dt)
        acc = "float32" if dt in LOW else dt
        rt = self.runtime
        cur, cur_dt = xv, dt
        while True:
            cols = outer * inner
            if cols >= 1024 or k <= 64:
                chunk = k
            else:
                chunk = max(64, -(-k * cols // 4096))
            nchunks = -(-k // chunk)
            final = nchunks == 1
            od = dt if final else acc
            out = self._empty(out_shape if final else (outer, nchunks, inner), od)
            prog = self._prog("reduce.cl", ("A", cur_dt), ("O", od))
            scale = 1.0 / (math.prod(shape[a] for a in axes) or 1) if (mean and final) else 1.0
            rt.launch(prog[f"reduce_{kind}"], outer * nchunks * inner, np.int32(outer),
                      np.int32(k), np.int32(inner), np.int32(chunk), np.int32(nchunks),
                      SCALAR[cur_dt](scale if cur_dt in FLOATS else 1),
                      np.int32(bool(mean and final)), cur.data, out.data)
            if final:
                return out
            cur, cur_dt, k = out, od, nchunks

    def sum(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("sum", x, axis, keepdims)

    def mean(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("sum", x, axis, keepdims, mean=True)

    def max(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("max", x, axis, keepdims)

    def min(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("min", x, axis, keepdims)

    def argmax(self, x: CLArray, axis: int) -> CLArray:
        shape = tuple(x.shape)
        if not shape:
            return self.full((), 0, "int64")
        axis %= len(shape)
        if shape[axis] == 0:
            raise ValueError("attempt to get argmax of an empty sequence")
        outer, k, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        out = self._empty(shape[:axis] + shape[axis + 1:], "int64")
        prog = self._prog("reduce.cl", ("A", self._dt(x)), ("O", self._dt(x)))
        self.runtime.launch(prog["reduce_argmax"], outer * inner, np.int32(outer), np.int32(k),
                            np.int32(inner), x.data, out.data)
        return out
