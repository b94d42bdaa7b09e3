"""The CUDA backend's neural-network kernels from ``kernels.cu``: softmax and log-softmax by
rows, sparse softmax cross-entropy and its fused backward, relu's backward, the bias add and the
dropout mask.

Labels out of range in ``sparse_softmax_cross_entropy`` give NaN (as TensorFlow on GPUs), since
raising would need a host read every step."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import DTYPES, F32, F64, I64, LOW

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid


class CudaNn:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    _contig: Any

    def _rows_last(self, x: Any, axis: int) -> tuple[Any, bool]:
        moved = axis != x.ndim - 1
        if moved:
            x = self.cp.moveaxis(x, axis, -1)
        return self._contig(x), moved

    def _softmax(self, x: Any, axis: int, log_mode: int) -> Any:
        if x.dtype in LOW:  # computed in float32, rounded once to the input's dtype
            return self.cast(self._softmax(self.cast(x, "float32"), axis, log_mode),
                             x.dtype.name)
        cp = self.cp
        if x.dtype not in (F32, F64):
            x = x.astype(F32)
        if x.ndim == 0:  # a softmax over one value
            return cp.zeros((), x.dtype) if log_mode else cp.ones((), x.dtype)
        xr, moved = self._rows_last(x, axis)
        out = cp.empty(xr.shape, dtype=xr.dtype)
        cols = xr.shape[-1] if xr.ndim else 1
        rows = xr.size // cols if cols else 0
        if rows and cols:
            _k.function(_k.template("softmax_rows", CTYPE[xr.dtype]))(
                (rows,), (BLOCK,), (xr, out, np.int64(cols), np.int32(log_mode)))
        return cp.moveaxis(out, -1, axis) if moved else out

    def softmax(self, x: Any, axis: int) -> Any:
        return self._softmax(x, axis, 0)

    def log_softmax(self, x: Any, axis: int) -> Any:
        return self._softmax(x, axis, 1)

    def sparse_softmax_cross_entropy(self, logits: Any, labels: Any) -> tuple[Any, Any]:
        cp = self.cp
        if logits.dtype not in (F32, F64):
            logits = self.cast(logits, "float32") if logits.dtype in LOW else logits.astype(F32)
        logits = self._contig(logits)
        labels = self._contig(labels.astype(I64, copy=False))
        rows, cols = logits.shape
        loss = cp.empty((rows,), dtype=logits.dtype)
        probs = cp.empty_like(logits)
        if rows and cols:
            _k.function(_k.template("xent_fwd", CTYPE[logits.dtype]))(
                (rows,), (BLOCK,), (logits, labels, loss, probs, np.int64(cols)))
        return loss, probs

    def sparse_softmax_cross_entropy_grad(self, probs: Any, labels: Any, g: Any) -> Any:
        """``(probs - one_hot(labels)) * g[:, None]`` in one kernel (the fused backward)."""
        cp = self.cp
        probs = self._contig(probs)
        labels = self._contig(labels.astype(I64, copy=False))
        g = self._contig(g.astype(probs.dtype, copy=False))
        dx = cp.empty_like(probs)
        if dx.size:
            _k.function(_k.template("xent_bwd", CTYPE[probs.dtype]))(
                grid(dx.size), (BLOCK,), (probs, labels, g, dx, np.int64(dx.size),
                                            np.int64(probs.shape[1])))
        return dx

    def relu_grad(self, g: Any, y: Any) -> Any:
        if g.dtype not in KERNEL_FLOATS or y.dtype != g.dtype or g.shape != y.shape:
            return g * (y > 0)
        g, y = self._contig(g), self._contig(y)
        out = self.cp.empty(g.shape, dtype=g.dtype)
        if g.size:
            _k.function(_k.template("relu_grad", CTYPE[g.dtype]))(
                grid(g.size), (BLOCK,), (g, y, out, np.int64(g.size)))
        return out

    def relu_grad_bias(self, g: Any, y: Any) -> tuple[Any, Any]:
        # relu_grad's kernel, then the bias gradient as this backend's column sum (a float32-
        # accumulating GEMV for 16-bit): on a GPU a second read of dz is cheap next to the
        # layer's GEMMs, so there is no fused reduction kernel to maintain.
        dz = self.relu_grad(g, y)
        return dz, self.sum(dz.reshape(-1, dz.shape[-1]), (0,), False)

    def bias_add(self, x: Any, bias: Any) -> Any:
        if x.dtype not in KERNEL_FLOATS or bias.dtype != x.dtype:
            return super().bias_add(x, bias)
        x, bias = self._contig(x), self._contig(bias)
        out = self.cp.empty(x.shape, dtype=x.dtype)
        if x.size:
            _k.function(_k.template("bias_add", CTYPE[x.dtype]))(
                grid(x.size), (BLOCK,), (x, bias, out, np.int64(x.size), np.int64(bias.shape[0])))
        return out

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str, seed: int) -> Any:
        dt = DTYPES[dtype]
        kdt = dt if dt in KERNEL_FLOATS else F32
        out = self.cp.empty(shape, dtype=kdt)
        if out.size:
            _k.function(_k.template("dropout_mask", CTYPE[kdt]))(
                grid(out.size), (BLOCK,),
                (out, np.int64(out.size), np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float32(rate),
                 np.float64(1.0 / (1.0 - rate))))
        return out if kdt == dt else out.astype(dt)
