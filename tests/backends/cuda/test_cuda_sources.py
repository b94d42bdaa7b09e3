"""The CUDA backend's code, checked where no GPU runs it: the Python (no dtype object called,
kernel launches passing the scalar types the kernels declare), the kernel sources (complete,
used, compiled by NVRTC for sm_70/80/90 where it is installed), the cuBLAS strided-GEMM
arguments and CuPy's type resolution of scalar operands. Availability, rules and messages:
test_cuda.py; the kernels on a GPU: test_cuda_device.py."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pytest
from conftest import NUMPY_DTYPES as NP
from mpcore_cuda import (
    kernels,
)


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
