"""oneDNN's matmul primitive on NumPy arrays: :class:`MatmulCache` runs ``C = op(A) @ op(B)
+ bias`` with primitives cached by problem (or bound to one problem, for traced steps)."""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from .dnnl import (
    _ARG_BIAS,
    _ARG_DST,
    _ARG_SCRATCHPAD,
    _ARG_SRC,
    _ARG_WEIGHTS,
    _QUERY_IMPL_INFO_STR,
    _QUERY_SCRATCHPAD_MD,
    _SCRATCHPAD_MODE_USER,
    DATA_TYPES,
    DnnlError,
    Entry,
    Library,
    PrimitiveCache,
    _check,
    _ExecArg,
    _vp,
)


def _layout(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """``(array, column_major)``: the operand in a layout oneDNN reads directly, where its
    last two axes are row- or column-major over dense batch axes. A transposed view of a
    contiguous array is the column-major case, so the backward pass's operands need no copy."""
    if x.flags.c_contiguous:
        return x, False
    if np.swapaxes(x, -1, -2).flags.c_contiguous:
        return x, True
    return np.ascontiguousarray(x), False



class MatmulCache(PrimitiveCache):
    """``op(A) @ op(B) + bias`` through oneDNN matmul primitives, cached (LRU) by shapes,
    layouts and dtypes. Memory objects are cached with their primitive and pointed at each
    call's arrays, so a cached call is one ``dnnl_primitive_execute``. No activation is fused:
    oneDNN's relu post-op is x86's ``maxps(z, 0)``, which turns a NaN ``z`` into 0 (see
    mpcore_onednn.nn.relu_in_place).

    Primitives use a scratchpad that this cache owns (oneDNN's user scratchpad mode): one
    buffer per thread, grown to the largest primitive's need (1.3 MB for the transposed
    operands of a 1024 x 1024 float32 GEMM) and kept, so the memory a call needs besides its
    operands is never taken from or given back to the allocator during a training step.
    ``alloc`` lets the caller supply the result arrays (the CPU backend's recycled buffers)."""

    def __init__(self, library: Library, max_entries: int = 256) -> None:
        super().__init__(library, max_entries)

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._entries),
                "max_entries": self.max_entries,
                "scratch_bytes": max((e.scratch_bytes for e in self._entries.values()),
                                     default=0)}

    def matmul(self, a: np.ndarray, b: np.ndarray, out_dtype: str,
               bias: np.ndarray | None = None,
               alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None,
               ) -> np.ndarray:
        """``a @ b + bias`` for arrays of equal rank >= 2 and equal batch shape, in
        ``out_dtype``; ``a`` and ``b`` may be transposed views (column-major in their last two
        axes). ``bias`` (1-D, float32 or the operands' dtype) is fused into the primitive: added to
        the float32 accumulator before the result is written (and rounded, for a 16-bit
        ``out_dtype``). ``alloc(shape, dtype)``
        returns the (uninitialised, C-contiguous) result array; default ``np.empty``."""
        a, a_cm = _layout(a)
        b, b_cm = _layout(b)
        if bias is not None:
            bias = np.ascontiguousarray(bias)
        key, out_shape, dtype = self._problem(a, a_cm, b, b_cm, out_dtype, bias)
        entry = self._get(key, lambda: self._create(key, out_shape))
        return self._run(entry, a, b, bias, out_shape, dtype, alloc)

    def bind(self, a: np.ndarray, b: np.ndarray, out_dtype: str,
             bias: np.ndarray | None = None,
             alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None,
             ) -> Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray] | None:
        """:meth:`matmul` for operands laid out as these (a traced step's, which every replay
        repeats), as ``run(a, b, bias)`` on a primitive of its own, outside the LRU (freed
        with ``run``): no layout analysis, key or cache lookup per call. The caller checks
        that later operands have these shapes, strides and dtypes; ``a`` and ``b`` may be
        the arrays of which these are transposed views (their data starts at the same
        address). None where a call would need a copy of an operand."""
        a2, a_cm = _layout(a)
        b2, b_cm = _layout(b)
        if a2 is not a or b2 is not b or (bias is not None and not bias.flags.c_contiguous):
            return None
        key, out_shape, dtype = self._problem(a, a_cm, b, b_cm, out_dtype, bias)
        entry = self._create(key, out_shape)

        def run(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
            return self._run(entry, a, b, bias, out_shape, dtype, alloc)

        finalizer = weakref.finalize(run, self._destroy, entry)
        finalizer.atexit = False      # (the process's end frees the library with it)
        return run

    def _problem(self, a: np.ndarray, a_cm: bool, b: np.ndarray, b_cm: bool, out_dtype: str,
                 bias: np.ndarray | None) -> tuple[tuple[Any, ...], tuple[int, ...], Any]:
        """(the cache key, the result's shape, its NumPy dtype)."""
        in_dtype = _dtype_name(a.dtype)
        if _dtype_name(b.dtype) != in_dtype:
            raise ValueError(f"operands differ in dtype: {a.dtype} and {b.dtype}")
        out_shape = (*a.shape[:-1], b.shape[-1])
        bias_dtype = None
        if bias is not None:
            if bias.shape != (b.shape[-1],):
                raise ValueError(f"bias of shape {bias.shape} does not match {out_shape}")
            bias_dtype = _dtype_name(bias.dtype)
        key = (a.shape, a_cm, b.shape, b_cm, in_dtype, out_dtype, bias_dtype)
        return key, out_shape, a.dtype if out_dtype == in_dtype else DTYPES[out_dtype]

    def _run(self, entry: Entry, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None,
             out_shape: tuple[int, ...], dtype: Any,
             alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None) -> np.ndarray:
        out = (alloc or np.empty)(out_shape, dtype)
        if out.shape != out_shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"alloc returned {out.dtype} {out.shape}, not a C-contiguous "
                             f"{dtype} {out_shape}")
        arrays = (a, b, out) if bias is None else (a, b, out, bias)
        scratch = (self._scratch_address(entry.scratch_bytes)
                   if entry.scratch_mem is not None else None)
        self._execute(entry, arrays, scratch)
        return out

    def implementation(self, key: tuple[Any, ...]) -> str:
        return self._entries[key].impl

    def _create(self, key: tuple[Any, ...], out_shape: tuple[int, ...]) -> Entry:
        a_shape, a_cm, b_shape, b_cm, in_dtype, out_dtype, bias_dtype = key
        lib = self.library.lib
        descs: list[Any] = []
        mems: list[Any] = []
        scratch_mem = _vp()
        scratch_bytes = 0
        pd = _vp()
        primitive = _vp()
        attr = _vp()
        layouts = [(a_shape, a_cm, in_dtype), (b_shape, b_cm, in_dtype),
                   (out_shape, False, out_dtype)]
        if bias_dtype is not None:
            # broadcast over every axis but the last: a (1, ..., 1, N) row
            layouts.append(((1,) * (len(out_shape) - 1) + out_shape[-1:], False, bias_dtype))
        try:
            for shape, cm, dtype in layouts:
                descs.append(self._desc(shape, dtype, cm))
            _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)),
                   "dnnl_primitive_attr_create")
            _check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_MODE_USER),
                   "dnnl_primitive_attr_set_scratchpad_mode")
            _check(lib.dnnl_matmul_primitive_desc_create(
                ctypes.byref(pd), self.library.engine, descs[0], descs[1],
                descs[3] if bias_dtype is not None else None, descs[2], attr),
                f"dnnl_matmul_primitive_desc_create for {key}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            for md in descs:
                mems.append(self._memory(md))
            # owned by the primitive descriptor: not destroyed here
            scratch_md = lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0)
            scratch_bytes = lib.dnnl_memory_desc_get_size(scratch_md) if scratch_md else 0
            if scratch_bytes:
                scratch_mem = self._memory(scratch_md)
        except DnnlError:
            self._destroy(Entry(primitive, pd, descs, mems, None, "", threading.Lock(),
                                 scratch_mem or None))
            raise
        finally:
            # the primitive descriptor keeps its own copy of the attributes
            if attr:
                lib.dnnl_primitive_attr_destroy(attr)
        info = ctypes.c_char_p()
        impl = ""
        if lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO_STR, 0, ctypes.byref(info)) == 0:
            impl = (info.value or b"").decode(errors="replace")
        pairs = list(zip([_ARG_SRC, _ARG_WEIGHTS, _ARG_DST, _ARG_BIAS], mems))
        if scratch_bytes:
            pairs.append((_ARG_SCRATCHPAD, scratch_mem))
        args = (_ExecArg * len(pairs))(*(_ExecArg(r, m) for r, m in pairs))
        return Entry(primitive, pd, descs, mems, args, impl, threading.Lock(),
                      scratch_mem if scratch_bytes else None, scratch_bytes)


_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    # memoised: np.dtype(...).name costs microseconds, and every call of a matmul asks twice
    name = _NAMES.get(dtype)
    if name is not None:
        return name
    name = np.dtype(dtype).name
    if name not in DATA_TYPES:
        raise ValueError(f"oneDNN matmul here takes {', '.join(DATA_TYPES)}; got {name}")
    _NAMES[dtype] = name
    return name
