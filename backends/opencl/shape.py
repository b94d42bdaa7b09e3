"""Shape and indexing kernels: reshape (a new header on the same buffer), transpose,
broadcast_to, concat and basic indexing as strided-view copies (:mod:`mpcore_opencl.views`),
and take (``kernels/index.cl``); with the gradients of take and getitem."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .arrays import CLArray, contiguous_strides
from .views import ViewKernels, basic_index, broadcast_strides

#: Rows at least this long are gathered one work-item per row (``take_rows``); shorter ones
#: one work-item per element (``take``), which keeps more work-items busy.
_ROW_MIN = 32


class ShapeKernels(ViewKernels):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the shape and indexing kernels."""

    def reshape(self, x: CLArray, shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(x.size // known if d == -1 else d for d in shape)
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot reshape an array of size {x.size} into shape {shape}")
        return CLArray(x.runtime, shape, x.dtype, data=x.data, base=x)

    def transpose(self, x: CLArray, perm: tuple[int, ...]) -> CLArray:
        return self._contiguous_view(x, tuple(perm))

    def broadcast_to(self, x: CLArray, shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        return self._gather(x, 0, shape, broadcast_strides(tuple(x.shape), shape))

    def concat(self, xs: list[CLArray], axis: int) -> CLArray:
        ref = tuple(xs[0].shape)
        axis %= len(ref)
        total = sum(int(x.shape[axis]) for x in xs)
        out_shape = (*ref[:axis], total, *ref[axis + 1:])
        out = self._empty(out_shape, self._dt(xs[0]))
        st = contiguous_strides(out_shape)
        start = 0
        for x in xs:
            self._scatter(x, out, start * st[axis], tuple(x.shape), st)
            start += int(x.shape[axis])
        return out

    def take(self, x: CLArray, indices: CLArray, axis: int) -> CLArray:
        indices = self._index_array(indices)
        shape = tuple(x.shape)
        axis %= len(shape)
        size, inner = shape[axis], math.prod(shape[axis + 1:])
        out = self._empty((*shape[:axis], *indices.shape, *shape[axis + 1:]), self._dt(x))
        prog = self._prog("index.cl", ("A", self._dt(x)), ("O", self._dt(x)),
                          ("L", self._dt(indices)))
        rt = self.runtime
        outer = math.prod(shape[:axis])
        if inner >= _ROW_MIN and out.size:
            # rows of a matrix (fit's batch gather): one work-item per row, no divisions
            rt.launch(prog["take_rows"], outer * indices.size, np.int32(outer * indices.size),
                      np.int32(size), np.int32(indices.size), np.int32(inner), x.data,
                      indices.data, out.data, rt.error_record())
            return out
        rt.launch(prog["take"], out.size, np.int32(out.size), np.int32(size),
                  np.int32(indices.size), np.int32(inner), x.data, indices.data, out.data,
                  rt.error_record())
        return out

    def take_grad(self, g: CLArray, indices: CLArray, axis: int,
                  shape: tuple[int, ...]) -> CLArray:
        indices = self._index_array(indices)
        dt = self._dt(g)
        shape = tuple(int(d) for d in shape)
        out = self.full(shape, 0, dt)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        prog = self._prog("index.cl", ("A", dt), ("O", dt), ("L", self._dt(indices)))
        rt = self.runtime
        rt.launch(prog["take_grad"], outer * inner, np.int32(outer), np.int32(shape[axis]),
                  np.int32(indices.size), np.int32(inner), g.data, indices.data, out.data,
                  rt.error_record())
        return out

    def getitem(self, x: CLArray, key: tuple[Any, ...]) -> CLArray:
        offset, shape, strides = basic_index(tuple(x.shape), tuple(key))
        return self._gather(x, offset, shape, strides)

    def getitem_grad(self, g: CLArray, key: tuple[Any, ...],
                     shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        out = self.full(shape, 0, self._dt(g))
        offset, vshape, strides = basic_index(shape, tuple(key))
        if math.prod(vshape) != g.size:
            g = self.broadcast_to(g, vshape)
        self._scatter(g, out, offset, vshape, strides)
        return out
