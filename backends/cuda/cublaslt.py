"""Real FP8 GEMMs through cuBLASLt, which CuPy does not wrap: ctypes to the ``libcublasLt`` the
CUDA wheels (or a toolkit) ship, its constants read from its headers (:mod:`.lt_header`).

:class:`Fp8Gemm` computes the row-major ``y (M, N) = x (M, K) @ wt (N, K)^T`` from FP8 codes
(uint8 CuPy arrays, K-contiguous rows), the TN layout of :func:`.fp8_gemm.tn_layouts`: compute
type 32F, scale type 32F, ``y`` in bfloat16 or float32, the dequantisation scale as a device
pointer (A's scale: ``(1/scale_x) * (1/scale_w)``, the float32 the emulated GEMM multiplies by;
B's: 1.0), a 32 MiB workspace (cuBLAS' advice for Hopper), the algorithm from
``cublasLtMatmulAlgoGetHeuristic``, launched on CuPy's current stream. Descriptors, layouts and
algorithms are cached per (M, K, N, formats, output dtype, fast accumulation), one handle and
workspace per device, made on first use. Every status is checked and named.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import threading
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from .fp8_gemm import FP8_GEMM_ENV, fp8_gemm_choice, tn_layouts
from .lt_header import HeaderError, header_dirs, read_constants, status_names

#: Workspace per device: 32 MiB, what cuBLAS recommends for Hopper.
WORKSPACE_BYTES = 32 << 20
#: mpcore's names -> the cudaDataType_t enumerators (library_types.h).
DATA_TYPES = {"e4m3": "CUDA_R_8F_E4M3", "e5m2": "CUDA_R_8F_E5M2", "bfloat16": "CUDA_R_16BF",
              "float32": "CUDA_R_32F"}
_P = ctypes.c_void_p


class CublasLtError(RuntimeError):
    """A cuBLASLt call failed; the message names the call and the cuBLAS status."""


class LtUnavailableError(RuntimeError):
    """libcublasLt cannot be loaded; the message names every place searched."""


class _Algo(ctypes.Structure):                # cublasLtMatmulAlgo_t
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):           # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "cublasLtCreate": (ctypes.POINTER(_P),),
    "cublasLtMatmulDescCreate": (ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int),
    "cublasLtMatmulDescSetAttribute": (_P, ctypes.c_int, _P, ctypes.c_size_t),
    "cublasLtMatmulDescDestroy": (_P,),
    "cublasLtMatrixLayoutCreate": (ctypes.POINTER(_P), ctypes.c_int, ctypes.c_uint64,
                                   ctypes.c_uint64, ctypes.c_int64),
    "cublasLtMatrixLayoutDestroy": (_P,),
    "cublasLtMatmulPreferenceCreate": (ctypes.POINTER(_P),),
    "cublasLtMatmulPreferenceSetAttribute": (_P, ctypes.c_int, _P, ctypes.c_size_t),
    "cublasLtMatmulPreferenceDestroy": (_P,),
    "cublasLtMatmulAlgoGetHeuristic": (_P, _P, _P, _P, _P, _P, _P, ctypes.c_int,
                                       ctypes.POINTER(_Heuristic), ctypes.POINTER(ctypes.c_int)),
    "cublasLtMatmul": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.POINTER(_Algo),
                       _P, ctypes.c_size_t, _P),
}


def library_candidates() -> list[tuple[str, str]]:
    """(where, path or soname) to try, in order: cuda-pathfinder (how CuPy 14 finds the CUDA
    libraries), the ``nvidia.cublas`` wheel's ``lib/`` (CUDA 12) and ``nvidia/cu13/lib``
    (CUDA 13), ``$CUDA_PATH``/``$CUDA_HOME``, then the system loader's search path."""
    out: list[tuple[str, str]] = []
    if importlib.util.find_spec("cuda.pathfinder") is not None:
        out.append(("cuda-pathfinder", "cublasLt"))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cublas/lib", "cu13/lib", "cu12/lib"):
            out += [(f"the nvidia wheels ({root})", p)
                    for p in sorted(glob.glob(os.path.join(root, sub, "libcublasLt.so.*")))]
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            out += [(f"${var}", p) for p in sorted(glob.glob(
                os.path.join(os.environ[var], "lib*", "libcublasLt.so*")))]
    found = ctypes.util.find_library("cublasLt")
    out += [("the system loader", name) for name in
            dict.fromkeys([*([found] if found else []), "libcublasLt.so.13", "libcublasLt.so.12"])]
    return out


def load_library() -> tuple[ctypes.CDLL, str]:
    """The first candidate that loads: (library, its path); LtUnavailableError naming every
    attempt and why it failed."""
    tried = []
    for where, what in library_candidates():
        try:
            if where == "cuda-pathfinder":
                from cuda import pathfinder

                what = pathfinder.load_nvidia_dynamic_lib(what).abs_path
            return ctypes.CDLL(what), str(what)
        except Exception as exc:  # any failure: the next candidate
            tried.append(f"{where}: {what} ({type(exc).__name__}: {str(exc)[:120]})")
    raise LtUnavailableError("libcublasLt not found; tried " + ("; ".join(tried) or "nothing")
                             + ". It ships with the CUDA wheels: pip install nvidia-cublas-cu12 "
                             "(or CuPy's [ctk] extra)")


class Library:
    """The loaded cuBLASLt: its prototypes, its version and the header constants."""

    def __init__(self, cdll: ctypes.CDLL, path: str, constants: dict[str, int]) -> None:
        self.cdll, self.path, self.c = cdll, path, constants
        for name, args in _PROTOTYPES.items():
            fn = getattr(cdll, name)
            fn.argtypes, fn.restype = list(args), ctypes.c_int
        cdll.cublasLtGetVersion.restype = ctypes.c_size_t
        self.version = int(cdll.cublasLtGetVersion())
        self._names = status_names(constants)

    def call(self, name: str, *args: Any) -> None:
        """``name(*args)``; a CublasLtError naming the call and the status unless it is
        CUBLAS_STATUS_SUCCESS."""
        status = getattr(self.cdll, name)(*args)
        if status != self.c["CUBLAS_STATUS_SUCCESS"]:
            raise CublasLtError(f"{name} failed: "
                                f"{self._names.get(status, 'unknown cuBLAS status')} ({status})")


_loaded: list[Library | Exception] = []
_lock = threading.Lock()


def library() -> Library:
    """The process' cuBLASLt, loaded once (a failure is remembered and raised again)."""
    with _lock:
        if not _loaded:
            try:
                cdll, path = load_library()
                _loaded.append(Library(cdll, path, read_constants(header_dirs(path))))
            except (LtUnavailableError, HeaderError, OSError, AttributeError) as exc:
                _loaded.append(exc)
    if isinstance(_loaded[0], Exception):
        raise _loaded[0]
    return _loaded[0]


def unavailable_reason() -> str | None:
    """Why FP8 GEMMs cannot go through cuBLASLt here (the switch, the library, its headers),
    or None. Loads the library (no GPU needed); a bad switch value raises."""
    if fp8_gemm_choice() == "emulated":
        return f"{FP8_GEMM_ENV}=emulated"
    try:
        library()
    except Exception as exc:  # the reason is the message
        return f"cuBLASLt unavailable: {exc}"
    return None


def set_attribute(lib: Library, desc: Any, name: str, value: Any) -> None:
    """Set the matmul descriptor attribute ``name`` to the ctypes ``value``."""
    lib.call("cublasLtMatmulDescSetAttribute", desc, lib.c[name], ctypes.byref(value),
             ctypes.sizeof(value))


def descriptors(lib: Library, m: int, k: int, n: int, x_fmt: str, w_fmt: str, out: str,
                fast_accum: bool, b_scale_ptr: int) -> list[Any]:
    """The matmul descriptor (compute 32F, scale 32F, A transposed, B not, fast accumulation
    or not, B's scale pointer) and the A, B, D layouts (:func:`.fp8_gemm.tn_layouts`) of
    ``x (M, K) @ wt (N, K)^T``. Host objects only: made without a GPU."""
    c, tn = lib.c, tn_layouts(m, k, n)
    desc = _P()
    lib.call("cublasLtMatmulDescCreate", ctypes.byref(desc), c["CUBLAS_COMPUTE_32F"],
             c["CUDA_R_32F"])
    set_attribute(lib, desc, "CUBLASLT_MATMUL_DESC_TRANSA", ctypes.c_int32(c["CUBLAS_OP_T"]))
    set_attribute(lib, desc, "CUBLASLT_MATMUL_DESC_TRANSB", ctypes.c_int32(c["CUBLAS_OP_N"]))
    set_attribute(lib, desc, "CUBLASLT_MATMUL_DESC_FAST_ACCUM", ctypes.c_int8(int(fast_accum)))
    set_attribute(lib, desc, "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER", _P(b_scale_ptr))
    out_list = [desc]
    for fmt, (rows, cols, ld) in ((w_fmt, tn.a), (x_fmt, tn.b), (out, tn.d)):
        layout = _P()
        lib.call("cublasLtMatrixLayoutCreate", ctypes.byref(layout), c[DATA_TYPES[fmt]], rows,
                 cols, ld)
        out_list.append(layout)
    return out_list


class Fp8Gemm:
    """One device's cuBLASLt FP8 GEMMs (see the module docstring)."""

    def __init__(self, lib: Library, cp: Any) -> None:
        self.lib, self.cp = lib, cp
        self._handle: Any = None
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def _setup(self) -> None:
        handle = _P()
        self.lib.call("cublasLtCreate", ctypes.byref(handle))
        self._workspace = self.cp.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self._one = self.cp.ones((), dtype=np.float32)
        self._handle = handle

    def plan(self, m: int, k: int, n: int, x_fmt: str, w_fmt: str, out: str,
             fast_accum: bool = False) -> tuple[Any, ...]:
        """(descriptor, A, B, D layouts, algorithm) of one shape, made once."""
        key = (m, k, n, x_fmt, w_fmt, out, fast_accum)
        found = self._plans.get(key)
        if found is not None:
            return found
        lib, c = self.lib, self.lib.c
        if self._handle is None:
            self._setup()
        desc, *layouts = descriptors(lib, m, k, n, x_fmt, w_fmt, out, fast_accum,
                                     self._one.data.ptr)
        pref = _P()
        lib.call("cublasLtMatmulPreferenceCreate", ctypes.byref(pref))
        try:
            size = ctypes.c_uint64(WORKSPACE_BYTES)
            lib.call("cublasLtMatmulPreferenceSetAttribute", pref,
                     c["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"], ctypes.byref(size),
                     ctypes.sizeof(size))
            result, count = _Heuristic(), ctypes.c_int(0)
            a, b, d = layouts
            lib.call("cublasLtMatmulAlgoGetHeuristic", self._handle, desc, a, b, d, d, pref, 1,
                     ctypes.byref(result), ctypes.byref(count))
        finally:
            lib.call("cublasLtMatmulPreferenceDestroy", pref)
        if count.value < 1 or result.state != c["CUBLAS_STATUS_SUCCESS"]:
            raise CublasLtError(f"cublasLtMatmulAlgoGetHeuristic found no algorithm for the FP8 "
                                f"GEMM {key} (state {result.state}): CUBLAS_STATUS_NOT_SUPPORTED")
        found = self._plans[key] = (desc, *layouts, result.algo)
        return found

    def __call__(self, x: Any, wt: Any, scale: Any, x_fmt: str, w_fmt: str,
                 out: str = "float32", fast_accum: bool = False) -> Any:
        """``x @ wt^T * scale`` in ``out``: ``x`` (M, K) and ``wt`` (N, K) C-contiguous uint8
        codes, 16-byte aligned; ``scale`` a float32 device array of shape ()."""
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        if stream.is_capturing():
            raise CublasLtError("cuBLASLt FP8 GEMMs are not captured in CUDA graphs (its "
                                "workspace and plans are the backend's, not the graph's)")
        (m, k), n = x.shape, wt.shape[0]
        y = cp.empty((m, n), dtype=DTYPES[out])
        with self._lock:
            desc, a, b, d, algo = self.plan(m, k, n, x_fmt, w_fmt, out, fast_accum)
            set_attribute(self.lib, desc, "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER",
                          _P(scale.data.ptr))
            alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
            self.lib.call("cublasLtMatmul", self._handle, desc, ctypes.byref(alpha),
                          wt.data.ptr, a, x.data.ptr, b, ctypes.byref(beta), y.data.ptr, d,
                          y.data.ptr, d, ctypes.byref(algo), self._workspace.data.ptr,
                          WORKSPACE_BYTES, stream.ptr)
        return y


_gemms: dict[int, Fp8Gemm] = {}


def device_gemm(cp: Any) -> Fp8Gemm:
    """The :class:`Fp8Gemm` of CuPy's current device (the library must load)."""
    device = cp.cuda.runtime.getDevice()
    gemm = _gemms.get(device)
    if gemm is None:
        gemm = _gemms[device] = Fp8Gemm(library(), cp)
    return gemm
