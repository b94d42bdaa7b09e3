"""Strided views of C-contiguous arrays: their geometry (broadcasting, basic indexing) and the
two kernels that materialise them (a gather into a new array, a scatter into an existing one).

A view is (offset, shape, strides) in elements over a contiguous buffer. Kernels take at most
:data:`~mpcore_opencl.arrays.MAX_DIMS` axes, after :func:`~mpcore_opencl.arrays.coalesce` has
merged the ones that are contiguous in every operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import MAX_DIMS, CLArray, coalesce, contiguous_strides, vec8
from .programs import KernelFamily

Shape = tuple[int, ...]


def broadcast_shape(*shapes: Shape) -> Shape:
    """The shape NumPy broadcasts ``shapes`` to; ValueError where they do not broadcast."""
    out = shapes[0]
    for b in shapes[1:]:
        a = out
        n = max(len(a), len(b))
        a = (1,) * (n - len(a)) + a
        b = (1,) * (n - len(b)) + b
        dims = []
        for x, y in zip(a, b):
            if x != y and 1 not in (x, y):
                raise ValueError(f"shapes {a} and {b} cannot be broadcast together")
            dims.append(y if x == 1 else x)
        out = tuple(dims)
    return out


def broadcast_strides(shape: Shape, out: Shape) -> Shape:
    """Element strides that read a contiguous ``shape`` as ``out`` (0 on broadcast axes)."""
    st = contiguous_strides(shape)
    lead = len(out) - len(shape)
    return (0,) * lead + tuple(0 if d == 1 and o != 1 else s
                               for d, s, o in zip(shape, st, out[lead:]))


def kernel_axes(shape: Shape, *strides: Shape, too_many: str) -> tuple[Shape, list[Shape]]:
    """``shape`` and ``strides`` coalesced to the axes a kernel walks; ValueError(``too_many``)
    where more than MAX_DIMS remain."""
    cshape, cstrides = coalesce(shape, *strides)
    if len(cshape) > MAX_DIMS:
        raise ValueError(too_many)
    return cshape, cstrides


def broadcast_axes(shape: Shape, operands: tuple[Shape, ...],
                   what: str) -> tuple[Shape, list[Shape]]:
    """The kernel axes and per-operand strides that read contiguous ``operands`` broadcast to
    ``shape`` (see :func:`kernel_axes`)."""
    return kernel_axes(shape, *(broadcast_strides(s, shape) for s in operands),
                       too_many=f"{what}: broadcasting over more than {MAX_DIMS} axes")


def basic_index(shape: Shape, key: tuple[Any, ...]) -> tuple[int, Shape, Shape]:
    """(offset, shape, strides) in elements of the basic-indexing view ``x[key]`` of a
    contiguous ``x`` of ``shape`` (ints, slices, None and one Ellipsis, as NumPy)."""
    strides = contiguous_strides(shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices for an array of rank {len(shape)}")
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded: list[Any] = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (len(shape) - sum(1 for k in expanded if k is not None)))
    offset = 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    dim = 0
    for k in expanded:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, stride = shape[dim], strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            count = len(range(start, stop, step))
            offset += start * stride if count else 0
            out_shape.append(count)
            out_strides.append(stride * step)
        else:
            i = int(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
            offset += (i % size) * stride
        dim += 1
    return offset, tuple(out_shape), tuple(out_strides)


def _view_axes(shape: Shape, strides: Shape) -> tuple[Shape, Shape]:
    cshape, (cst,) = kernel_axes(
        shape, strides, too_many=f"the OpenCL backend handles views of at most {MAX_DIMS} "
                                 f"non-mergeable axes, got shape {shape}")
    return cshape, cst


class ViewKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: copies of strided views, which
    the shape, reduction and broadcasting kernels build on."""

    def _gather(self, x: CLArray, offset: int, shape: Shape, strides: Shape,
                out_dtype: str | None = None) -> CLArray:
        """A contiguous copy of the strided view (offset, shape, strides) of ``x``,
        converted to ``out_dtype``."""
        dt = self._dt(x)
        od = out_dtype or dt
        out = self._empty(shape, od)
        if out.size == 0:
            return out
        cshape, cst = _view_axes(shape, strides)
        self.runtime.launch(self._elementwise(dt, od)["k_copy_s"], out.size, np.int32(out.size),
                            np.int32(len(cshape)), vec8(cshape), vec8(cst), np.int32(offset),
                            x.data, out.data)
        return out

    def _scatter(self, src: CLArray, out: CLArray, offset: int, shape: Shape,
                 strides: Shape) -> None:
        """Write contiguous ``src`` into the strided view (offset, shape, strides) of ``out``."""
        if src.size == 0:
            return
        cshape, cst = _view_axes(shape, strides)
        self.runtime.launch(self._elementwise(self._dt(src), self._dt(out))["copy_w"], src.size,
                            np.int32(src.size), np.int32(len(cshape)), vec8(cshape), vec8(cst),
                            np.int32(offset), src.data, out.data)

    def _contiguous_view(self, x: CLArray, perm: tuple[int, ...]) -> CLArray:
        """A contiguous copy of ``x`` with its axes permuted by ``perm``."""
        st = contiguous_strides(x.shape)
        return self._gather(x, 0, tuple(x.shape[p] for p in perm), tuple(st[p] for p in perm))
