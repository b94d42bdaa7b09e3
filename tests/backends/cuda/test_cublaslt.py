"""cuBLASLt's FP8 GEMMs without a GPU: the header parser and the values it reads (pinned against
NVIDIA's documented ones), loading libcublasLt with ctypes, the descriptors and layouts built
by the library itself (host objects), the TN mapping of ``x @ w`` checked by simulating
cuBLAS' column-major arithmetic in NumPy, the scale, the routes and the switch, and NVRTC's
compile of the quantised transpose. What needs a GPU: test_fp8_cublaslt_device.py."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpcore_cuda import cublaslt, fp8_check, kernels
from mpcore_cuda.devices import no_device
from mpcore_cuda.float8 import CudaFloat8
from mpcore_cuda.fp8_gemm import gemm_scale, tn_layouts, tn_operands
from mpcore_cuda.lt_header import (
    NEEDED,
    HeaderError,
    find_header,
    header_dirs,
    parse_enums,
    read_constants,
)
from mpcore_xp.float8 import Float8Kernels

from mpcore.plugins.settings import SettingError

#: NVIDIA's documented values (cublasLt.h, cublas_api.h, library_types.h of CUDA 12.x/13.x).
DOCUMENTED = {
    "CUBLASLT_MATMUL_DESC_TRANSA": 3, "CUBLASLT_MATMUL_DESC_TRANSB": 4,
    "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER": 17, "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER": 18,
    "CUBLASLT_MATMUL_DESC_D_SCALE_POINTER": 20, "CUBLASLT_MATMUL_DESC_AMAX_D_POINTER": 21,
    "CUBLASLT_MATMUL_DESC_FAST_ACCUM": 25, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": 1,
    "CUBLASLT_MATRIX_LAYOUT_TYPE": 0, "CUBLASLT_MATRIX_LAYOUT_ROWS": 2,
    "CUBLASLT_MATRIX_LAYOUT_COLS": 3, "CUBLASLT_MATRIX_LAYOUT_LD": 4,
    "CUBLAS_COMPUTE_32F": 68, "CUBLAS_OP_N": 0, "CUBLAS_OP_T": 1,
    "CUBLAS_STATUS_SUCCESS": 0, "CUBLAS_STATUS_NOT_INITIALIZED": 1,
    "CUBLAS_STATUS_INVALID_VALUE": 7, "CUBLAS_STATUS_NOT_SUPPORTED": 15,
    "CUDA_R_32F": 0, "CUDA_R_16BF": 14, "CUDA_R_8F_E4M3": 28, "CUDA_R_8F_E5M2": 29,
}


def _library() -> cublaslt.Library:
    try:
        return cublaslt.library()
    except Exception as exc:  # the reason: no wheel, no headers
        pytest.skip(f"cuBLASLt not loadable here: {str(exc)[:200]} "
                    "(pip install nvidia-cublas-cu12 nvidia-cuda-runtime-cu12)")


# --- the header parser ----------------------------------------------------------------------
def test_enums_with_implicit_increments_literals_and_references() -> None:
    text = """
    /* a comment with enum { FAKE = 9 } inside */
    typedef enum cudaDataType_t {
        R_A = 2,   // two
        R_B,       /* three */
        R_C = 0x10U,
        R_D,
    #if defined(SOMETHING)
        R_IGNORED_BY_NOTHING = 99,
    #endif
        R_E = R_B,
        R_F = (1 << 5) | 1,
        R_G = -1,
        R_H
    } cudaDataType;
    typedef enum { X_FIRST, X_SECOND, X_THIRD = X_SECOND + 10ULL, X_FOURTH } named_t;
    enum { ANON = OTHER_HEADER_NAME, ANON_NEXT, ANON_SET = 4 };
    """
    enums = parse_enums(text)
    assert enums["cudaDataType_t"] == {"R_A": 2, "R_B": 3, "R_C": 16, "R_D": 17,
                                       "R_IGNORED_BY_NOTHING": 99, "R_E": 3, "R_F": 33,
                                       "R_G": -1, "R_H": 0}
    assert enums["named_t"] == {"X_FIRST": 0, "X_SECOND": 1, "X_THIRD": 11, "X_FOURTH": 12}
    # a name from a header not read: left out with what follows it implicitly
    assert list(enums.values())[2] == {"ANON_SET": 4}
    assert parse_enums(text, {"OTHER_HEADER_NAME": 7})["<anonymous 2>"] == {
        "ANON": 7, "ANON_NEXT": 8, "ANON_SET": 4}
    assert "FAKE" not in str(enums)


def test_a_missing_header_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HeaderError, match=r"cublasLt\.h not found \(searched: .*a_dir.*"
                                          r"MPCORE_CUBLASLT_INCLUDE"):
        find_header("cublasLt.h", [tmp_path / "a_dir"])
    (tmp_path / "library_types.h").write_text("typedef enum { CUDA_R_32F = 0 } cudaDataType;")
    with pytest.raises(HeaderError, match="has no CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2"):
        read_constants([tmp_path])


def test_the_search_starts_beside_the_library_and_ends_with_the_env(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "nvidia" / "cublas" / "lib" / "libcublasLt.so.12"
    lib.parent.mkdir(parents=True)
    lib.touch()
    (tmp_path / "nvidia" / "cuda_runtime" / "include").mkdir(parents=True)
    monkeypatch.setenv("MPCORE_CUBLASLT_INCLUDE", str(tmp_path / "carried"))
    dirs = header_dirs(lib)
    assert dirs[0] == tmp_path / "nvidia" / "cublas" / "include"
    assert tmp_path / "nvidia" / "cuda_runtime" / "include" in dirs
    assert dirs[-1] == tmp_path / "carried"


def test_the_installed_headers_give_the_documented_values() -> None:
    lib = _library()
    for name, value in DOCUMENTED.items():
        assert lib.c[name] == value, name
    assert {n for names in NEEDED.values() for n in names} <= set(DOCUMENTED)


# --- the library ----------------------------------------------------------------------------
def test_the_library_loads_with_ctypes() -> None:
    lib = _library()
    assert "cublasLt" in Path(lib.path).name
    assert lib.version >= 120000          # FP8 matmuls came with cuBLAS 12
    assert cublaslt.unavailable_reason() is None


def test_a_library_that_is_not_there_names_what_was_searched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cublaslt, "library_candidates",
                        lambda: [("the nvidia wheels (/nowhere)", "/nowhere/libcublasLt.so.12")])
    with pytest.raises(cublaslt.LtUnavailableError,
                       match=r"tried the nvidia wheels \(/nowhere\): /nowhere/libcublasLt\.so\.12 "
                             r"\(OSError.*pip install nvidia-cublas-cu12"):
        cublaslt.load_library()


@pytest.mark.skipif(no_device() is None, reason="a CUDA GPU is present: cublasLtCreate succeeds")
def test_a_failed_call_names_the_cublas_status() -> None:
    lib = _library()
    with pytest.raises(cublaslt.CublasLtError,
                       match=r"cublasLtCreate failed: CUBLAS_STATUS_NOT_INITIALIZED \(1\)"):
        lib.call("cublasLtCreate", ctypes.byref(ctypes.c_void_p()))


def _desc_attr(lib: cublaslt.Library, desc: Any, name: str, ctype: Any) -> int:
    fn = lib.cdll.cublasLtMatmulDescGetAttribute
    value, written = ctype(), ctypes.c_size_t()
    assert fn(desc, lib.c[name], ctypes.byref(value), ctypes.sizeof(value),
              ctypes.byref(written)) == 0
    return value.value


def _layout_attr(lib: cublaslt.Library, layout: Any, name: str, ctype: Any) -> int:
    fn = lib.cdll.cublasLtMatrixLayoutGetAttribute
    value, written = ctype(), ctypes.c_size_t()
    assert fn(layout, lib.c[name], ctypes.byref(value), ctypes.sizeof(value),
              ctypes.byref(written)) == 0
    return value.value


def test_the_library_builds_the_tn_descriptors_and_layouts() -> None:
    """Host objects: made and read back without a GPU."""
    lib = _library()
    c = lib.c
    desc, a, b, d = cublaslt.descriptors(lib, 96, 64, 48, "e5m2", "e4m3", "bfloat16", True,
                                         0x1000)
    assert _desc_attr(lib, desc, "CUBLASLT_MATMUL_DESC_TRANSA", ctypes.c_int32) == 1
    assert _desc_attr(lib, desc, "CUBLASLT_MATMUL_DESC_TRANSB", ctypes.c_int32) == 0
    assert _desc_attr(lib, desc, "CUBLASLT_MATMUL_DESC_FAST_ACCUM", ctypes.c_int8) == 1
    assert _desc_attr(lib, desc, "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER",
                      ctypes.c_uint64) == 0x1000
    read = [tuple(_layout_attr(lib, lay, f"CUBLASLT_MATRIX_LAYOUT_{f}", t) for f, t in
                  (("TYPE", ctypes.c_uint32), ("ROWS", ctypes.c_uint64),
                   ("COLS", ctypes.c_uint64), ("LD", ctypes.c_int64))) for lay in (a, b, d)]
    # A = wt: K x N (lda K), the kernel's format; B = x: K x M (ldb K); D: N x M (ldd N)
    assert read == [(c["CUDA_R_8F_E4M3"], 64, 48, 64), (c["CUDA_R_8F_E5M2"], 64, 96, 64),
                    (c["CUDA_R_16BF"], 48, 96, 48)]
    lib.call("cublasLtMatmulDescDestroy", desc)
    for layout in (a, b, d):
        lib.call("cublasLtMatrixLayoutDestroy", layout)


# --- the TN mapping, the scale --------------------------------------------------------------
def _column_major(buf: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix of leading dimension ld held in ``buf``."""
    return buf.ravel()[: ld * cols].reshape(cols, ld)[:, :rows].T


@pytest.mark.parametrize(("m", "k", "n"), [(32, 48, 16), (5, 3, 7)])
def test_tn_layouts_compute_x_at_wt_transposed(m: int, k: int, n: int) -> None:
    """cuBLAS' D = op(A) op(B) on the layouts, in NumPy, is the row-major x @ wt^T."""
    rng = np.random.default_rng(0)
    x, wt = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    tn = tn_layouts(m, k, n)
    assert (tn.transa, tn.transb) == ("T", "N") and tn.mnk == (n, m, k)
    a, b = _column_major(wt, *tn.a), _column_major(x, *tn.b)
    d = a.T @ b                                    # transa = T, transb = N
    assert d.shape == tn.d[:2] and tn.d[2] == n
    y = d.T.reshape(-1).reshape(m, n)              # D column-major, ldd N = Y row-major
    np.testing.assert_allclose(y, x @ wt.T)


def test_the_three_gemms_of_a_dense_layer() -> None:
    x, w, g = (128, 784), (784, 64), (128, 64)
    fwd = tn_operands(x, w, False, False)          # x @ w: w's codes transposed
    assert (fwd.m, fwd.k, fwd.n, fwd.transpose_x, fwd.transpose_w) == (128, 784, 64, False,
                                                                        True)
    dgrad = tn_operands(g, w, False, True)         # g @ w^T: nothing transposed
    assert (dgrad.m, dgrad.k, dgrad.n, dgrad.transpose_x, dgrad.transpose_w) == (
        128, 64, 784, False, False)
    wgrad = tn_operands(x, g, True, False)         # x^T @ g: x and g transposed
    assert (wgrad.m, wgrad.k, wgrad.n, wgrad.transpose_x, wgrad.transpose_w) == (
        784, 128, 64, True, True)
    rng = np.random.default_rng(1)
    for (sa, sb, ta, tb), tn in (((x, w, False, False), fwd), ((g, w, False, True), dgrad),
                                 ((x, g, True, False), wgrad)):
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        xs = a.T if tn.transpose_x else a
        wt = b.T if tn.transpose_w else b
        np.testing.assert_allclose(xs @ wt.T, (a.T if ta else a) @ (b.T if tb else b))


@pytest.mark.parametrize(("sa", "sb"), [(16.0, 0.25), (3.0, 7.0), (448 / 1.7, 57344 / 0.013),
                                        (1e-30, 1e-20)])
def test_the_scale_is_the_emulated_gemms_float32_multiplier(sa: float, sb: float) -> None:
    """Scales are multipliers (codes = saturate(x * scale)): cuBLASLt's A scale holds
    (1/scale_a)(1/scale_b), bit for bit the number the emulated GEMM multiplies by."""
    a, b = np.float32(sa).reshape(()), np.float32(sb).reshape(())
    emulated = Float8Kernels()
    with np.errstate(over="ignore"):
        want = (emulated._fp8_inverse(a) * emulated._fp8_inverse(b)).astype(np.float32)
    got = gemm_scale(np, a, b)
    assert got.dtype == np.float32 and got.shape == ()
    assert got.tobytes() == want.tobytes()


# --- routes and the switch ------------------------------------------------------------------
class _Fake(CudaFloat8):
    """The backend's route decision with a stand-in for CuPy's runtime."""

    def __init__(self, cc: str) -> None:
        class Runtime:
            @staticmethod
            def getDevice() -> int:  # noqa: N802  # CuPy's name
                return 0

        self.cp = type("cp", (), {"cuda": type("cuda", (), {"runtime": Runtime})})()
        self._cc = cc

    def _device_table(self) -> list[tuple[str, str, int, int]]:
        return [("GPU", self._cc, 1, 1)]


def test_routes_the_switch_and_the_log(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cublaslt, "unavailable_reason", lambda: None)
    monkeypatch.delenv("MPCORE_CUDA_FP8_GEMM", raising=False)
    assert _Fake("9.0")._fp8_route(128, 784, 64, "e4m3", "e4m3").native
    assert not _Fake("9.0")._fp8_route(128, 784, 64, "e5m2", "e5m2").native
    be = _Fake("8.0")
    with caplog.at_level(logging.INFO, logger="mpcore"):
        for _ in range(3):
            assert not be._fp8_route(128, 784, 64, "e4m3", "e4m3").native
    assert len(caplog.records) == 1 and "8.0 < 8.9" in caplog.records[0].getMessage()
    assert "fp8_matmul (128, 784) @ (784, 64)" in caplog.records[0].getMessage()
    missing = "cuBLASLt unavailable: libcublasLt not found"
    monkeypatch.setattr(cublaslt, "unavailable_reason", lambda: missing)
    route = _Fake("9.0")._fp8_route(128, 784, 64, "e4m3", "e4m3")
    assert not route.native and route.reason == f"{missing}: the GEMM runs emulated"
    monkeypatch.setenv("MPCORE_CUDA_FP8_GEMM", "cublaslt")
    with pytest.raises(RuntimeError, match="MPCORE_CUDA_FP8_GEMM=cublaslt, but cuBLASLt "
                                           "unavailable"):
        _Fake("9.0")._fp8_route(128, 784, 64, "e4m3", "e4m3")
    assert not _Fake("8.0")._fp8_route(128, 784, 64, "e4m3", "e4m3").native  # no library needed


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_CUDA_FP8_GEMM", "emulated")
    assert cublaslt.unavailable_reason() == "MPCORE_CUDA_FP8_GEMM=emulated"
    monkeypatch.setenv("MPCORE_CUDA_FP8_GEMM", "fast")
    with pytest.raises(SettingError, match="MPCORE_CUDA_FP8_GEMM='fast' is not valid; valid "
                                           "values: auto, emulated, cublaslt"):
        cublaslt.unavailable_reason()


# --- the device check's bound, the transpose kernel -----------------------------------------
def test_the_device_checks_bound() -> None:
    absprod, emulated = np.array([1.0, 100.0]), np.array([0.5, -3.0])
    got = fp8_check.bound(4096, absprod, 0.5, emulated, "bfloat16")
    acc = 2 * 4096 * 2.0 ** -24 + 2.0 ** -12
    np.testing.assert_allclose(got, acc * absprod * 0.5 + 2.0 ** -7 * np.abs(emulated))
    assert fp8_check.native_dims(96, 80, 48) and not fp8_check.native_dims(128, 784, 10)
    assert any(not fp8_check.native_dims(*s) for s in fp8_check.SHAPES)


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_the_transpose_kernel_compiles_with_nvrtc(arch: str) -> None:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC is not usable here ({type(exc).__name__}); "
                    'pip install "cupy-cuda12x>=14" nvidia-cuda-nvrtc-cu12')
    assert "transpose_u8" in kernels.PLAIN_KERNELS
    prog = nvrtc.createProgram(kernels.SOURCE, "kernels.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *kernels.OPTIONS])
        assert ".entry transpose_u8" in nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)
