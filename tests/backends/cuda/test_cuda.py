"""The CUDA backend: rules and messages (anywhere), kernel sources (NVRTC, no GPU needed), and
the kernels themselves against the CPU backend (on a GPU: test_cuda_device.py).

The backend-generic suites (test_ops, test_gradients, ...) also run on CUDA through the
``backend`` fixture when a GPU is present; the GPU tests in test_cuda_device.py add what they
do not cover: batched 16-bit GEMMs, bit-exact casts, the device flag, the fused optimizer
kernels, image kernels and random numbers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import NUMPY_DTYPES as NP
from mpcore_cuda import (
    CudaBackend,
    TensorCoreWarning,
    check_tensor_core_dims,
    kernels,
    linalg,
    rules,
)
from mpcore_cuda.rules import compatibility_check, cuda_policy_support, device_string
from mpcore_cuda.tensor_cores import reset_warnings

import mpcore as mp
from mpcore.core.backend import OPTIONAL_KERNELS, Device
from mpcore.plugins.extras import install_command
from mpcore.plugins.settings import SettingError

# --- described devices ---------------------------------------------------------------------
P100 = Device("Tesla P100-PCIE-16GB", "NVIDIA", "gpu", "6.0")
GTX1080 = Device("NVIDIA GeForce GTX 1080", "NVIDIA", "gpu", "6.1")
V100 = Device("Tesla V100-SXM2-16GB", "NVIDIA", "gpu", "7.0")
T4 = Device("Tesla T4", "NVIDIA", "gpu", "7.5")
A100 = Device("NVIDIA A100-SXM4-40GB", "NVIDIA", "gpu", "8.0")
H100 = Device("NVIDIA H100 80GB HBM3", "NVIDIA", "gpu", "9.0")
NO_CC = Device("Radeon RX 7900", "AMD", "gpu", "")

SEE = ("See https://developer.nvidia.com/cuda-gpus for a list of GPUs and their compute "
       "capabilities.")
SUFFIX = ("If you will use compatible GPU(s) not attached to this host, e.g. by running a "
          "multi-worker model, you can ignore this warning. This message will only be logged once")


# --- availability: cheap, no CuPy import -----------------------------------------------------
def test_import_mpcore_does_not_import_cupy() -> None:
    code = ("import sys, mpcore, mpcore_cuda; b = mpcore.get_backend('cuda') "
            "if mpcore_cuda.CudaBackend().is_available() else None; "
            "[x.unavailable_reason() for x in mpcore.backends()]; "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "MPCORE_BACKEND": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_backend_is_registered_with_every_kernel() -> None:
    be = next(b for b in mp.backends() if b.name == "cuda")
    assert isinstance(be, CudaBackend) and be.priority == 300
    assert be.missing_kernels() == []
    missing_optional = [k for k in OPTIONAL_KERNELS if not callable(getattr(be, k, None))]
    # the convolutions compose im2col and a GEMM on CUDA until cuDNN's are wired (a GPU session)
    assert missing_optional == ["conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"]


def test_hidden_devices_make_it_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reason = CudaBackend().unavailable_reason()
    assert reason is not None and "no CUDA device" in reason


@pytest.mark.parametrize(("present", "found"), [
    ((), False),
    (("/dev/nvidia0",), True),
    (("/proc/driver/nvidia/gpus/0000:00:06.0",), True),
    (("/dev/dxg", "/usr/lib/wsl/lib/libcuda.so.1"), True),   # WSL2 with NVIDIA's driver
    (("/dev/dxg",), False)])                                 # WSL2, another GPU's driver
def test_device_nodes_decide_whether_a_gpu_is_there(monkeypatch: pytest.MonkeyPatch,
                                                    present: tuple[str, ...],
                                                    found: bool) -> None:
    import fnmatch

    from mpcore_cuda import devices

    monkeypatch.setattr(devices.glob, "glob",
                        lambda pattern: [p for p in present if fnmatch.fnmatch(p, pattern)])
    assert devices.no_device.__wrapped__() == (None if found else "no CUDA device")


_REASON = CudaBackend().unavailable_reason()


@pytest.mark.skipif(_REASON is None, reason="a CUDA GPU is present")
def test_unavailable_reason_and_error_without_gpu() -> None:
    assert _REASON in ("CuPy not installed", "no CUDA device") or "no CUDA device" in _REASON
    with pytest.raises(RuntimeError, match="backend 'cuda' is not available: ") as info:
        mp.set_backend("cuda")
    # the pip command only where a GPU lacks CuPy (the reason names the GPU first)
    first = str(info.value).splitlines()[0]
    assert (install_command("cuda") in first) == (_REASON == "CuPy not installed"), first


@pytest.mark.parametrize(("cupy", "gpu", "hidden", "reason"), [
    (False, True, False, "CuPy not installed"),
    (False, False, False, "no CUDA device"),
    (False, True, True, "no CUDA device (CUDA_VISIBLE_DEVICES hides every GPU)"),
    (True, False, False, "no CUDA device"),
    (True, True, False, None)])
def test_install_advice_only_where_a_gpu_lacks_cupy(monkeypatch: pytest.MonkeyPatch,
                                                    cupy: bool, gpu: bool, hidden: bool,
                                                    reason: str | None) -> None:
    from mpcore_cuda import backend as cuda_backend

    monkeypatch.setattr(cuda_backend, "cupy_missing",
                        lambda: None if cupy else "CuPy not installed")
    monkeypatch.setattr(cuda_backend, "no_device", lambda: None if gpu else "no CUDA device")
    if hidden:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    be = CudaBackend()
    assert be.unavailable_reason() == reason
    advice = install_command("cuda") if reason == "CuPy not installed" else ""
    assert be.install_advice() == advice
    if advice:
        assert advice == CudaBackend.install_hint


# --- rules: pure functions of device descriptions -----------------------------------------
@pytest.mark.parametrize(("device", "f16_fast", "bf16_fast"), [
    (P100, False, False), (GTX1080, False, False), (V100, True, False), (T4, True, False),
    (A100, True, True), (H100, True, True)])
def test_policy_rules(device: Device, f16_fast: bool, bf16_fast: bool) -> None:
    for policy in ("mixed_float16", "float16"):
        s = cuda_policy_support(policy, device.capability, (14, 0))
        assert s.supported and s.fast == f16_fast
        assert f"compute capability {device.capability}" in s.reason
        assert ("tensor cores" in s.reason) and (("< 7.0" in s.reason) != f16_fast)
    s = cuda_policy_support("mixed_bfloat16", device.capability, (14, 0))
    assert s.supported and s.fast == bf16_fast
    assert ("< 8.0" in s.reason) != bf16_fast
    for policy in ("float32", "float64"):
        assert cuda_policy_support(policy, device.capability).fast


def test_bfloat16_needs_cupy_14() -> None:
    s = cuda_policy_support("mixed_bfloat16", "9.0", (13, 6))
    assert not s.supported and not s.fast
    assert "CuPy 13.6 has no bfloat16" in s.reason and install_command("cuda") in s.reason
    assert cuda_policy_support("mixed_float16", "9.0", (13, 6)).fast
    assert cuda_policy_support("mixed_bfloat16", "9.0", None).fast  # version unknown
    ok, text = compatibility_check("mixed_bfloat16", [H100], (13, 6))
    assert not ok and "CuPy 13.6" in text


def test_rule_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match=r"valid names: .*mixed_float16"):
        cuda_policy_support("mixed_float4", "8.0")   # mixed_float8 is a policy now
    with pytest.raises(ValueError, match=r"looks like '8\.0'"):
        cuda_policy_support("mixed_float16", "eight")
    s = cuda_policy_support("mixed_float16", "")
    assert not s.supported and "no CUDA compute capability" in s.reason
    assert rules.parse_capability((8, 6)) == (8, 6) and rules.parse_capability("3.10") == (3, 10)


def test_gemm16_route_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPCORE_CUDA_GEMM16", raising=False)
    assert linalg.gemm16_route() == "cupy"
    monkeypatch.setenv("MPCORE_CUDA_GEMM16", " CUBLAS ")
    assert linalg.gemm16_route() == "cublas"
    monkeypatch.setenv("MPCORE_CUDA_GEMM16", "cutlass")
    with pytest.raises(SettingError, match=r"^MPCORE_CUDA_GEMM16='cutlass' is not valid; valid "
                                           r"values: cupy, cublas$"):
        linalg.gemm16_route()


def test_message_one_fast_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [T4])
    assert ok
    header = "Mixed precision compatibility check (mixed_float16): OK"
    assert f"{header}\n{text}" == (
        "Mixed precision compatibility check (mixed_float16): OK\n"
        "Your GPU will likely run quickly with dtype policy mixed_float16 as it has compute "
        "capability of at least 7.0. Your GPU: Tesla T4, compute capability 7.5")


def test_message_several_fast_gpus() -> None:
    ok, text = compatibility_check("mixed_float16", [V100, A100, H100])
    assert ok and text == ("Your GPUs will likely run quickly with dtype policy mixed_float16 as "
                           "they all have compute capability of at least 7.0")


def test_message_one_slow_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [P100])
    assert not ok and text == (
        "Your GPU may run slowly with dtype policy mixed_float16 because it does not have "
        "compute capability of at least 7.0. Your GPU:\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)


def test_message_several_slow_gpus_merges_identical_lines() -> None:
    ok, text = compatibility_check("mixed_float16", [GTX1080, GTX1080, GTX1080, P100])
    assert not ok and text == (
        "Your GPUs may run slowly with dtype policy mixed_float16 because they do not have "
        "compute capability of at least 7.0. Your GPUs:\n"
        "  NVIDIA GeForce GTX 1080, compute capability 6.1 (x3)\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)


def test_message_some_of_several_slow() -> None:
    ok, text = compatibility_check("mixed_float16", [V100, V100, P100])
    assert not ok and text == (
        "Some of your GPUs may run slowly with dtype policy mixed_float16 because they do not "
        "all have compute capability of at least 7.0. Your GPUs:\n"
        "  Tesla V100-SXM2-16GB, compute capability 7.0 (x2)\n"
        "  Tesla P100-PCIE-16GB, compute capability 6.0\n" + SEE + "\n" + SUFFIX)
    # fast GPUs are listed first, then the slow ones (as in the guide's check)
    ok, text = compatibility_check("mixed_float16", [P100, H100])
    assert text.splitlines()[1:3] == ["  NVIDIA H100 80GB HBM3, compute capability 9.0",
                                      "  Tesla P100-PCIE-16GB, compute capability 6.0"]


def test_message_gpu_without_compute_capability() -> None:
    ok, text = compatibility_check("mixed_float16", [NO_CC])
    assert not ok
    assert text.splitlines()[1] == ("  Radeon RX 7900, no compute capability (probably not an "
                                    "Nvidia GPU)")
    assert device_string(Device("", capability="")) == (
        "Unknown GPU, no compute capability (probably not an Nvidia GPU)")


def test_message_no_gpu() -> None:
    ok, text = compatibility_check("mixed_float16", [])
    assert not ok and text == (
        "The dtype policy mixed_float16 may run slowly because this machine does not have a "
        "GPU. Only Nvidia GPUs with compute capability of at least 7.0 run quickly with "
        "mixed_float16.\n" + SUFFIX)


def test_message_bfloat16_uses_8_0() -> None:
    ok, text = compatibility_check("mixed_bfloat16", [A100])
    assert ok and text.endswith("at least 8.0. Your GPU: NVIDIA A100-SXM4-40GB, compute "
                                "capability 8.0")
    ok, text = compatibility_check("mixed_bfloat16", [T4, A100])
    assert not ok and text.startswith("Some of your GPUs may run slowly with dtype policy "
                                      "mixed_bfloat16")
    assert compatibility_check("float32", [P100]) == (True, "float32 runs natively on CUDA GPUs")


# --- the tensor-core tip ----------------------------------------------------------------------
def test_tensor_core_tip_warns_once_per_layer() -> None:
    reset_warnings()
    with pytest.warns(TensorCoreWarning, match=r"'dense_1': units=4095 not a multiple of 8"):
        assert check_tensor_core_dims("dense_1", {"units": 4095, "inputs": 784},
                                      "mixed_float16") == ["units=4095"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_tensor_core_dims("dense_1", {"units": 4095, "inputs": 784},
                                      mp.Policy("mixed_float16")) == ["units=4095"]
        assert check_tensor_core_dims("dense_2", {"units": 4096}, "mixed_float16") == []
        assert check_tensor_core_dims("dense_3", [10], "mixed_bfloat16") == []
        assert check_tensor_core_dims("dense_4", [10], "float32") == []
        mp.get_backend("cpu").layer_hint("dense_5", {"units": 10}, "mixed_float16")
    with pytest.warns(TensorCoreWarning, match="'conv': filters=12, channels=3"):
        CudaBackend().layer_hint("conv", {"filters": 12, "channels": 3}, "mixed_float16")
    with pytest.warns(TensorCoreWarning, match="dim0=10"):
        check_tensor_core_dims("logits", [10], "float16")
    reset_warnings()


# --- the backend's Python, checked where no GPU runs it ------------------------------------
def test_no_dtype_object_is_called() -> None:
    """The first GPU run's defect: ``I64(n)`` called a NumPy dtype object (``np.dtype`` is not
    callable; its ``.type`` is) in every launch that passed a count. No CPU test reaches a
    launch, so the sources are checked: the dtype constants of mpcore_xp are never called."""
    import ast
    from pathlib import Path

    import mpcore_cuda
    import mpcore_nccl
    import mpcore_xp.dtypes

    constants = {name for name, value in vars(mpcore_xp.dtypes).items()
                 if isinstance(value, np.dtype)}
    assert {"F16", "BF16", "F32", "F64", "I64"} <= constants
    calls = []
    for package in (mpcore_cuda, mpcore_nccl):     # the code only a GPU runs
        paths = sorted(Path(package.__file__).parent.glob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func    # I64(n), mpcore_xp.I64(n), DTYPES["int64"](n)
                if ((isinstance(f, ast.Name) and f.id in constants)
                        or (isinstance(f, ast.Attribute) and f.attr in constants)
                        or (isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name)
                            and f.value.id == "DTYPES")):
                    calls.append(f"{path.name}:{node.lineno} calls {ast.unparse(f)}(...)")
    assert not calls, "a dtype object is not callable (use its .type, or np.int64):\n" + \
        "\n".join(calls)


#: kernels.cu's scalar parameter types and the NumPy scalar each must be passed as (CuPy
#: passes a Python int as a 64-bit int and a float as a double, whatever the kernel expects).
SCALARS = {"i64": "int64", "u64": "uint64", "int": "int32", "float": "float32",
           "double": "float64"}


def _kernel_parameters() -> dict[str, list[str]]:
    """Each kernel of kernels.cu: its parameters, a scalar's NumPy type or "pointer"."""
    found = {}
    for name, params in re.findall(r"__global__ void (\w+)\(([^)]*)\)", kernels.SOURCE):
        kinds = []
        for param in (p.strip() for p in params.split(",")):
            base = " ".join(param.split()[:-1]).replace("const ", "")
            kinds.append("pointer" if "*" in param else SCALARS[base])
        found[name] = kinds
    return found


def _argument_kind(node: Any) -> set[str]:
    """What a launch argument passes: a NumPy scalar's type, or "array" (anything else:
    a device array or a pointer); a conditional passes either branch's."""
    import ast

    if isinstance(node, ast.IfExp):
        return _argument_kind(node.body) | _argument_kind(node.orelse)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "np"):
        return {node.func.attr}
    return {"array"}


def test_kernel_launches_pass_the_scalar_types_the_kernels_declare() -> None:
    """A launch's arguments against kernels.cu's parameters (no GPU needed): a scalar
    parameter gets the NumPy scalar of its type, a pointer an array (or np.uint64(0) for a
    null pointer). A wrong width would be read as garbage, silently."""
    import ast
    from pathlib import Path

    import mpcore_cuda

    params = _kernel_parameters()
    checked, problems = 0, []
    for path in sorted(Path(mpcore_cuda.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # _k.function("name" or _k.template("name", ...))(grid, block, (args...))
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                    and isinstance(node.func.func, ast.Attribute)
                    and node.func.func.attr == "function" and len(node.args) == 3
                    and isinstance(node.args[2], ast.Tuple)):
                continue
            target = node.func.args[0]
            if isinstance(target, ast.Call):
                target = target.args[0]
            if not isinstance(target, ast.Constant):
                continue
            args = node.args[2].elts
            if any(isinstance(a, ast.Starred) for a in args):
                continue      # a variable count (the multi-tensor and image kernels)
            where = f"{path.name}:{node.lineno} {target.value}"
            want = params[target.value]
            if len(args) != len(want):
                problems.append(f"{where}: {len(args)} arguments for {len(want)} parameters")
                continue
            for i, (arg, kind) in enumerate(zip(args, want)):
                got = _argument_kind(arg)
                ok = (got <= {"array", "uint64"} and "array" in got if kind == "pointer"
                      else got == {kind})
                if not ok:
                    problems.append(f"{where} argument {i}: {ast.unparse(arg)} for a {kind}")
            checked += 1
    assert checked >= 12 and not problems, "\n".join(problems)


# --- kernel sources: consistent, and compiled by NVRTC where it is installed ---------------
_GLOBAL = re.compile(r"__global__\s+void\s+(\w+)\s*\(")


def test_kernel_sources_are_complete_and_used() -> None:
    defined = set(_GLOBAL.findall(kernels.SOURCE))
    instantiated = {e.split("<", 1)[0] for e in kernels.name_expressions()}
    assert instantiated | set(kernels.PLAIN_KERNELS) == defined
    assert "#include" not in kernels.SOURCE  # compiles with no CUDA headers at all
    # the modules that launch kernels: every one of the package but kernels.py itself
    package = os.path.dirname(kernels.__file__)
    backend_src = ""
    for name in sorted(os.listdir(package)):
        if name.endswith(".py") and name != "kernels.py":
            with open(os.path.join(package, name), encoding="utf-8") as f:
                backend_src += f.read()
    launched = set(re.findall(r'_k\.(?:template|function)\(\s*"(\w+)"', backend_src))
    assert launched <= defined
    assert {name for name in defined if f'"{name}"' in backend_src} == defined  # all launched


def _nvrtc() -> tuple[Any, str | None]:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # ImportError, or the library cannot be loaded
        return None, (f"NVRTC is not usable here ({type(exc).__name__}: {str(exc)[:80]}); "
                      'pip install "cupy-cuda12x>=14" nvidia-cuda-nvrtc-cu12')
    return nvrtc, None


@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_90"])
def test_kernels_compile_with_nvrtc(arch: str) -> None:
    nvrtc, why = _nvrtc()
    if nvrtc is None:
        pytest.skip(why or "")
    major = nvrtc.getVersion()[0]
    if arch == "sm_70" and major >= 13:
        pytest.skip(f"NVRTC {major} no longer targets Volta (sm_70)")
    prog = nvrtc.createProgram(kernels.SOURCE, "kernels.cu", [], [])
    try:
        names = kernels.name_expressions()
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *kernels.OPTIONS])
        except Exception:
            pytest.fail(f"{arch}: {nvrtc.getProgramLog(prog)}")
        log = nvrtc.getProgramLog(prog)
        problems = [line for line in log.splitlines()
                    if line.strip() and "are deprecated" not in line]
        assert problems == [], log
        assert len(nvrtc.getCUBIN(prog)) > 0
        for name in names:
            assert nvrtc.getLoweredName(prog, name)
    finally:
        nvrtc.destroyProgram(prog)


# --- cuBLAS arguments and CuPy's type resolution: checked without a device ------------------
def _cublas_strided_gemm(transa: int, transb: int, m: int, n: int, k: int, a: np.ndarray,
                         lda: int, stride_a: int, b: np.ndarray, ldb: int, stride_b: int,
                         ldc: int, stride_c: int, batch: int) -> np.ndarray:
    """What cublasGemmStridedBatchedEx computes (alpha 1, beta 0): column-major matrices read
    from flat buffers through their leading dimensions and batch strides."""
    assert lda >= max(1, k if transa else m) and ldb >= max(1, n if transb else k)
    assert ldc >= max(1, m)

    def matrix(buf: np.ndarray, offset: int, ld: int, rows: int, cols: int) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(buf[offset:], (rows, cols),
                                               (buf.itemsize, ld * buf.itemsize))

    c = np.full(stride_c * batch, np.nan)
    for i in range(batch):
        op_a = matrix(a, i * stride_a, lda, k, m).T if transa else matrix(a, i * stride_a,
                                                                          lda, m, k)
        op_b = matrix(b, i * stride_b, ldb, n, k).T if transb else matrix(b, i * stride_b,
                                                                          ldb, k, n)
        out = matrix(c, i * stride_c, ldc, m, n)
        np.copyto(np.lib.stride_tricks.as_strided(c[i * stride_c:], out.shape, out.strides),
                  op_a @ op_b)
    return c


@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True),
                                        (True, True)])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_strided_gemm_args_compute_the_row_major_product(ta: bool, tb: bool,
                                                         batch: tuple[int, ...]) -> None:
    from mpcore_cuda.linalg import strided_gemm_args

    rng = np.random.default_rng(0)
    a = rng.standard_normal((*batch, 7, 5) if ta else (*batch, 5, 7))
    b = rng.standard_normal((*batch, 3, 7) if tb else (*batch, 7, 3))
    transa, transb, m, n, k, lda, sa, ldb, sb, ldc, sc, count = strided_gemm_args(
        a.shape, b.shape, ta, tb)
    # cuBLAS's A is b and its B is a, both read from their C-contiguous buffers
    c = _cublas_strided_gemm(transa, transb, m, n, k, b.ravel(), lda, sa, a.ravel(), ldb, sb,
                             ldc, sc, count)
    want = np.swapaxes(a, -1, -2) if ta else a
    want = want @ (np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(c.reshape(want.shape), want, rtol=1e-12)
    assert (m, n, k) == (3, 5, 7)


def _cupy_dispatch() -> tuple[Any, Any]:
    """cupy and its scalar wrapper, or a skip: CuPy's ufunc type resolution runs on the host."""
    try:
        import cupy
        from cupy._core import _scalar
    except Exception as exc:  # not installed, or no CUDA libraries to load
        pytest.skip(f"CuPy is not importable here ({type(exc).__name__})")
    return cupy, _scalar


def _unbacked(cupy: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    # An ndarray over device memory that is never touched: enough for type resolution, which
    # needs no GPU. Nothing here launches a kernel.
    memory = cupy.cuda.UnownedMemory(1 << 20, 4096, None, 0)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


def _resolved(cupy: Any, scalar: Any, ufunc: Any, *args: Any) -> Any:
    """The output dtype CuPy's ufunc picks for ``args`` (its own resolution code)."""
    ins = [a if isinstance(a, cupy.ndarray) else scalar.CScalar(a) for a in args]
    return ufunc._ops.guess_routine(ufunc.name, {}, ins, None, None).out_types[0]


BINARY_UFUNCS = {"add": "add", "subtract": "subtract", "multiply": "multiply",
                 "divide": "true_divide", "power": "power", "maximum": "maximum",
                 "minimum": "minimum", "less": "less", "equal": "equal",
                 "greater_equal": "greater_equal", "logical_and": "logical_and"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("value", [2.5, 3, True])
def test_scalar_operands_keep_the_array_dtype(dtype: str, value: Any) -> None:
    from mpcore_cuda.elementwise import operands as _operands

    cupy, scalar = _cupy_dispatch()
    x = _unbacked(cupy, (4,), NP[dtype])
    for name, fn in BINARY_UFUNCS.items():
        ufunc = getattr(cupy, fn)
        want = np.dtype(bool) if name in ("less", "equal", "greater_equal",
                                          "logical_and") else np.dtype(NP[dtype])
        assert _resolved(cupy, scalar, ufunc, *_operands(x, value)) == want, name
        assert _resolved(cupy, scalar, ufunc, *_operands(value, x)) == want, name
    if dtype != "bfloat16":  # only bfloat16 needs the conversion
        assert _operands(x, value)[1] is value


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_where_selects_in_the_operand_dtype(dtype: str) -> None:
    import cupy._sorting.search as search
    from mpcore_cuda.elementwise import select_operands as _select_operands

    cupy, scalar = _cupy_dispatch()
    cond = _unbacked(cupy, (4,), np.bool_)
    x, y = _unbacked(cupy, (4,), NP[dtype]), _unbacked(cupy, (1,), NP[dtype])
    a, b, view = _select_operands(x, y)
    got = _resolved(cupy, scalar, search._where_ufunc, cond, a, b)
    assert (got if view is None else np.dtype(view)) == np.dtype(NP[dtype])
    assert got.itemsize == np.dtype(NP[dtype]).itemsize  # a bit-exact select, no conversion
