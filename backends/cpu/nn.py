"""The CPU backend's neural-network kernels: the bias add, the dropout mask, and relu's backward
pass in blocks whose scratch stays in cache, also with the bias gradient of the dense layer it
belongs to summed while each block is hot.

``relu_grad(g, y)`` is ``g`` where ``y > 0`` and +0 elsewhere, even where ``g`` is inf or NaN
(TF's ReluGrad: a product ``g * (y > 0)`` would make NaN of an overflowed gradient, and -0).
NumPy's ``where`` is several times slower than a multiply, so the selection works on the bits: a
0/1 integer mask from ``y`` times the bits of ``g`` is ``g``'s bits or +0, exactly.

Blocks of :data:`BLOCK` elements keep the mask in L2, so memory sees one read of ``g`` and
``y`` and one write of the result (benchmarks/ measures the block size).

``relu_grad_bias`` adds each block's float32 column sums to the bias gradient while the block
is in cache, instead of a separate pass (``ones @ dz``, a GEMV that reads the gradient back
from memory). 16-bit gradients keep that GEMV (see the kernel).

With the oneDNN plugin, ``relu_grad_bias`` of large float32 and bfloat16 arrays runs on oneDNN's
threads instead (mpcore_onednn.nn), for each dtype only after a probe at first use finds
oneDNN's result bit for bit this kernel's; this kernel redoes the rare calls whose ``g`` or bias
gradient is not finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpcore_xp import BF16, DTYPES, F16, F32

from mpcore.core.backend import bind_call

_F32 = F32
_ZERO32 = np.zeros((), _F32)

# uint views of floats, with the bits of +inf: for a float y, "y > 0" is "0 < bits <= inf"
# (NaNs have larger bits, negatives the sign bit), one unsigned compare of bits - 1.
_UINT_OF = {_F32: (np.dtype(np.uint32), 0x7F800000),
            F16: (np.dtype(np.uint16), 0x7C00),
            BF16: (np.dtype(np.uint16), 0x7F80)}

#: Rows at most this long are reduced through a transposed copy (:meth:`CpuNn.max_along`).
_SHORT_ROWS = 64
#: Elements per block (benchmarks/ measures the choice).
BLOCK = 1 << 16


def _blocked(g: np.ndarray, y: np.ndarray) -> bool:
    """Whether the bitwise blocked path applies: a float dtype it knows, one dtype, one shape
    (a broadcast ``g`` of another shape takes NumPy's ``where``), at least one axis."""
    return g.dtype in _UINT_OF and y.dtype == g.dtype and y.shape == np.shape(g) and y.ndim > 0


def _masked_blocks(g: np.ndarray, y: np.ndarray, out: np.ndarray) -> Iterator[np.ndarray]:
    """Write ``relu_grad(g, y)`` into ``out`` (C-contiguous, ``y``'s shape) block by block of
    whole rows of the last axis, yielding each written block as a 2-D array."""
    uint, inf = _UINT_OF[g.dtype]
    cols = y.shape[-1]
    g2 = np.ascontiguousarray(g).reshape(-1, cols).view(uint)
    y2 = np.ascontiguousarray(y).reshape(-1, cols)
    out2 = out.reshape(-1, cols).view(uint)
    rows = len(y2)
    step = max(1, BLOCK // max(cols, 1))
    mask = np.empty((min(step, rows), cols), uint)
    one, inf_bits = uint.type(1), uint.type(inf)
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        keep = mask[:hi - lo]
        if g.dtype == _F32:
            _select32(g2[lo:hi], y2[lo:hi], keep, out2[lo:hi])
        else:  # NumPy's 16-bit compares convert every element
            np.subtract(y2[lo:hi].view(uint), one, out=keep)
            np.less(keep, inf_bits, out=keep, casting="unsafe")
            np.multiply(g2[lo:hi], keep, out=out2[lo:hi])  # g's bits times 1 or 0
        yield out2[lo:hi].view(g.dtype)


def _select32(g_bits: np.ndarray, y: np.ndarray, keep: np.ndarray, out_bits: np.ndarray) -> None:
    """One float32 block of relu_grad: ``keep`` (uint32 scratch) is ``y > 0`` as 1 or 0, and
    ``out_bits`` ``g``'s bits times it."""
    np.greater(y, _ZERO32, out=keep, casting="unsafe")
    np.multiply(g_bits, keep, out=out_bits)


def column_sums(matmul: Any, dz: np.ndarray) -> np.ndarray:
    """``dz`` summed over every axis but the last, as the GEMV ``ones @ dz`` through ``matmul``
    (a matmul kernel): 16-bit operands are multiplied in float32 (or natively in bfloat16 on
    oneDNN), and a 2-D ``dz`` goes in as itself, whose float32 copy the layer's GEMMs make and
    the backend remembers by identity."""
    rows = dz if dz.ndim == 2 else dz.reshape(-1, dz.shape[-1])
    return matmul(np.ones((1, len(rows)), dz.dtype), rows, False, False).reshape(-1)


class CpuNn:
    """Mixed into CpuBackend, whose ``buffer`` gives the outputs and ``convert`` rounds."""

    buffer: Any
    convert: Any
    kernels: Any
    _kernel_table: Any

    def relu_grad(self, g: np.ndarray, y: np.ndarray) -> np.ndarray:
        if not _blocked(g, y):
            return super().relu_grad(g, y)
        out = self.buffer(y.shape, g.dtype)
        for _ in _masked_blocks(g, y, out):
            pass
        return out

    def relu_grad_bias(self, g: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``relu_grad(g, y)`` and its sum over every axis but the last: a dense layer's
        pre-activation gradient and its bias gradient, in one pass."""
        if not _blocked(g, y):
            dz = self.relu_grad(g, y)
            # float32 accumulation at least (float64 keeps its own)
            acc = np.result_type(dz.dtype, _F32)
            total = np.add.reduce(dz.reshape(-1, dz.shape[-1]), axis=0, dtype=acc)
            return dz, self._rounded(total, dz.dtype)
        if g.dtype != _F32:
            # 16-bit: the GEMV, as the composite op does, on the float32 copy of dz the layer's
            # GEMMs make anyway, where summing the 16-bit blocks here would convert them
            # element by element in NumPy
            dz = self.relu_grad(g, y)
            return dz, column_sums(self.kernels()["matmul"], dz)
        out = self.buffer(y.shape, g.dtype)
        total = np.zeros(y.shape[-1], _F32)
        for block in _masked_blocks(g, y, out):
            total += np.add.reduce(block, axis=0, dtype=_F32)
        return out, self._rounded(total, g.dtype)

    def bind_relu_grad_bias(self, g: np.ndarray, y: np.ndarray) -> Callable[..., Any] | None:
        """``relu_grad_bias`` of matrices for a traced step: float32 of one block as the
        kernel's blocked pass without its per-call set-up; 16-bit with the bias gradient's
        GEMV bound to its operands (a row of ones made once). None elsewhere."""
        if not _blocked(g, y) or y.ndim != 2:
            return None
        shape, dtype = y.shape, g.dtype
        kernel = self._kernel_table["relu_grad_bias"]   # (a provider's, where one is installed)
        if dtype == _F32:
            if y.size > BLOCK or not (g.flags.c_contiguous and y.flags.c_contiguous):
                return None

            def bound32(g: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                if (g.dtype != dtype or y.dtype != dtype or g.shape != shape
                        or y.shape != shape or not (g.flags.c_contiguous
                                                    and y.flags.c_contiguous)):
                    return kernel(g, y)
                # the kernel's one block (_masked_blocks), its bias gradient summed from 0
                out = self.buffer(shape, dtype)
                _select32(g.view(np.uint32), y, np.empty(shape, np.uint32), out.view(np.uint32))
                total = np.zeros(shape[1], _F32)
                total += np.add.reduce(out, axis=0, dtype=_F32)
                return out, total

            return bound32
        matmul = self._kernel_table["matmul"]
        ones = np.ones((1, y.shape[0]), g.dtype)
        # dz comes C-ordered from the buffer pool, whatever y's order
        gemv = bind_call(matmul, ones, np.empty(shape, dtype), False, False) or matmul

        def bound(g: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if g.dtype != dtype or y.dtype != dtype or g.shape != shape or y.shape != shape:
                return kernel(g, y)          # (relu_grad takes any layout)
            dz = self.relu_grad(g, y)
            return dz, gemv(ones, dz, False, False).reshape(-1)   # column_sums, bound

        return bound

    def _rounded(self, total: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return total if dtype == total.dtype else self.convert(total, dtype)

    def max_along(self, x: np.ndarray, axis: int) -> np.ndarray:
        """The maxima along ``axis``, kept as a length-1 axis, a zero maximum as +0. NumPy
        reduces a short last axis one row at a time; the transposed copy's rows are reduced as
        whole vectors, about three times faster for a softmax over 10 classes
        (docs/performance.md). A maximum is exact in any order and NaNs propagate either way,
        but which of a +0 and a -0 survives depends on the order the elements meet (NumPy's
        SIMD reductions pair them in their own): adding +0 makes every route, and every
        NumPy build, give +0 there (a -0 maximum would otherwise flip the sign of a zero
        log_softmax)."""
        if x.ndim == 2 and axis in (1, -1) and x.shape[1] <= _SHORT_ROWS:
            top = np.ascontiguousarray(x.T).max(axis=0)[:, None]
        else:
            top = x.max(axis=axis, keepdims=True)
        top += 0.0
        return top

    def labels_below(self, labels: np.ndarray, classes: int) -> bool:
        """One reduction: a negative signed label is a large unsigned one."""
        if labels.dtype.kind == "i":
            return bool(labels.view(f"u{labels.dtype.itemsize}").max() < classes)
        return bool(labels.min() >= 0 and labels.max() < classes)

    def bias_add(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        if x.dtype == F16 and x.ndim:
            # NumPy's float16 add computes in float32 and rounds: the same, with faster
            # conversions than its per-element ones
            out = self.convert(x, F32)
            out += bias.astype(F32)
            return self.convert(out, F16)
        return x + bias

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str,
                     seed: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(seed))
        keep = rng.random(shape, dtype=np.float32) >= rate
        return np.where(keep, np.asarray(1.0 / (1.0 - rate), dtype=DTYPES[dtype]),
                        np.zeros((), dtype=DTYPES[dtype]))
