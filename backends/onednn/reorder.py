"""float32 <-> bfloat16 conversions as oneDNN reorder primitives.

ml_dtypes converts bfloat16 one element at a time (per million elements here: float32 ->
bfloat16 0.74 ms, the reverse 0.35 ms; ONNX Runtime's ``Cast`` is no faster for bfloat16).
oneDNN's reorder is JIT-compiled, vectorised and runs on its OpenMP team. Both round float32 to
the nearest bfloat16, ties to even, and widen bfloat16 exactly, so the results are ``astype``'s
bit for bit, NaN payloads aside (checked over every bfloat16 and a sweep of float32 patterns,
see tests/test_onednn.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .dnnl import Entry, Library, PrimitiveCache, _check, _ExecArg, _vp

_ARG_FROM, _ARG_TO = 1, 17


class ReorderCache(PrimitiveCache):
    """``dst[...] = src`` converted between the dtypes of two flat C-contiguous arrays of one
    length (float32, bfloat16 or float16), one primitive per (length, dtypes), LRU-cached."""

    def __init__(self, library: Library, max_entries: int = 64) -> None:
        super().__init__(library, max_entries)

    def run(self, src: np.ndarray, dst: np.ndarray, src_type: str, dst_type: str) -> None:
        key = (src.size, src_type, dst_type)
        entry = self._get(key, lambda: self._create(*key))
        self._execute(entry, (src, dst))

    def _create(self, n: int, src_type: str, dst_type: str) -> Entry:
        lib = self.library.lib
        descs: list[Any] = []
        mems: list[Any] = []
        pd, primitive = _vp(), _vp()
        try:
            for dtype in (src_type, dst_type):
                descs.append(self._desc((n,), dtype))
            engine = self.library.engine
            _check(lib.dnnl_reorder_primitive_desc_create(
                ctypes.byref(pd), descs[0], engine, descs[1], engine, None),
                f"dnnl_reorder_primitive_desc_create {src_type} -> {dst_type}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            for md in descs:
                mems.append(self._memory(md))
        except Exception:
            self._destroy(Entry(primitive, pd, descs, mems, None, "", threading.Lock()))
            raise
        args = (_ExecArg * 2)(_ExecArg(_ARG_FROM, mems[0]), _ExecArg(_ARG_TO, mems[1]))
        return Entry(primitive, pd, descs, mems, args, "", threading.Lock())


_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
#: (source, destination) NumPy dtypes -> oneDNN data type names, for the conversions made here.
PAIRS = {(_F32, _BF16): ("float32", "bfloat16"), (_BF16, _F32): ("bfloat16", "float32")}
#: Smaller conversions stay with the fallback: a primitive call costs ~15 us from Python,
#: which ml_dtypes' loop matches at a few ten thousand elements.
MIN_ELEMENTS = 1 << 15


class ReorderCast:
    """A ``convert(x, dtype)`` kernel: contiguous float32 <-> bfloat16 arrays of at least
    :data:`MIN_ELEMENTS` through oneDNN reorders, everything else through ``fallback`` (the
    ``convert`` kernel it wraps). ``alloc(shape, dtype)`` gives the (C-contiguous,
    uninitialised) result arrays."""

    def __init__(self, fallback: Callable[[np.ndarray, Any], np.ndarray], cache: ReorderCache,
                 alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None) -> None:
        self.fallback = fallback
        self.cache = cache
        self.alloc = alloc or np.empty
        self.calls = 0  # conversions oneDNN made (for tests and diagnostics)

    def __call__(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        types = PAIRS.get((x.dtype, dtype))
        if types is None or x.size < MIN_ELEMENTS or not x.flags.c_contiguous:
            return self.fallback(x, dtype)
        out = self.alloc(x.shape, dtype)
        self.cache.run(x.reshape(-1), out.reshape(-1), *types)
        self.calls += 1
        return out
