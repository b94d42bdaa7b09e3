"""A small ctypes binding of oneDNN's C API: what cached matmul and binary primitives need.

oneDNN ships no Python bindings, and the wheels on PyPI ship ``libdnnl.so`` without headers, so
the few C declarations used here are written out by hand (oneDNN v3 C API: opaque memory
descriptors, ``dnnl_matmul_primitive_desc_create``). Nothing here knows about mpcore tensors:
:class:`Library` finds and loads the library and opens a CPU engine, :class:`MatmulCache` runs
``C = op(A) @ op(B)`` on NumPy arrays with primitives cached by problem.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from mpcore.extras import install_command

# Distributions that ship libdnnl.so, in order of preference. The CPU-runtime builds come first:
# the plain ``onednn`` wheel (2025+) is built with the SYCL CPU runtime, which finds no CPU device
# unless an OpenCL adapter for SYCL is installed, and the pip wheels ship none.
DISTRIBUTIONS = ("onednn-cpu-gomp", "onednn-cpu-iomp", "onednn-cpu-tbb", "onednn")

# Runtime libraries some builds link without an rpath; they sit next to libdnnl.so in the
# environment's lib directory, so they are preloaded from there when a plain load fails.
_DEPENDENCIES = ("libgomp.so.1", "libiomp5.so", "libtbb.so.12", "libintlc.so.5", "libimf.so",
                 "libsvml.so", "libsycl.so.9", "libsycl.so.8", "libsycl.so.7")

_STATUS = {0: "success", 1: "out_of_memory", 2: "invalid_arguments", 3: "unimplemented",
           4: "last_impl_reached", 5: "runtime_error", 6: "not_required"}

_RUNTIMES = {0: "none", 1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool", 0x100: "OpenCL",
             0x200: "SYCL"}

# dnnl_cpu_isa_t values (dnnl_types.h); names as oneDNN's verbose mode prints them.
ISA_NAMES = {
    0x0: "default", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0x407: "avx2_vnni",
    0xC07: "avx2_vnni_2", 0x27: "avx512_core", 0x67: "avx512_core_vnni",
    0xE7: "avx512_core_bf16", 0x1EF: "avx512_core_fp16", 0xFEF: "avx512_core_amx",
    0x1FEF: "avx512_core_amx_fp16",
}

# dnnl_data_type_t
DATA_TYPES = {"float16": 1, "bfloat16": 2, "float32": 3}

_ENGINE_CPU = 1
_STREAM_DEFAULT = 1
_QUERY_IMPL_INFO_STR = 8
_QUERY_SCRATCHPAD_MD = 136   # dnnl_query_scratchpad_md
_SCRATCHPAD_MODE_USER = 1    # dnnl_scratchpad_mode_user
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS, _ARG_SCRATCHPAD = 1, 17, 33, 41, 80
#: Alignment of the scratchpad buffers (a page: oneDNN asks for no more than that).
_SCRATCH_ALIGN = 4096

_Dims = ctypes.c_int64 * 12
_vp = ctypes.c_void_p


class DnnlError(RuntimeError):
    """A oneDNN call failed, or the library could not be found or loaded."""


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _vp)]


def candidate_paths() -> Iterator[tuple[str, Path]]:
    """(where it came from, path) of every libdnnl.so this environment offers, best first.
    ``MPCORE_ONEDNN_LIBRARY`` names one explicitly and then is the only candidate."""
    explicit = os.environ.get("MPCORE_ONEDNN_LIBRARY", "").strip()
    if explicit:
        yield "MPCORE_ONEDNN_LIBRARY", Path(explicit)
        return
    for dist in DISTRIBUTIONS:
        try:
            files = metadata.files(dist) or []
        except metadata.PackageNotFoundError:
            continue
        libs = [f for f in files if f.name.startswith("libdnnl.so")]
        # The soname (libdnnl.so.3) is what the build links against; any of them will do.
        libs.sort(key=lambda f: (f.name.count(".") != 2, f.name))
        if libs:
            yield f"{dist} {metadata.version(dist)}", Path(str(libs[0].locate())).resolve()


def _load(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as first:
        for dep in _DEPENDENCIES:
            candidate = path.parent / dep
            if candidate.exists():
                try:
                    ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            raise DnnlError(f"cannot load {path}: {first}") from None


def _declare(lib: ctypes.CDLL) -> None:
    i64p = ctypes.POINTER(ctypes.c_int64)
    sig = {
        "dnnl_engine_create": ([ctypes.POINTER(_vp), ctypes.c_int, ctypes.c_size_t]),
        "dnnl_engine_destroy": [_vp],
        "dnnl_stream_create": [ctypes.POINTER(_vp), _vp, ctypes.c_uint],
        "dnnl_stream_wait": [_vp],
        "dnnl_stream_destroy": [_vp],
        "dnnl_memory_desc_create_with_strides": [ctypes.POINTER(_vp), ctypes.c_int, i64p,
                                                 ctypes.c_int, i64p],
        "dnnl_memory_desc_destroy": [_vp],
        "dnnl_matmul_primitive_desc_create": [ctypes.POINTER(_vp), _vp, _vp, _vp, _vp, _vp, _vp],
        "dnnl_primitive_desc_query": [_vp, ctypes.c_int, ctypes.c_int, _vp],
        "dnnl_primitive_desc_destroy": [_vp],
        "dnnl_primitive_create": [ctypes.POINTER(_vp), _vp],
        "dnnl_primitive_execute": [_vp, _vp, ctypes.c_int, ctypes.POINTER(_ExecArg)],
        "dnnl_primitive_destroy": [_vp],
        "dnnl_memory_create": [ctypes.POINTER(_vp), _vp, _vp, _vp],
        "dnnl_memory_set_data_handle": [_vp, _vp],
        "dnnl_memory_destroy": [_vp],
        "dnnl_primitive_attr_create": [ctypes.POINTER(_vp)],
        "dnnl_primitive_attr_destroy": [_vp],
        "dnnl_primitive_attr_set_post_ops": [_vp, _vp],
        "dnnl_post_ops_create": [ctypes.POINTER(_vp)],
        "dnnl_post_ops_destroy": [_vp],
        "dnnl_post_ops_append_eltwise": [_vp, ctypes.c_int, ctypes.c_float, ctypes.c_float],
        "dnnl_post_ops_append_binary": [_vp, ctypes.c_int, _vp],
        "dnnl_binary_primitive_desc_create": [ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp,
                                              _vp, _vp],
        "dnnl_primitive_attr_set_scratchpad_mode": [_vp, ctypes.c_int],
        "dnnl_reorder_primitive_desc_create": [ctypes.POINTER(_vp), _vp, _vp, _vp, _vp, _vp],
    }
    for name, argtypes in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.dnnl_primitive_desc_query_md.argtypes = [_vp, ctypes.c_int, ctypes.c_int]
    lib.dnnl_primitive_desc_query_md.restype = _vp
    lib.dnnl_memory_desc_get_size.argtypes = [_vp]
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    lib.dnnl_version.argtypes = []
    lib.dnnl_version.restype = ctypes.POINTER(_Version)
    lib.dnnl_get_effective_cpu_isa.argtypes = []
    lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int


def _check(status: int, what: str) -> None:
    if status != 0:
        raise DnnlError(f"{what} failed: dnnl_{_STATUS.get(status, str(status))}")


class Library:
    """A loaded libdnnl.so with a CPU engine and an in-order stream."""

    def __init__(self, path: Path, origin: str) -> None:
        # oneDNN >= 3.4 prints its errors to stdout by default, which would corrupt the JSON
        # lines benchmarks print; failures are reported through exceptions here instead.
        os.environ.setdefault("ONEDNN_VERBOSE", "none")
        self.path = path
        self.origin = origin
        self.lib = _load(path)
        try:
            _declare(self.lib)
        except AttributeError as exc:
            raise DnnlError(f"{path} is not a oneDNN v3 library: {exc}") from None
        v = self.lib.dnnl_version().contents
        self.version = f"{v.major}.{v.minor}.{v.patch}"
        self.cpu_runtime = _RUNTIMES.get(v.cpu_runtime, hex(v.cpu_runtime))
        if v.major < 3:
            raise DnnlError(f"oneDNN {self.version} at {path} is too old: the v3 C API is needed")
        engine = _vp()
        status = self.lib.dnnl_engine_create(ctypes.byref(engine), _ENGINE_CPU, 0)
        if status != 0:
            hint = (" (this build uses the SYCL CPU runtime and found no SYCL CPU device; "
                    "install onednn-cpu-gomp instead)" if self.cpu_runtime == "SYCL" else "")
            raise DnnlError(f"oneDNN {self.version} ({origin}) cannot open a CPU engine: "
                            f"dnnl_{_STATUS.get(status, str(status))}{hint}")
        self.engine = engine
        stream = _vp()
        _check(self.lib.dnnl_stream_create(ctypes.byref(stream), engine, _STREAM_DEFAULT),
               "dnnl_stream_create")
        self.stream = stream

    @property
    def isa(self) -> str:
        """The instruction set oneDNN dispatches to on this CPU."""
        code = self.lib.dnnl_get_effective_cpu_isa()
        return ISA_NAMES.get(code, hex(code))

    def describe(self) -> str:
        return (f"oneDNN {self.version} ({self.origin}, {self.cpu_runtime} runtime, "
                f"ISA {self.isa})")


def find_library() -> Library:
    """The first candidate library that loads and opens a CPU engine."""
    errors = []
    for origin, path in candidate_paths():
        try:
            return Library(path, origin)
        except DnnlError as exc:
            errors.append(str(exc))
    if not errors:
        raise DnnlError(f"no oneDNN library found: install it with {install_command('onednn')} "
                        f"(one of the distributions {', '.join(DISTRIBUTIONS)})")
    raise DnnlError("; ".join(errors))


def _layout(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """``(array, column_major)``: the operand in a layout oneDNN reads directly, where its
    last two axes are row- or column-major over dense batch axes. A transposed view of a
    contiguous array is the column-major case, so the backward pass's operands need no copy."""
    if x.flags.c_contiguous:
        return x, False
    if np.swapaxes(x, -1, -2).flags.c_contiguous:
        return x, True
    return np.ascontiguousarray(x), False


def _strides(shape: tuple[int, ...], column_major: bool) -> list[int]:
    """Element strides of a dense layout; NumPy's own may be arbitrary on axes of size 1."""
    strides = [0] * len(shape)
    step = 1
    order = list(range(len(shape)))[::-1]
    if column_major:
        order[0], order[1] = order[1], order[0]
    for axis in order:
        strides[axis] = step
        step *= max(shape[axis], 1)
    return strides


@dataclass
class Entry:
    """A cached primitive with its memory descriptors and its memory objects (one per
    argument, pointed at each call's arrays), the execution arguments built from them, and
    the lock that serialises the calls that rebind those memory objects."""

    primitive: Any
    pd: Any
    descs: list[Any]
    mems: list[Any]
    args: Any
    impl: str
    lock: threading.Lock
    scratch_mem: Any = None
    scratch_bytes: int = 0


class PrimitiveCache:
    """Primitives kept by problem key, the least recently used evicted past ``max_entries``.
    Subclasses create the entries; a cached call is one ``dnnl_primitive_execute``."""

    def __init__(self, library: Library, max_entries: int) -> None:
        self.library = library
        self.max_entries = max_entries
        self._entries: OrderedDict[Any, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, key: Any, create: Callable[[], Entry]) -> Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
            self.misses += 1
            entry = self._entries[key] = create()
            while len(self._entries) > self.max_entries:
                self._destroy(self._entries.popitem(last=False)[1])
            return entry

    def _desc(self, shape: tuple[int, ...], dtype: str, column_major: bool = False) -> Any:
        """A dense memory descriptor (its entry destroys it)."""
        md = _vp()
        _check(self.library.lib.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(shape), _Dims(*shape), DATA_TYPES[dtype],
            _Dims(*_strides(shape, column_major))), "dnnl_memory_desc_create_with_strides")
        return md

    def _memory(self, md: Any) -> Any:
        """A memory object for ``md`` without data (DNNL_MEMORY_NONE): its handle is set
        before each execution."""
        mem = _vp()
        _check(self.library.lib.dnnl_memory_create(ctypes.byref(mem), md, self.library.engine,
                                                   None), "dnnl_memory_create")
        return mem

    def _execute(self, entry: Entry, arrays: tuple[np.ndarray, ...],
                 scratch_address: int | None = None) -> None:
        """Point the entry's memory objects at ``arrays`` (in argument order) and its
        scratchpad at ``scratch_address``, run it, and wait for it."""
        lib = self.library.lib
        with entry.lock:
            for mem, arr in zip(entry.mems, arrays):
                _check(lib.dnnl_memory_set_data_handle(mem, arr.ctypes.data),
                       "dnnl_memory_set_data_handle")
            if entry.scratch_mem is not None:
                _check(lib.dnnl_memory_set_data_handle(entry.scratch_mem, scratch_address),
                       "dnnl_memory_set_data_handle")
            _check(lib.dnnl_primitive_execute(entry.primitive, self.library.stream,
                                              len(entry.args), entry.args),
                   "dnnl_primitive_execute")
            _check(lib.dnnl_stream_wait(self.library.stream), "dnnl_stream_wait")

    def _destroy(self, entry: Entry) -> None:
        """Destroy what an entry owns (any part may be unset after a failed creation)."""
        lib = self.library.lib
        for mem in entry.mems:
            lib.dnnl_memory_destroy(mem)
        if entry.scratch_mem:
            lib.dnnl_memory_destroy(entry.scratch_mem)
        if entry.primitive:
            lib.dnnl_primitive_destroy(entry.primitive)
        if entry.pd:
            lib.dnnl_primitive_desc_destroy(entry.pd)
        for md in entry.descs:
            lib.dnnl_memory_desc_destroy(md)

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                self._destroy(self._entries.popitem()[1])


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
        self._scratch = threading.local()

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._entries),
                "max_entries": self.max_entries,
                "scratch_bytes": max((e.scratch_bytes for e in self._entries.values()),
                                     default=0)}

    def _scratch_address(self, nbytes: int) -> int:
        """The address of this thread's scratchpad buffer, at least ``nbytes`` long."""
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.size < nbytes + _SCRATCH_ALIGN:
            buf = np.empty(nbytes + _SCRATCH_ALIGN, np.uint8)
            self._scratch.buf = buf
        address = buf.ctypes.data
        return address + (-address) % _SCRATCH_ALIGN

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
        in_dtype = _dtype_name(a.dtype)
        if _dtype_name(b.dtype) != in_dtype:
            raise ValueError(f"operands differ in dtype: {a.dtype} and {b.dtype}")
        out_shape = (*a.shape[:-1], b.shape[-1])
        bias_dtype = None
        if bias is not None:
            if bias.shape != (b.shape[-1],):
                raise ValueError(f"bias of shape {bias.shape} does not match {out_shape}")
            bias = np.ascontiguousarray(bias)
            bias_dtype = _dtype_name(bias.dtype)
        key = (a.shape, a_cm, b.shape, b_cm, in_dtype, out_dtype, bias_dtype)
        entry = self._get(key, lambda: self._create(key, out_shape))
        dtype = a.dtype if out_dtype == in_dtype else DTYPES[out_dtype]
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
