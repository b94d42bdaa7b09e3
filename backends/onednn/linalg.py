"""oneDNN's matmul primitive in place of the CPU backend's ``matmul`` and ``dense`` kernels, for
the dtypes the plugin chose; everything else goes to the CPU kernels they wrap."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import DTYPES, LOW

from mpcore.core.backend import bind_call

from .matmul import MatmulCache
from .nn import relu_in_place
from .optim import Alloc, _mark

#: Float32 GEMMs of at most this many multiply-adds (m * n * k) go to the CPU kernel: NumPy's
#: BLAS runs them on the calling thread in about half the time of a oneDNN launch, whose fixed
#: cost (the call, waking oneDNN's OpenMP team) is most of their time. OpenBLAS itself runs
#: GEMMs up to 65536 * 4 multiply-adds on one thread, so no second thread pool wakes beside
#: oneDNN's: two spinning pools on the same cores made a step 10x slower, measured
#: (``benchmarks/step_gemms.py --engines``: "numpy_ms" against "onednn_ms"). The same rule for
#: eager and traced calls: both give the same bits.
SMALL_GEMM = 1 << 18

#: The CPU backend's (upcast, convert) for 16-bit dtypes multiplied by the float32 GEMM.
Upcasting = tuple[Callable[[Any], Any], Callable[[Any, Any], Any]] | None


def upcasting(backend: Any) -> Upcasting:
    """The CPU backend's float32 copies of 16-bit operands and its fast rounding back, for
    16-bit dtypes oneDNN has no fast GEMM for here (None for a backend without them)."""
    upcast = getattr(backend, "upcast", None)
    convert = getattr(backend, "convert", None)
    if upcast is None or convert is None:
        return None
    return upcast, convert


def _router(dtypes: frozenset[str], via_float32: Any) -> Callable[[Any], tuple[Any, Any]]:
    """For operands of a NumPy dtype: (the dtype oneDNN computes in, or None to leave them to
    the original kernel; the 16-bit dtype to round a float32 result back to, or None)."""
    native = {DTYPES[d]: d for d in dtypes}
    low = LOW - set(native)
    via = via_float32 is not None and "float32" in dtypes

    def route(dtype: Any) -> tuple[Any, Any]:
        name = native.get(dtype)
        if name is None and via and dtype in low:
            return "float32", dtype
        return name, None

    return route


def make_matmul(original: Callable[..., Any], cache: MatmulCache,
                dtypes: frozenset[str] = frozenset({"bfloat16"}), via_float32: Upcasting = None,
                alloc: Alloc | None = None) -> Callable[..., Any]:
    """The CPU ``matmul`` kernel with operands of ``dtypes`` ("bfloat16", "float32") sent to
    oneDNN, everything else to ``original``. With ``via_float32`` ((upcast, convert), and
    "float32" in ``dtypes``), 16-bit operands of other dtypes are multiplied by oneDNN's float32
    GEMM on their float32 copies and the result is rounded once, as the CPU kernel does with
    NumPy's: one thread pool for the whole step. Products computed in float32 (16-bit operands
    on that route too) of at most :data:`SMALL_GEMM` multiply-adds go to ``original`` (NumPy's
    BLAS on the calling thread).
    ``alloc(shape, dtype)`` gives the result arrays (the CPU backend's recycled buffers; default
    ``np.empty``)."""
    route = _router(dtypes, via_float32)

    def matmul(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> Any:
        dtype, out_dtype = route(a.dtype)
        if (dtype is None or b.dtype != a.dtype or a.ndim != b.ndim or a.size == 0 or b.size == 0
                or _small(dtype, a, b, transpose_a, transpose_b)):
            return original(a, b, transpose_a, transpose_b)
        if out_dtype is not None:
            a, b = via_float32[0](a), via_float32[0](b)  # type: ignore[index]
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        out = cache.matmul(a, b, dtype, alloc=alloc)
        return out if out_dtype is None else via_float32[1](out, out_dtype)  # type: ignore[index]

    def bind(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> Any:
        dtype, out_dtype = route(a.dtype)
        if dtype is None or out_dtype is not None or not _plain(a, b):
            return None
        if _small(dtype, a, b, transpose_a, transpose_b):   # a trace fixes the shapes
            return bind_call(original, a, b, transpose_a, transpose_b) or original
        run = cache.bind(np.swapaxes(a, 0, 1) if transpose_a else a,
                         np.swapaxes(b, 0, 1) if transpose_b else b, dtype, alloc=alloc)
        if run is None:
            return None
        expected = _layouts(a, b, transpose_a, transpose_b)

        def bound(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> Any:
            if _layouts(a, b, transpose_a, transpose_b) != expected:
                return matmul(a, b, transpose_a, transpose_b)
            return run(a, b, None)   # a transposed view's data starts where its array's does

        return bound

    matmul.bind = bind  # type: ignore[attr-defined]
    return _mark(matmul, original, cache)


def make_dense(original: Callable[..., Any], cache: MatmulCache,
               dtypes: frozenset[str] = frozenset({"bfloat16"}), via_float32: Upcasting = None,
               alloc: Alloc | None = None) -> Callable[..., Any]:
    """The CPU ``dense`` kernel (``activation(x @ w + b)``) as one oneDNN primitive for
    ``dtypes``, the bias fused into it, added to the float32 accumulator (a bfloat16 result is
    rounded once), then relu in place (:func:`~mpcore_onednn.nn.relu_in_place`: NaN stays
    NaN); other 16-bit dtypes as :func:`make_matmul` does with ``via_float32``; everything
    else goes to ``original``, as do products computed in float32 of at most
    :data:`SMALL_GEMM` multiply-adds. ``alloc`` as for :func:`make_matmul`."""
    route = _router(dtypes, via_float32)

    def dense(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
              activation: str | None) -> Any:
        dtype, out_dtype = route(x.dtype)
        if (dtype is None or w.dtype != x.dtype or x.ndim < 2 or x.size == 0 or w.size == 0
                or activation not in (None, "relu") or _small(dtype, x, w, False, False)):
            return original(x, w, b, activation)
        if out_dtype is not None:
            x, w = via_float32[0](x), via_float32[0](w)  # type: ignore[index]
        flat = x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x
        # oneDNN takes a float32 bias with 16-bit operands: the bias is added in float32
        bias = None if b is None else b.astype(np.float32, copy=False)
        out = cache.matmul(flat, w, dtype, bias, alloc)
        if activation == "relu":
            relu_in_place(out)
        if out_dtype is not None:
            out = via_float32[1](out, out_dtype)  # type: ignore[index]
        return out.reshape(*x.shape[:-1], w.shape[-1]) if x.ndim > 2 else out

    def bind(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, activation: str | None) -> Any:
        dtype, out_dtype = route(x.dtype)
        if (dtype is None or out_dtype is not None or not _plain(x, w)
                or activation not in (None, "relu")):
            return None
        if _small(dtype, x, w, False, False):
            return bind_call(original, x, w, b, activation) or original
        run = cache.bind(x, w, dtype, None if b is None else b.astype(np.float32, copy=False),
                         alloc)
        if run is None:
            return None
        expected = (_layouts(x, w, activation),
                    None if b is None else (b.shape, b.strides, b.dtype))

        def bound(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                  activation: str | None) -> Any:
            if (_layouts(x, w, activation),
                    None if b is None else (b.shape, b.strides, b.dtype)) != expected:
                return dense(x, w, b, activation)
            out = run(x, w, None if b is None else b.astype(np.float32, copy=False))
            if activation == "relu":
                relu_in_place(out)
            return out

        return bound

    dense.bind = bind  # type: ignore[attr-defined]
    return _mark(dense, original, cache)


def _small(dtype: str, a: np.ndarray, b: np.ndarray, transpose_a: bool,
           transpose_b: bool) -> bool:
    """Whether ``op(a) @ op(b)`` computed in ``dtype`` is a float32 GEMM of at most
    :data:`SMALL_GEMM` multiply-adds, ``a``'s batch axes counted (the kernels take equal batch
    shapes, or a 2-D ``b``: ``mpcore.ops`` broadcasts first)."""
    if dtype != "float32" or a.ndim < 2 or b.ndim < 2:
        return False
    rows = a.shape[-1] if transpose_a else a.shape[-2]
    inner = a.shape[-2] if transpose_a else a.shape[-1]
    cols = b.shape[-2] if transpose_b else b.shape[-1]
    return math.prod(a.shape[:-2]) * rows * inner * cols <= SMALL_GEMM


def _plain(a: np.ndarray, b: np.ndarray) -> bool:
    """Two non-empty matrices of one dtype: what a bound GEMM takes."""
    return a.dtype == b.dtype and a.ndim == b.ndim == 2 and a.size > 0 and b.size > 0


def _layouts(a: np.ndarray, b: np.ndarray, *rest: Any) -> tuple[Any, ...]:
    """What a bound GEMM assumes of its operands: shapes, strides, dtypes (and the other
    arguments)."""
    return (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, *rest)
