"""float32 <-> bfloat16 conversions as oneDNN reorder primitives.

ml_dtypes converts bfloat16 one element at a time (and ONNX Runtime's ``Cast`` is no faster for
bfloat16).
oneDNN's reorder is JIT-compiled, vectorised and runs on its OpenMP team. At ISA avx512_core
(AVX-512 without avx512_bf16) it rounds float32 to the nearest bfloat16, ties to even, in
software and widens bfloat16 exactly: ``astype``'s bits, NaN payloads aside.

Elsewhere it does not. With avx512_bf16, oneDNN rounds with the ``vcvtneps2bf16`` instruction,
which treats subnormal inputs as zero whatever MXCSR says: a float32 subnormal becomes a signed
zero where ``astype`` gives a bfloat16 subnormal (or the smallest normal); its AVX2 code
flushes them too, and widens bfloat16 -0 to +0. So before a direction is first used,
:func:`probe` converts every value that rounding can get wrong (every bfloat16; float32
subnormals, ties, the overflow edge, infinities and NaNs of both signs) and compares with
``astype``. A direction that agrees everywhere is used as it is (:data:`EXACT`). One that agrees
everywhere but on float32 subnormal inputs (:data:`FLUSHES_SUBNORMALS`: ``vcvtneps2bf16``) is
used and its result checked: where it holds a zero, the float32 input is checked for a
subnormal, and an array that has one is converted again by ml_dtypes (:func:`flushed`; the
reorder and its check cost a quarter to two thirds of ml_dtypes' loop). Any other direction
stays with the kernel this one wraps.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import BF16, F32

from mpcore.core.backend import bind_call

from .dnnl import DnnlError, Entry, Library, PrimitiveCache, _check, _ExecArg, _vp

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

    def bind(self, n: int, src_type: str, dst_type: str) -> Callable[[np.ndarray, np.ndarray],
                                                                      None]:
        """:meth:`run` for arrays of ``n`` elements on a primitive of its own (outside the
        LRU, freed with the function returned), for a traced step."""
        entry = self._create(n, src_type, dst_type)
        execute = self._execute

        def run(src: np.ndarray, dst: np.ndarray) -> None:
            execute(entry, (src, dst))

        finalizer = weakref.finalize(run, self._destroy, entry)
        finalizer.atexit = False      # (the process's end frees the library with it)
        return run

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


#: (source, destination) NumPy dtypes -> oneDNN data type names, for the conversions made here.
PAIRS = {(F32, BF16): ("float32", "bfloat16"), (BF16, F32): ("bfloat16", "float32")}


def special_values(dtype: np.dtype) -> np.ndarray:
    """The values whose conversion from ``dtype`` (float32 or bfloat16) rounding can get
    wrong: every bfloat16; for float32, every sign and exponent (subnormals and inf/NaN
    included) with the mantissas that round to even, just below and above a tie, to the
    next binade or to infinity, and NaN payloads."""
    if dtype == BF16:
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    mantissas = np.array([0x000000, 0x000001, 0x007FFF, 0x008000, 0x008001, 0x018000,
                          0x017FFF, 0x400000, 0x7F7FFF, 0x7F8000, 0x7FFFFF], np.uint32)
    exponents = np.arange(512, dtype=np.uint32) << 23     # the sign bit is the 9th
    return (exponents[:, None] | mantissas[None, :]).reshape(-1).view(F32)


#: :func:`probe`'s verdicts: the reorder gives ``astype``'s bits on every input; or on every
#: input but float32 subnormals (each result is then checked, :func:`flushed`).
EXACT, FLUSHES_SUBNORMALS = "exact", "flushes subnormals"


def probe(cache: ReorderCache, src: np.dtype, dst: np.dtype) -> str | None:
    """Whether this library's reorder from ``src`` to ``dst`` gives ``astype``'s bits on
    every one of :func:`special_values` (a NaN may lose its payload, not its sign): EXACT; on
    all of them but the float32 subnormals: FLUSHES_SUBNORMALS; None where it does not."""
    x = special_values(src)
    got = np.empty(x.shape, dst)
    try:
        cache.run(x, got, *PAIRS[(src, dst)])
    except DnnlError:
        return None
    with np.errstate(invalid="ignore", over="ignore"):   # signalling NaNs, overflow
        want = x.astype(dst)
    if same_as_astype(got, want):
        return EXACT
    if src == F32:
        normal = ~subnormals(x)
        if same_as_astype(got[normal], want[normal]):
            return FLUSHES_SUBNORMALS
    return None


def subnormals(x: np.ndarray) -> np.ndarray:
    """Which elements of the float32 array ``x`` are subnormal (zero exponent, not zero)."""
    twice = x.reshape(-1).view(np.uint32) << 1          # the sign shifted out
    return ((twice != 0) & (twice < (1 << 24))).reshape(x.shape)


def has_subnormal(x: np.ndarray, scratch: np.ndarray) -> bool:
    """Whether the C-contiguous float32 array ``x`` holds a subnormal, with ``scratch`` (a
    uint32 array of its size) as working space: its bits without the sign, less one, wrap
    zero around to the largest uint32, so a subnormal is the only value below 2**24 - 1."""
    np.left_shift(x.reshape(-1).view(np.uint32), 1, out=scratch)
    np.subtract(scratch, 1, out=scratch)
    return bool(scratch.min() < (1 << 24) - 1)


def flushed(x: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> bool:
    """Whether narrowing the float32 array ``x`` to the bfloat16 array ``out`` by a reorder
    that flushes subnormal inputs (FLUSHES_SUBNORMALS) may have flushed one: never where
    ``out`` holds no zero (a flushed subnormal is a signed zero, and every normal float32
    narrows to a nonzero bfloat16), which one pass over its 16-bit words finds; otherwise
    where ``x`` holds a subnormal. ``scratch``: uint32 working space of ``x``'s size."""
    words = scratch.view(np.uint16)[:out.size]
    np.left_shift(out.reshape(-1).view(np.uint16), 1, out=words)
    return np.count_nonzero(words) != out.size and has_subnormal(x, scratch)


def same_as_astype(got: np.ndarray, want: np.ndarray) -> bool:
    """``got`` has ``want``'s bits, except that a NaN may lose its payload (not its sign)."""
    with np.errstate(invalid="ignore", over="ignore"):
        wide_got, wide_want = got.astype(F32), want.astype(F32)
    nan = np.isnan(wide_want)
    bits = f"u{got.itemsize}"
    return bool(np.array_equal(np.isnan(wide_got), nan)
                and np.array_equal(np.signbit(wide_got), np.signbit(wide_want))
                and np.array_equal(got.view(bits)[~nan], want.view(bits)[~nan]))


#: Smaller conversions stay with the fallback: below this, a primitive call from Python (and
#: for FLUSHES_SUBNORMALS the check of its result) costs what ml_dtypes' loop takes (the "cast"
#: lines of benchmarks/kernels.py; docs/performance.md has the Zen 4 figures).
MIN_ELEMENTS = 1 << 14
#: ml_dtypes widens bfloat16 with a vectorised loop, several times faster than it narrows:
#: the reorder pays off from about 2**14 elements on one thread, 2**15 with oneDNN's second
#: OpenMP thread woken.
MIN_ELEMENTS_WIDENING = 1 << 15


class ReorderCast:
    """A ``convert(x, dtype)`` kernel: contiguous float32 <-> bfloat16 arrays of at least
    :data:`MIN_ELEMENTS` through oneDNN reorders in each direction that passes :func:`probe`
    (at its first use; where the reorder flushes subnormals, an array that holds one is
    converted again by the fallback), everything else through ``fallback`` (the ``convert``
    kernel it wraps). ``alloc(shape, dtype)`` gives the (C-contiguous, uninitialised) result
    arrays."""

    def __init__(self, fallback: Callable[[np.ndarray, Any], np.ndarray], cache: ReorderCache,
                 alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None) -> None:
        self.fallback = fallback
        self.cache = cache
        self.alloc = alloc or np.empty
        self.calls = 0  # conversions oneDNN made (for tests and diagnostics)
        #: (source, destination) dtype -> :func:`probe`'s verdict on oneDNN's reorder
        self.verdicts: dict[tuple[np.dtype, np.dtype], str | None] = {}

    @property
    def trusted(self) -> dict[tuple[np.dtype, np.dtype], bool]:
        """(source, destination) dtype -> whether the reorder converts that direction (its
        verdict is EXACT or FLUSHES_SUBNORMALS), for each direction probed."""
        return {pair: verdict is not None for pair, verdict in self.verdicts.items()}

    def _verdict(self, x: np.ndarray, dtype: np.dtype) -> tuple[tuple[str, str], bool] | None:
        """The reorder's (source, destination) types where it converts ``x``'s dtype and
        size to ``dtype`` (its layout aside), and whether its results must be checked for a
        flushed subnormal."""
        types = PAIRS.get((x.dtype, dtype))
        if types is None:
            return None
        if x.size < (MIN_ELEMENTS_WIDENING if x.dtype == BF16 else MIN_ELEMENTS):
            return None
        pair = (x.dtype, dtype)
        if pair not in self.verdicts:
            self.verdicts[pair] = probe(self.cache, *pair)
        verdict = self.verdicts[pair]
        return None if verdict is None else (types, verdict == FLUSHES_SUBNORMALS)

    def __call__(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        found = self._verdict(x, dtype)
        if found is None or not x.flags.c_contiguous:
            return self.fallback(x, dtype)
        types, check = found
        out = self.alloc(x.shape, dtype)
        self.cache.run(x.reshape(-1), out.reshape(-1), *types)
        if check and flushed(x, out, np.empty(x.size, np.uint32)):
            return self.fallback(x, dtype)
        self.calls += 1
        return out

    def bind(self, x: np.ndarray, dtype: Any) -> Callable[[np.ndarray, Any], np.ndarray]:
        """For a traced step (``mpcore.core.backend.bind_call``): conversions of arrays of
        ``x``'s dtype and size (fixed by the trace) on a reorder of their own, each call's
        layout checked (and, where the reorder flushes subnormals, its result, in working
        space of its own: a lock keeps two threads replaying at once off each other's); the
        fallback's converter (bound in turn) where this never takes them."""
        dst = np.dtype(dtype)
        found = self._verdict(x, dst)
        if found is None:
            return bind_call(self.fallback, x, dst) or self.fallback
        types, check = found
        run = self.cache.bind(x.size, *types)
        src, shape = x.dtype, x.shape
        scratch = np.empty(x.size, np.uint32) if check else None
        lock = threading.Lock()

        def bound(x: np.ndarray, dtype: Any) -> np.ndarray:
            if (x.dtype != src or x.shape != shape or not x.flags.c_contiguous
                    or (dtype is not dst and np.dtype(dtype) != dst)):
                return self(x, dtype)
            out = self.alloc(shape, dst)
            run(x, out)   # (a 1-D primitive reads any contiguous array of its length)
            if scratch is not None:
                with lock:
                    if flushed(x, out, scratch):
                        return self.fallback(x, dst)
            self.calls += 1
            return out

        return bound
