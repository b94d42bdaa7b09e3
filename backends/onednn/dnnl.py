"""A small ctypes binding of oneDNN's C API: what cached matmul and binary primitives need.

oneDNN ships no Python bindings, and the wheels on PyPI ship ``libdnnl.so`` without headers, so
the few C declarations used here are written out by hand (oneDNN v3 C API: opaque memory
descriptors, ``dnnl_matmul_primitive_desc_create``). Nothing here knows about mpcore tensors:
:class:`Library` finds and loads the library and opens a CPU engine, :class:`PrimitiveCache`
keeps primitives by problem and runs them on NumPy arrays (its subclasses: the matmul's in
matmul.py, the binary passes' in elementwise.py, the reorders' in creation.py).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from mpcore_xp import F16 as _F16
from mpcore_xp import F32 as _F32

from mpcore.plugins.extras import install_command

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
# DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS (dnnl_types.h)
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS = 129, 145, 161
# dnnl_prop_kind_t, dnnl_alg_kind_t, dnnl_query_t (memory descriptors), dnnl_format_tag_any
PROP_FORWARD_TRAINING = 64   # (the backward primitives take no prop kind)
ALG_CONVOLUTION_DIRECT = 0x1
QUERY_WEIGHTS_MD, QUERY_DIFF_WEIGHTS_MD = 131, 132
FORMAT_TAG_ANY = 1
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
        # (pd, engine, prop_kind, alg_kind, src, weights, bias, dst, strides, dilates,
        #  padding_l, padding_r, attr)
        "dnnl_convolution_forward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, ctypes.c_int, _vp, _vp, _vp, _vp, i64p,
            i64p, i64p, i64p, _vp],
        # (pd, engine, alg_kind, diff_src, weights, diff_dst, strides, dilates, padding_l,
        #  padding_r, hint_fwd_pd, attr)
        "dnnl_convolution_backward_data_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, i64p, i64p, i64p, i64p, _vp,
            _vp],
        # (pd, engine, alg_kind, src, diff_weights, diff_bias, diff_dst, strides, dilates,
        #  padding_l, padding_r, hint_fwd_pd, attr)
        "dnnl_convolution_backward_weights_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, _vp, i64p, i64p, i64p, i64p,
            _vp, _vp],
        # (pd, engine, prop_kind, src, dst, epsilon, flags, attr)
        "dnnl_batch_normalization_forward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, ctypes.c_float, ctypes.c_uint,
            _vp],
        # (pd, engine, prop_kind, diff_src, diff_dst, src, epsilon, flags, hint_fwd_pd, attr)
        "dnnl_batch_normalization_backward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, ctypes.c_float,
            ctypes.c_uint, _vp, _vp],
        # (pd, engine, prop_kind, src, dst, stat, epsilon, flags, attr)
        "dnnl_layer_normalization_forward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, ctypes.c_float,
            ctypes.c_uint, _vp],
        # (pd, engine, prop_kind, diff_src, diff_dst, src, stat, epsilon, flags, hint_fwd_pd,
        #  attr)
        "dnnl_layer_normalization_backward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, _vp, ctypes.c_float,
            ctypes.c_uint, _vp, _vp],
        "dnnl_memory_desc_create_with_tag": [ctypes.POINTER(_vp), ctypes.c_int, i64p,
                                             ctypes.c_int, ctypes.c_int],
        # (pd, engine, prop_kind, alg_kind, src, dst, alpha, beta, attr)
        "dnnl_eltwise_forward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, ctypes.c_int, _vp, _vp, ctypes.c_float,
            ctypes.c_float, _vp],
        # (pd, engine, alg_kind, diff_src, diff_dst, data (src), alpha, beta, hint_fwd_pd, attr)
        "dnnl_eltwise_backward_primitive_desc_create": [
            ctypes.POINTER(_vp), _vp, ctypes.c_int, _vp, _vp, _vp, ctypes.c_float,
            ctypes.c_float, _vp, _vp],
    }
    for name, argtypes in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.dnnl_primitive_desc_query_md.argtypes = [_vp, ctypes.c_int, ctypes.c_int]
    lib.dnnl_primitive_desc_query_md.restype = _vp
    lib.dnnl_memory_desc_get_size.argtypes = [_vp]
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    lib.dnnl_memory_desc_equal.argtypes = [_vp, _vp]
    lib.dnnl_memory_desc_equal.restype = ctypes.c_int
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
    the lock that serialises the calls that rebind those memory objects. ``pointed`` holds,
    per memory object, a weak reference to the array it points at (the same array again, a
    variable or a recycled buffer, needs no new data handle); ``scratch_at`` the scratchpad's
    address."""

    primitive: Any
    pd: Any
    descs: list[Any]
    mems: list[Any]
    args: Any
    impl: str
    lock: threading.Lock
    scratch_mem: Any = None
    scratch_bytes: int = 0
    pointed: list[Any] = field(init=False)
    scratch_at: int | None = None

    def __post_init__(self) -> None:
        self.pointed = [None] * len(self.mems)


class PrimitiveCache:
    """Primitives kept by problem key, the least recently used evicted past ``max_entries``.
    Subclasses create the entries; a cached call is one ``dnnl_primitive_execute``."""

    def __init__(self, library: Library, max_entries: int) -> None:
        self.library = library
        self.max_entries = max_entries
        self._entries: OrderedDict[Any, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._scratch = threading.local()
        self.hits = 0
        self.misses = 0

    def _scratch_address(self, nbytes: int) -> int:
        """The address of this thread's scratchpad buffer (oneDNN's user scratchpad mode), at
        least ``nbytes`` long: grown to the largest need and kept, so a call takes no memory
        from the allocator."""
        scratch = self._scratch
        if getattr(scratch, "size", -1) < nbytes:
            buf = np.empty(nbytes + _SCRATCH_ALIGN, np.uint8)
            address = buf.ctypes.data
            scratch.buf, scratch.size = buf, nbytes
            scratch.address = address + (-address) % _SCRATCH_ALIGN
        return scratch.address  # type: ignore[no-any-return]

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
        scratchpad at ``scratch_address``, run it, and wait for it. A memory object already
        pointing at the same array object keeps its handle (reading an address and setting a
        handle through ctypes cost as much as the GEMM of a small layer: benchmarks/kernels.py
        "bound_ms"): a dead array's weak reference no longer matches, so its successor's handle
        is set afresh. This requires that no operand is resized in place
        (``ndarray.resize``, the one way an array's data moves; nothing here does)."""
        lib = self.library.lib
        with entry.lock:
            pointed = entry.pointed
            for i, arr in enumerate(arrays):
                ref = pointed[i]
                if ref is None or ref() is not arr:
                    _check(lib.dnnl_memory_set_data_handle(entry.mems[i], arr.ctypes.data),
                           "dnnl_memory_set_data_handle")
                    pointed[i] = _weak(arr)
            if entry.scratch_mem is not None and entry.scratch_at != scratch_address:
                _check(lib.dnnl_memory_set_data_handle(entry.scratch_mem, scratch_address),
                       "dnnl_memory_set_data_handle")
                entry.scratch_at = scratch_address
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


def _weak(arr: np.ndarray) -> Any:
    try:
        return weakref.ref(arr)
    except TypeError:              # (not an ndarray: never taken for the same array again)
        return None


def kernel_table(owner: Any, names: tuple[str, ...], role: str) -> dict[str, Callable[..., Any]]:
    """``owner``'s kernel methods ``names`` as plain functions for a kernel set, each carrying
    ``cache`` (its primitives: what the tests count to see that oneDNN ran) and, under
    ``role``, the owner itself."""
    out: dict[str, Callable[..., Any]] = {}
    for name in names:
        method = getattr(owner, name)

        def kernel(*args: Any, _method: Callable[..., Any] = method) -> Any:
            return _method(*args)

        kernel.__name__ = kernel.__qualname__ = name
        kernel.__doc__ = method.__doc__
        kernel.cache = owner.cache  # type: ignore[attr-defined]
        setattr(kernel, role, owner)
        out[name] = kernel
    return out


def float16_as_float32(dtypes: Any, *arrays: Any) -> bool:
    """Whether a float16 problem runs on a float32 primitive: every operand float16 and
    float32 among the ``dtypes`` the plugin chose. CPUs without avx512_fp16 have no float16
    primitives, and the composites or NumPy kernels would read float16 element by element:
    the operands are widened and the result rounded once to float16 (through the backend's
    vectorised cast), as the GEMMs treat float16."""
    return _F32 in dtypes and all(a.dtype == _F16 for a in arrays)


def run_or_remember(failures: dict[tuple[Any, ...], str], key: tuple[Any, ...],
                    run: Callable[[], Any], what: str, instead: str) -> Any:
    """``run()`` for the problem ``key`` (its first entry names the kernel), or None where
    oneDNN failed on that problem before: a DnnlError is logged once to the ``mpcore`` logger
    (``what`` failed, the problem takes ``instead``) and kept in ``failures``, never retried,
    never fatal."""
    if key in failures:
        return None
    try:
        return run()
    except DnnlError as exc:
        failures[key] = str(exc)
        logging.getLogger("mpcore").warning(
            "oneDNN %s failed for %s (%s); that problem uses the %s instead", what, key[1:],
            exc, instead)
        return None
