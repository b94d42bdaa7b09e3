"""Elementwise kernels: the arithmetic, comparisons, logic and unary math of the generated
elementwise program (:func:`mpcore_opencl.programs.elementwise_source`), each with a flat
kernel for same-shape operands, ``_as``/``_sa`` kernels for a scalar operand and a ``_bc`` kernel
for broadcasting; and ``where``. The kernel methods (``add``, ``exp``, ``less`` ...) are made
from the op tables of :mod:`mpcore_opencl.programs`, one per op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .arrays import NP_DTYPES, CLArray, vec8
from .programs import BINARY, BINARY_BOOL, UNARY, UNARY_BOOL
from .views import ViewKernels, broadcast_axes, broadcast_shape


def _unary_kernel(op: str, out: str | None = None) -> Callable[..., CLArray]:
    def kernel(self: ElementwiseKernels, x: CLArray) -> CLArray:
        return self._unary(op, x, out)
    kernel.__name__, kernel.__qualname__ = op, f"ElementwiseKernels.{op}"
    return kernel


def _binary_kernel(op: str, out: str | None = None) -> Callable[..., CLArray]:
    def kernel(self: ElementwiseKernels, a: Any, b: Any) -> CLArray:
        return self._binary(op, a, b, out)
    kernel.__name__, kernel.__qualname__ = op, f"ElementwiseKernels.{op}"
    return kernel


class ElementwiseKernels(ViewKernels):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the elementwise kernels."""

    def _unary(self, op: str, x: CLArray, out: str | None = None) -> CLArray:
        dt = self._dt(x)
        od = out or dt
        o = self._empty(x.shape, od)
        try:
            kernel = self._elementwise(dt, od)[f"k_{op}"]
        except KeyError:
            raise TypeError(f"{op} is not defined for {dt} on the OpenCL backend") from None
        self.runtime.launch(kernel, x.size, np.int32(x.size), x.data, o.data)
        return o

    def _binary(self, op: str, a: Any, b: Any, out: str | None = None) -> CLArray:
        # The common case first, with no more Python than it needs: per-op host time is what
        # small tensors pay (the kernel of a same-shape, same-dtype pair is cached by its key).
        if (type(a) is CLArray and type(b) is CLArray and a.shape == b.shape
                and a.dtype == b.dtype):
            kernel = self._flat.get((op, a.dtype, out))
            if kernel is not None:
                rt = self._rt
                o = CLArray(rt, a.shape, NP_DTYPES[out] if out else a.dtype)
                rt.launch(kernel, o.size, np.int32(o.size), a.data, b.data, o.data)
                return o
        rt = self.runtime
        if isinstance(a, CLArray):
            dt = self._dt(a)
        elif isinstance(b, CLArray):
            dt = self._dt(b)
        else:
            raise TypeError(f"{op}: at least one operand must be a device array")
        od = out or dt
        try:
            prog = self._elementwise(dt, od)
            name = f"k_{op}"
            prog[name]
        except KeyError:
            raise TypeError(f"{op} is not defined for {dt} on the OpenCL backend") from None
        if not isinstance(b, CLArray):
            o = self._empty(a.shape, od)
            rt.launch(prog[name + "_as"], o.size, np.int32(o.size), a.data,
                      self._scalar(b, dt), o.data)
            return o
        if not isinstance(a, CLArray):
            o = self._empty(b.shape, od)
            rt.launch(prog[name + "_sa"], o.size, np.int32(o.size), self._scalar(a, dt),
                      b.data, o.data)
            return o
        if a.dtype != b.dtype:
            raise TypeError(f"{op}: operands of different dtypes ({dt}, {self._dt(b)}); the "
                            "core casts them to one dtype first")
        if a.shape == b.shape:
            o = self._empty(a.shape, od)
            self._flat[(op, a.dtype, out)] = prog[name]
            rt.launch(prog[name], o.size, np.int32(o.size), a.data, b.data, o.data)
            return o
        shape = broadcast_shape(tuple(a.shape), tuple(b.shape))
        o = self._empty(shape, od)
        if o.size == 0:
            return o
        cshape, (sa, sb) = broadcast_axes(shape, (a.shape, b.shape), op)
        rt.launch(prog[name + "_bc"], o.size, np.int32(o.size), np.int32(len(cshape)),
                  vec8(cshape), vec8(sa), vec8(sb), a.data, b.data, o.data)
        return o

    def where(self, cond: CLArray, a: CLArray, b: CLArray) -> CLArray:
        dt = self._dt(a) if isinstance(a, CLArray) else self._dt(b)
        if not isinstance(a, CLArray):
            a = self.full((), a, dt)
        if not isinstance(b, CLArray):
            b = self.full((), b, dt)
        if self._dt(cond) != "bool":
            cond = self.cast(cond, "bool")
        prog = self._elementwise(dt, dt)
        if cond.shape == a.shape == b.shape:
            o = self._empty(a.shape, dt)
            self.runtime.launch(prog["where_flat"], o.size, np.int32(o.size), cond.data, a.data,
                                b.data, o.data)
            return o
        shape = broadcast_shape(tuple(cond.shape), tuple(a.shape), tuple(b.shape))
        o = self._empty(shape, dt)
        if o.size == 0:
            return o
        cshape, (sc, sa, sb) = broadcast_axes(shape, (cond.shape, a.shape, b.shape), "where")
        self.runtime.launch(prog["where_bc"], o.size, np.int32(o.size), np.int32(len(cshape)),
                            vec8(cshape), vec8(sc), vec8(sa), vec8(sb), cond.data, a.data,
                            b.data, o.data)
        return o


# Every op of the expression tables in programs.py is the kernel of the same name (copy aside:
# creation.py's), so a new elementwise op is one line there.
for _op in UNARY:
    if _op != "copy":
        setattr(ElementwiseKernels, _op, _unary_kernel(_op))
for _op in UNARY_BOOL:
    setattr(ElementwiseKernels, _op, _unary_kernel(_op, "bool"))
for _op in BINARY:
    setattr(ElementwiseKernels, _op, _binary_kernel(_op))
for _op in BINARY_BOOL:
    setattr(ElementwiseKernels, _op, _binary_kernel(_op, "bool"))
