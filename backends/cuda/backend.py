"""The CUDA backend: CuPy arrays, cuBLAS GEMMs, and the RawModule kernels of ``kernels.cu``.

Availability is decided without importing CuPy or opening the driver (``import mpcore`` stays
cheap on machines with and without a GPU); CuPy is imported when the backend is first used.

- Matmul: 2-D GEMMs through ``cupy.matmul`` (cuBLAS ``gemmEx``, float16/bfloat16 inputs with
  float32 accumulation, tensor cores where the GPU has them); batched (and 1x1) 16-bit GEMMs
  through cuBLAS ``gemmStridedBatchedEx`` directly, because CuPy's batched matmul upcasts
  float16 to float32 and fails on bfloat16, and its 1x1 product is a 16-bit reduction.
  Below compute capability 7.0 (float16) or 8.0 (bfloat16) the GEMM runs in float32 and
  rounds once, as the verdict says.
- Elementwise math, reductions, shapes: CuPy's ufuncs and reductions (16-bit sums and means
  accumulate in float32); relu, sigmoid, erf, casts between float32/float16/bfloat16, fused
  bias add, relu backward, softmax, sparse softmax cross-entropy (forward and backward), image
  kernels, random numbers, the multi-tensor unscale-and-check and the fused optimizer updates are
  the kernels of ``kernels.cu``.
- Host reads: no kernel here reads device memory from the host. A training step's one
  device-to-host read is the loss-scale decision, when the core converts the flag that
  :meth:`CudaBackend.unscale_and_check` returns to a Python bool
  (``mpcore.loss_scale._finite_flag``); the fused optimizer kernels read that flag on the device.
- Labels out of range in ``sparse_softmax_cross_entropy`` give NaN (as TensorFlow on GPUs),
  since raising would need a host read every step.

Needs CuPy (13 for float16; 14 for bfloat16, through ml_dtypes) and nothing else.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import math
import os
from functools import lru_cache
from typing import Any

import ml_dtypes
import numpy as np

from mpcore.backend import Backend, Device, Support
from mpcore.dtypes import ALL as ALL_DTYPES
from mpcore.extras import install_command
from mpcore.tensor import Tensor

from . import kernels as _k
from .rules import TENSOR_CORE_CAPABILITY, compatibility_check, cuda_policy_support
from .tensor_cores import check_tensor_core_dims

# NumPy's dtype for every mpcore dtype name (bfloat16 comes from ml_dtypes).
DTYPES: dict[str, Any] = {
    name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in ALL_DTYPES}
F16, BF16, F32, F64 = (DTYPES[n] for n in ("float16", "bfloat16", "float32", "float64"))
LOW = frozenset({F16, BF16})
_CTYPE = {F32: "float", F64: "double", F16: "mp_half", BF16: "mp_bf16"}
_KERNEL_FLOATS = frozenset(_CTYPE)
_CAST_FLOATS = frozenset({F32, F16, BF16})
I64 = np.int64
_BLOCK = 256
_MAX_GRID = 1 << 20  # grid-stride kernels: more blocks than this only adds scheduling cost
# cuBLAS constants (cublas_api.h, library_types.h): stable across CUDA 11-13.
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_CUDA_R = {F16: 2, BF16: 14}
_ONE = np.ones((), np.float32)   # host-pointer alpha and beta for cuBLAS
_ZERO = np.zeros((), np.float32)


@lru_cache(maxsize=1)
def _cupy_missing() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy not installed"
    return None


@lru_cache(maxsize=1)
def _no_device() -> str | None:
    # The NVIDIA kernel driver exposes one node per GPU; no node, no CUDA device.
    if not glob.glob("/dev/nvidia[0-9]*") and not glob.glob("/proc/driver/nvidia/gpus/*"):
        return "no CUDA device"
    return None


def _hidden_by_env() -> str | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return "no CUDA device (CUDA_VISIBLE_DEVICES hides every GPU)"
    return None


def _native(x: Any) -> Any:
    """The CuPy array of a flag given as a Tensor or as its native array."""
    return x._data if isinstance(x, Tensor) else x


def _grid(n: int) -> tuple[int]:
    return (max(1, min((n + _BLOCK - 1) // _BLOCK, _MAX_GRID)),)


_HOST_SCALARS = (bool, int, float, np.generic)


def _operands(a: Any, b: Any) -> tuple[Any, Any]:
    """A host scalar next to a bfloat16 array becomes a bfloat16 scalar (as on the CPU backend).

    CuPy 14 cannot apply a weak Python float to its bfloat16 loops (``numpy.result_type(0.0,
    bfloat16)`` is float64), so ``bf16_array * 2.0`` would resolve to the float32 loop and
    return float32. A Python int resolves to bfloat16 already; it is converted all the same."""
    if isinstance(b, _HOST_SCALARS) and getattr(a, "dtype", None) == BF16:
        b = BF16.type(b)
    elif isinstance(a, _HOST_SCALARS) and getattr(b, "dtype", None) == BF16:
        a = BF16.type(a)
    return a, b


def _select_operands(a: Any, b: Any) -> tuple[Any, Any, Any]:
    """``cupy.where`` operands and the dtype to view its result as: CuPy 14's where has no
    bfloat16 loop (it would select in float32), so bfloat16 values are selected as raw bits."""
    if getattr(a, "dtype", None) == BF16 and getattr(b, "dtype", None) == BF16:
        return a.view(np.uint16), b.view(np.uint16), BF16
    return a, b, None


def strided_gemm_args(a_shape: tuple[int, ...], b_shape: tuple[int, ...], transpose_a: bool,
                      transpose_b: bool) -> tuple[int, ...]:
    """cuBLAS ``gemmStridedBatchedEx`` arguments (transa, transb, m, n, k, lda, strideA, ldb,
    strideB, ldc, strideC, batchCount) for the row-major, C-contiguous ``C = op(a) @ op(b)``
    of shape (..., M, N) with inner dimension K.

    cuBLAS is column-major, and a row-major matrix is its transpose in column-major order, so
    this computes ``C^T = op(b)^T op(a)^T``: cuBLAS's A is ``b``, its B is ``a``, and its
    (m, n, k) are (N, M, K)."""
    m = a_shape[-1] if transpose_a else a_shape[-2]
    k = a_shape[-2] if transpose_a else a_shape[-1]
    n = b_shape[-2] if transpose_b else b_shape[-1]
    return (_CUBLAS_OP_T if transpose_b else _CUBLAS_OP_N,
            _CUBLAS_OP_T if transpose_a else _CUBLAS_OP_N, n, m, k,
            k if transpose_b else n, k * n, m if transpose_a else k, m * k, n, m * n,
            math.prod(a_shape[:-2]))


class CudaBackend(Backend):
    """NVIDIA GPUs through CuPy (device 0, or CuPy's current device)."""

    name = "cuda"
    priority = 300
    install_hint = install_command("cuda")

    _cupy: Any = None
    _true_flag: Any = None
    _static_devices: list[tuple[str, str, int, int]] | None = None
    _native_gemm: dict[Any, bool] | None = None

    # --- availability and devices -------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        return _hidden_by_env() or _cupy_missing() or _no_device()

    @property
    def cp(self) -> Any:
        """The cupy module, imported on first use."""
        if self._cupy is None:
            self._cupy = importlib.import_module("cupy")
        return self._cupy

    def cupy_version(self) -> tuple[int, int] | None:
        parts = str(self.cp.__version__).split(".")
        try:
            return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
        except (IndexError, ValueError):
            return None

    def _device_table(self) -> list[tuple[str, str, int, int]]:
        # getDeviceProperties needs no context; name, capability, SMs and memory are fixed.
        if self._static_devices is None:
            runtime = self.cp.cuda.runtime
            table = []
            for i in range(runtime.getDeviceCount()):
                props = runtime.getDeviceProperties(i)
                name = props["name"]
                name = name.decode() if isinstance(name, bytes) else str(name)
                table.append((name, f"{props['major']}.{props['minor']}",
                              int(props["multiProcessorCount"]), int(props["totalGlobalMem"])))
            self._static_devices = table
        return self._static_devices

    def devices(self) -> list[Device]:
        """Every visible GPU. Free memory is read only for the device this backend computes on
        (reading it elsewhere would create a CUDA context on every GPU). Empty where the backend
        is unavailable, as other backends do."""
        if self.unavailable_reason() is not None:
            return []
        current = self.cp.cuda.runtime.getDevice()
        out = []
        for i, (name, cc, sms, total) in enumerate(self._device_table()):
            free = None
            if i == current:
                free = int(self.cp.cuda.runtime.memGetInfo()[0])
            major, minor = (int(p) for p in cc.split("."))
            features = {f"{dt}_tensor_cores" for dt, need in TENSOR_CORE_CAPABILITY.items()
                        if (major, minor) >= need}
            out.append(Device(name=name, vendor="NVIDIA", kind="gpu", capability=cc,
                              features=frozenset(features), index=str(i),
                              details={"compute_capability": cc, "sm_count": sms,
                                       "memory_total": total, "memory_free": free}))
        return out

    def device(self) -> Device:
        devices = self.devices()
        if not devices:
            return super().device()  # raises, naming the backend
        current = self.cp.cuda.runtime.getDevice()
        return devices[current] if current < len(devices) else devices[0]

    def policy_support(self, policy: str, device: Device) -> Support:
        return cuda_policy_support(policy, device.capability, self.cupy_version())

    def compatibility_message(self, policy: str) -> tuple[bool, str]:
        """The guide's text, speaking of every GPU of the host."""
        return compatibility_check(policy, self.devices(), self.cupy_version())

    def layer_hint(self, layer_name: str, dims: Any, policy: Any) -> None:
        """The tensor-core tip: warn once per layer when a dimension is not a multiple of 8."""
        check_tensor_core_dims(layer_name, dims, policy)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def _gemm_native(self, dtype: Any) -> bool:
        """Whether 16-bit GEMMs of ``dtype`` run on tensor cores of the current GPU."""
        if self._native_gemm is None:
            cc = self.device().capability
            major, minor = (int(p) for p in cc.split("."))
            self._native_gemm = {F16: (major, minor) >= TENSOR_CORE_CAPABILITY["float16"],
                                 BF16: (major, minor) >= TENSOR_CORE_CAPABILITY["bfloat16"]}
        return self._native_gemm[dtype]

    # --- launching kernels.cu -----------------------------------------------------------
    def _contig(self, x: Any) -> Any:
        return self.cp.ascontiguousarray(x)

    def _flag_or_true(self, flag: Any) -> Any:
        if flag is not None:
            return _native(flag)
        if self._true_flag is None:
            self._true_flag = self.cp.ones((), dtype=np.bool_)
        return self._true_flag

    # --- host interop and creation ------------------------------------------------------
    def asarray(self, value: Any, dtype: str) -> Any:
        cp = self.cp
        dt = DTYPES[dtype]
        if isinstance(value, cp.ndarray):
            return value if value.dtype == dt else self.cast(value, dtype)
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # another device's array (PyOpenCL) through the host
        return cp.asarray(np.asarray(value, dtype=dt))

    def to_host(self, x: Any) -> np.ndarray:
        host = self.cp.asnumpy(x)
        host.flags.writeable = False  # as on the CPU: t.numpy() must not look editable
        return host

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> Any:
        if dtype == "bfloat16":  # through this backend's own cast: CuPy's bfloat16 is new
            return self.cast(self.cp.full(shape, value, dtype=F32), dtype)
        return self.cp.full(shape, value, dtype=DTYPES[dtype])

    def cast(self, x: Any, dtype: str) -> Any:
        dt = DTYPES[dtype]
        if x.dtype in _CAST_FLOATS and dt in _CAST_FLOATS and x.dtype != dt:
            x = self._contig(x)
            out = self.cp.empty(x.shape, dtype=dt)
            if x.size:
                _k.function(_k.template("cast_kernel", _CTYPE[x.dtype], _CTYPE[dt]))(
                    _grid(x.size), (_BLOCK,), (x, out, I64(x.size)))
            return out
        return x.astype(dt)

    def copy(self, x: Any) -> Any:
        return self.cp.array(x, copy=True, order="C")

    def _random(self, kernel: str, shape: tuple[int, ...], dtype: str, seed: int,
                a: float, b: float) -> Any:
        dt = DTYPES[dtype]
        kdt = dt if dt in _KERNEL_FLOATS else F32
        out = self.cp.empty(shape, dtype=kdt)
        if out.size:
            _k.function(_k.template(kernel, _CTYPE[kdt]))(
                _grid(out.size), (_BLOCK,),
                (out, I64(out.size), np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float64(a),
                 np.float64(b)))
        return out if kdt == dt else out.astype(dt)

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> Any:
        return self._random("rand_uniform", shape, dtype, seed, minval, maxval)

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> Any:
        return self._random("rand_normal", shape, dtype, seed, mean, stddev)

    # --- elementwise (CuPy ufuncs; a scalar takes the array's dtype, see _operands) -------
    def add(self, a: Any, b: Any) -> Any:
        return self.cp.add(*_operands(a, b))

    def subtract(self, a: Any, b: Any) -> Any:
        return self.cp.subtract(*_operands(a, b))

    def multiply(self, a: Any, b: Any) -> Any:
        return self.cp.multiply(*_operands(a, b))

    def divide(self, a: Any, b: Any) -> Any:
        return self.cp.true_divide(*_operands(a, b))

    def power(self, a: Any, b: Any) -> Any:
        return self.cp.power(*_operands(a, b))

    def maximum(self, a: Any, b: Any) -> Any:
        return self.cp.maximum(*_operands(a, b))

    def minimum(self, a: Any, b: Any) -> Any:
        return self.cp.minimum(*_operands(a, b))

    def equal(self, a: Any, b: Any) -> Any:
        return self.cp.equal(*_operands(a, b))

    def not_equal(self, a: Any, b: Any) -> Any:
        return self.cp.not_equal(*_operands(a, b))

    def less(self, a: Any, b: Any) -> Any:
        return self.cp.less(*_operands(a, b))

    def less_equal(self, a: Any, b: Any) -> Any:
        return self.cp.less_equal(*_operands(a, b))

    def greater(self, a: Any, b: Any) -> Any:
        return self.cp.greater(*_operands(a, b))

    def greater_equal(self, a: Any, b: Any) -> Any:
        return self.cp.greater_equal(*_operands(a, b))

    def logical_and(self, a: Any, b: Any) -> Any:
        return self.cp.logical_and(*_operands(a, b))

    def logical_or(self, a: Any, b: Any) -> Any:
        return self.cp.logical_or(*_operands(a, b))

    def logical_not(self, x: Any) -> Any:
        return self.cp.logical_not(x)

    def isfinite(self, x: Any) -> Any:
        return self.cp.isfinite(x)

    def negative(self, x: Any) -> Any:
        return self.cp.negative(x)

    def abs(self, x: Any) -> Any:
        return self.cp.abs(x)

    def sign(self, x: Any) -> Any:
        return self.cp.sign(x)

    def exp(self, x: Any) -> Any:
        return self.cp.exp(x)

    def log(self, x: Any) -> Any:
        return self.cp.log(x)

    def sqrt(self, x: Any) -> Any:
        return self.cp.sqrt(x)

    def square(self, x: Any) -> Any:
        return self.cp.square(x)

    def tanh(self, x: Any) -> Any:
        return self.cp.tanh(x)

    def _unary(self, op: str, x: Any) -> Any:
        x = self._contig(x)
        out = self.cp.empty(x.shape, dtype=x.dtype)
        if x.size:
            _k.function(_k.template("unary", _CTYPE[x.dtype], str(_k.UNARY_OPS[op])))(
                _grid(x.size), (_BLOCK,), (x, out, I64(x.size)))
        return out

    def relu(self, x: Any) -> Any:
        if x.dtype in _KERNEL_FLOATS:
            return self._unary("relu", x)
        return self.cp.maximum(x, 0)

    def sigmoid(self, x: Any) -> Any:
        return self._unary("sigmoid", x)

    def erf(self, x: Any) -> Any:
        return self._unary("erf", x)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        a, b, view = _select_operands(a, b)
        out = self.cp.where(cond, a, b)
        return out if view is None else out.view(view)

    # --- reductions ---------------------------------------------------------------------
    def sum(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if (x.ndim == 2 and axis == (0,) and x.shape[0] > 1 and x.size
                and x.dtype in LOW and self._gemm_native(x.dtype)):
            # A 16-bit bias gradient: ones(1, N) @ x is a cuBLAS GEMV with coalesced reads and
            # float32 accumulation, where a column reduction reads with a stride of a row.
            # (Not for float32: with CUPY_TF32=1 the GEMV would round its inputs to TF32.)
            out = self.matmul(self.cp.ones((1, x.shape[0]), dtype=x.dtype), x, False, False)
            return out if keepdims else out.reshape(x.shape[1])
        if x.dtype in LOW:
            src = self.cast(x, "float32") if x.dtype == BF16 else x
            return self.cast(self.cp.sum(src, axis=axis, dtype=F32, keepdims=keepdims),
                             x.dtype.name)
        return self.cp.sum(x, axis=axis, keepdims=keepdims)

    def mean(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype in LOW:
            src = self.cast(x, "float32") if x.dtype == BF16 else x
            return self.cast(self.cp.mean(src, axis=axis, dtype=F32, keepdims=keepdims),
                             x.dtype.name)
        return self.cp.mean(x, axis=axis, keepdims=keepdims)

    # bfloat16 comparisons go through float32 (exact): CuPy 14's bfloat16 reductions are new.
    def max(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype == BF16:
            return self.cast(self.cp.amax(self.cast(x, "float32"), axis=axis,
                                          keepdims=keepdims), "bfloat16")
        return self.cp.amax(x, axis=axis, keepdims=keepdims)

    def min(self, x: Any, axis: Any, keepdims: bool) -> Any:
        if x.dtype == BF16:
            return self.cast(self.cp.amin(self.cast(x, "float32"), axis=axis,
                                          keepdims=keepdims), "bfloat16")
        return self.cp.amin(x, axis=axis, keepdims=keepdims)

    def argmax(self, x: Any, axis: int) -> Any:
        if x.dtype == BF16:
            x = self.cast(x, "float32")
        return self.cp.argmax(x, axis=axis).astype(I64, copy=False)

    # --- matmul -------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
        cp = self.cp
        dtype = a.dtype
        if dtype in LOW and not self._gemm_native(dtype):
            # No tensor cores for this dtype: a float32 GEMM, rounded once (the verdict says so)
            out = self.matmul(self.cast(a, "float32"), self.cast(b, "float32"), transpose_a,
                              transpose_b)
            return self.cast(out, dtype.name)
        rows = a.shape[-1] if transpose_a else a.shape[-2]
        cols = b.shape[-2] if transpose_b else b.shape[-1]
        if dtype in LOW and (a.ndim > 2 or (rows == 1 and cols == 1)):
            # cuBLAS directly: CuPy's batched matmul upcasts float16 and fails on bfloat16, and
            # its 2-D matmul computes a 1x1 product as a reduction in the 16-bit dtype
            return self._batched_gemm16(a, b, transpose_a, transpose_b)
        if a.ndim == 2:
            # cupy.matmul hands transposed views to cuBLAS as transpose flags, without a copy
            return cp.matmul(a.T if transpose_a else a, b.T if transpose_b else b)
        return cp.matmul(cp.swapaxes(a, -1, -2) if transpose_a else a,
                         cp.swapaxes(b, -1, -2) if transpose_b else b)

    def _batched_gemm16(self, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
        """Row-major batched C = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T."""
        cp = self.cp
        from cupy_backends.cuda.libs import cublas

        a, b = self._contig(a), self._contig(b)
        transa, transb, n, m, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch = (
            strided_gemm_args(a.shape, b.shape, transpose_a, transpose_b))
        out = cp.empty((*a.shape[:-2], m, n), dtype=a.dtype)
        if out.size == 0:
            return out
        if k == 0:
            out.fill(0)
            return out
        ctype = _CUDA_R[a.dtype]
        # The wrapper puts the handle on CuPy's current stream; alpha and beta are host float32
        # (CuPy keeps the handle in host pointer mode; compute type 32F takes float scalars).
        cublas.gemmStridedBatchedEx(
            cp.cuda.device.get_cublas_handle(), transa, transb, n, m, k,
            _ONE.ctypes.data, b.data.ptr, ctype, lda, stride_a,
            a.data.ptr, ctype, ldb, stride_b,
            _ZERO.ctypes.data, out.data.ptr, ctype, ldc, stride_c,
            batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
        return out

    # --- shapes and indexing ------------------------------------------------------------
    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.cp.reshape(x, shape)

    def transpose(self, x: Any, perm: tuple[int, ...]) -> Any:
        return self.cp.transpose(x, perm)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.cp.broadcast_to(x, shape)

    def concat(self, xs: list[Any], axis: int) -> Any:
        return self.cp.concatenate(xs, axis=axis)

    def take(self, x: Any, indices: Any, axis: int) -> Any:
        return self.cp.take(x, indices, axis=axis)

    def take_grad(self, g: Any, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        import cupyx

        # float32 accumulation: atomics on 16-bit types are slow or missing on older GPUs
        acc = self.cp.zeros(shape, dtype=F32 if g.dtype in LOW else g.dtype)
        cupyx.scatter_add(acc, (slice(None),) * axis + (indices,),
                          self.cast(g, "float32") if g.dtype in LOW else g)
        return acc if acc.dtype == g.dtype else self.cast(acc, g.dtype.name)

    def getitem(self, x: Any, key: tuple[Any, ...]) -> Any:
        return x[key]

    def getitem_grad(self, g: Any, key: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
        out = self.cp.zeros(shape, dtype=g.dtype)
        out[key] = g
        return out

    def one_hot(self, indices: Any, depth: int, dtype: str) -> Any:
        dt = DTYPES[dtype]
        if dt not in _KERNEL_FLOATS:
            return (indices[..., None] == self.cp.arange(depth)).astype(dt)
        idx = self._contig(indices.astype(I64, copy=False))
        out = self.cp.empty((*idx.shape, depth), dtype=dt)
        if out.size:
            _k.function(_k.template("one_hot", _CTYPE[dt]))(
                _grid(out.size), (_BLOCK,), (idx, out, I64(out.size), I64(depth)))
        return out

    # --- images (NHWC) ------------------------------------------------------------------
    def _image_floats(self, x: Any) -> Any:
        if x.dtype not in _KERNEL_FLOATS:
            raise TypeError(f"image kernels take floating tensors, got {x.dtype}")
        return self._contig(x)

    def extract_patches(self, x: Any, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - kh) // sh + 1
        ow = (w + left + right - kw) // sw + 1
        out = self.cp.empty((n, oh, ow, kh * kw * c), dtype=x.dtype)
        if out.size:
            _k.function(_k.template("im2col", _CTYPE[x.dtype]))(
                _grid(out.size), (_BLOCK,),
                (x, out, I64(out.size), *map(np.int32, (h, w, c, oh, ow, kh, kw, sh, sw, top,
                                                        left))))
        return out

    def extract_patches_grad(self, g: Any, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> Any:
        g = self._image_floats(g)
        n, h, w, c = x_shape
        oh, ow = g.shape[1], g.shape[2]
        dx = self.cp.empty((n, h, w, c), dtype=g.dtype)
        if dx.size:
            _k.function(_k.template("col2im", _CTYPE[g.dtype]))(
                _grid(dx.size), (_BLOCK,),
                (g, dx, I64(dx.size), *map(np.int32, (h, w, c, oh, ow, kh, kw, sh, sw,
                                                      pads[0], pads[2]))))
        return dx

    def max_pool2d(self, x: Any, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - ph) // sh + 1
        ow = (w + left + right - pw) // sw + 1
        y = self.cp.empty((n, oh, ow, c), dtype=x.dtype)
        if y.size:
            _k.function(_k.template("maxpool", _CTYPE[x.dtype]))(
                _grid(y.size), (_BLOCK,),
                (x, y, I64(y.size), *map(np.int32, (h, w, c, oh, ow, ph, pw, sh, sw, top,
                                                    left))))
        return y

    def max_pool2d_grad(self, g: Any, x: Any, y: Any, ph: int, pw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        g, x, y = self._image_floats(g), self._image_floats(x), self._image_floats(y)
        _, h, w, c = x.shape
        oh, ow = y.shape[1], y.shape[2]
        dx = self.cp.empty(x.shape, dtype=g.dtype)
        if dx.size:
            _k.function(_k.template("maxpool_grad", _CTYPE[g.dtype]))(
                _grid(dx.size), (_BLOCK,),
                (g, x, y, dx, I64(dx.size), *map(np.int32, (h, w, c, oh, ow, ph, pw, sh, sw,
                                                            pads[0], pads[2]))))
        return dx

    # --- loss scaling -------------------------------------------------------------------
    def _check_finite(self, xs: list[Any], inv_scale: float, write: bool
                      ) -> tuple[list[Any], Any]:
        cp = self.cp
        flag = cp.ones((), dtype=np.bool_)
        outs: list[Any] = [None] * len(xs)
        groups: dict[Any, list[int]] = {}
        for i, x in enumerate(xs):
            if x.dtype in _KERNEL_FLOATS:
                groups.setdefault(x.dtype, []).append(i)
            else:  # integer or bool tensors are finite; they still get their float32 copy
                outs[i] = x.astype(F32) * np.float32(inv_scale) if write else None
        null = np.uint64(0)
        for dtype, members in groups.items():
            fn = _k.function(_k.template("unscale_check", _CTYPE[dtype]))
            for start in range(0, len(members), _k.MULTI_TENSOR):
                chunk = members[start:start + _k.MULTI_TENSOR]
                ins, ys, ns = [], [], []
                for i in chunk:
                    x = self._contig(xs[i])
                    ins.append(x)
                    if write:
                        outs[i] = cp.empty(x.shape, dtype=F32)
                        ys.append(outs[i])
                    else:
                        ys.append(null)
                    ns.append(I64(x.size))
                pad = _k.MULTI_TENSOR - len(chunk)
                longest = max(int(v) for v in ns)
                if longest == 0:
                    continue
                grid = (max(1, min((longest + _BLOCK - 1) // _BLOCK, 4096)), len(chunk))
                fn(grid, (_BLOCK,), (np.int32(len(chunk)), np.float32(inv_scale), flag,
                                     *ins, *([null] * pad), *ys, *([null] * pad),
                                     *ns, *([I64(0)] * pad)))
        return outs, flag

    def unscale_and_check(self, grads: list[Any], inv_scale: float) -> tuple[list[Any], Any]:
        """float32 ``g * inv_scale`` for every gradient and one device bool (all finite),
        with one launch per 8 gradients of a dtype and no host read."""
        return self._check_finite(grads, inv_scale, True)

    def all_finite(self, xs: list[Any]) -> Any:
        return self._check_finite(xs, 1.0, False)[1]

    # --- fused versions of composite ops ------------------------------------------------
    def _rows_last(self, x: Any, axis: int) -> tuple[Any, bool]:
        moved = axis != x.ndim - 1
        if moved:
            x = self.cp.moveaxis(x, axis, -1)
        return self._contig(x), moved

    def _softmax(self, x: Any, axis: int, log_mode: int) -> Any:
        cp = self.cp
        if x.dtype not in (F32, F64):
            x = self.cast(x, "float32") if x.dtype in LOW else x.astype(F32)
        if x.ndim == 0:  # a softmax over one value
            return cp.zeros((), x.dtype) if log_mode else cp.ones((), x.dtype)
        xr, moved = self._rows_last(x, axis)
        out = cp.empty(xr.shape, dtype=xr.dtype)
        cols = xr.shape[-1] if xr.ndim else 1
        rows = xr.size // cols if cols else 0
        if rows and cols:
            _k.function(_k.template("softmax_rows", _CTYPE[xr.dtype]))(
                (rows,), (_BLOCK,), (xr, out, I64(cols), np.int32(log_mode)))
        return cp.moveaxis(out, -1, axis) if moved else out

    def softmax(self, x: Any, axis: int) -> Any:
        return self._softmax(x, axis, 0)

    def log_softmax(self, x: Any, axis: int) -> Any:
        return self._softmax(x, axis, 1)

    def sparse_softmax_cross_entropy(self, logits: Any, labels: Any) -> tuple[Any, Any]:
        cp = self.cp
        if logits.dtype not in (F32, F64):
            logits = self.cast(logits, "float32") if logits.dtype in LOW else logits.astype(F32)
        logits = self._contig(logits)
        labels = self._contig(labels.astype(I64, copy=False))
        rows, cols = logits.shape
        loss = cp.empty((rows,), dtype=logits.dtype)
        probs = cp.empty_like(logits)
        if rows and cols:
            _k.function(_k.template("xent_fwd", _CTYPE[logits.dtype]))(
                (rows,), (_BLOCK,), (logits, labels, loss, probs, I64(cols)))
        return loss, probs

    def sparse_softmax_cross_entropy_grad(self, probs: Any, labels: Any, g: Any) -> Any:
        """``(probs - one_hot(labels)) * g[:, None]`` in one kernel (the fused backward)."""
        cp = self.cp
        probs = self._contig(probs)
        labels = self._contig(labels.astype(I64, copy=False))
        g = self._contig(g.astype(probs.dtype, copy=False))
        dx = cp.empty_like(probs)
        if dx.size:
            _k.function(_k.template("xent_bwd", _CTYPE[probs.dtype]))(
                _grid(dx.size), (_BLOCK,), (probs, labels, g, dx, I64(dx.size),
                                            I64(probs.shape[1])))
        return dx

    def relu_grad(self, g: Any, y: Any) -> Any:
        if g.dtype not in _KERNEL_FLOATS or y.dtype != g.dtype or g.shape != y.shape:
            return g * (y > 0)
        g, y = self._contig(g), self._contig(y)
        out = self.cp.empty(g.shape, dtype=g.dtype)
        if g.size:
            _k.function(_k.template("relu_grad", _CTYPE[g.dtype]))(
                _grid(g.size), (_BLOCK,), (g, y, out, I64(g.size)))
        return out

    def relu_grad_bias(self, g: Any, y: Any) -> tuple[Any, Any]:
        # relu_grad's kernel, then the bias gradient as this backend's column sum (a float32-
        # accumulating GEMV for 16-bit): on a GPU a second read of dz is cheap next to the
        # layer's GEMMs, so there is no fused reduction kernel to maintain.
        dz = self.relu_grad(g, y)
        return dz, self.sum(dz.reshape(-1, dz.shape[-1]), (0,), False)

    def dense(self, x: Any, w: Any, bias: Any, activation: str | None) -> Any:
        # The matmul, bias_add and relu kernels in sequence (not fused: a 16-bit result is
        # rounded after the GEMM and again after the bias).
        if activation not in (None, "relu"):
            raise ValueError(f"dense: unknown activation {activation!r}; use None or 'relu'")
        flat = x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x
        z = self.matmul(flat, w, False, False)
        if bias is not None:
            z = self.bias_add(z, bias)
        if activation == "relu":
            z = self.relu(z)
        return z.reshape(*x.shape[:-1], w.shape[-1]) if x.ndim > 2 else z

    def bias_add(self, x: Any, bias: Any) -> Any:
        if x.dtype not in _KERNEL_FLOATS or bias.dtype != x.dtype:
            return x + bias
        x, bias = self._contig(x), self._contig(bias)
        out = self.cp.empty(x.shape, dtype=x.dtype)
        if x.size:
            _k.function(_k.template("bias_add", _CTYPE[x.dtype]))(
                _grid(x.size), (_BLOCK,), (x, bias, out, I64(x.size), I64(bias.shape[0])))
        return out

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str, seed: int) -> Any:
        dt = DTYPES[dtype]
        kdt = dt if dt in _KERNEL_FLOATS else F32
        out = self.cp.empty(shape, dtype=kdt)
        if out.size:
            _k.function(_k.template("dropout_mask", _CTYPE[kdt]))(
                _grid(out.size), (_BLOCK,),
                (out, I64(out.size), np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float32(rate),
                 np.float32(1.0 / (1.0 - rate))))
        return out if kdt == dt else out.astype(dt)

    # --- fused optimizer updates (float32 master weights, in place, flag-gated) -----------
    def _fusable(self, *arrays: Any) -> bool:
        return all(a is None or (a.dtype == F32 and a.flags.c_contiguous) for a in arrays)

    def _gated(self, var: Any, new: Any, flag: Any) -> None:
        """The unfused fallback: write ``new`` into ``var`` where the device flag holds."""
        var[...] = new if flag is None else self.cp.where(_native(flag), new, var)

    def sgd_update(self, var: Any, grad: Any, velocity: Any, lr: float, momentum: float,
                   nesterov: bool, flag: Any) -> None:
        if not self._fusable(var, grad, velocity):
            g = grad.astype(var.dtype, copy=False)
            if velocity is None:
                self._gated(var, var - lr * g, flag)
                return
            v = momentum * velocity - lr * g
            self._gated(var, var + (momentum * v - lr * g if nesterov else v), flag)
            self._gated(velocity, v, flag)
            return
        _k.function("sgd_update")(
            _grid(var.size), (_BLOCK,),
            (var, grad, velocity if velocity is not None else np.uint64(0), I64(var.size),
             np.float32(lr), np.float32(momentum), np.int32(bool(nesterov)),
             self._flag_or_true(flag)))

    def rmsprop_update(self, var: Any, grad: Any, ms: Any, mom: Any, lr: float, rho: float,
                       momentum: float, epsilon: float, flag: Any) -> None:
        if not self._fusable(var, grad, ms, mom):
            g = grad.astype(var.dtype, copy=False)
            a = rho * ms + (1 - rho) * g * g
            inc = lr * g / self.cp.sqrt(a + epsilon)
            if mom is not None:
                m = momentum * mom + inc
                self._gated(var, var - m, flag)
                self._gated(mom, m, flag)
            else:
                self._gated(var, var - inc, flag)
            self._gated(ms, a, flag)
            return
        _k.function("rmsprop_update")(
            _grid(var.size), (_BLOCK,),
            (var, grad, ms, mom if mom is not None else np.uint64(0), I64(var.size),
             np.float32(lr), np.float32(rho), np.float32(1.0 - rho), np.float32(momentum),
             np.float32(epsilon), self._flag_or_true(flag)))

    def adam_update(self, var: Any, grad: Any, m: Any, v: Any, lr: float, beta1: float,
                    beta2: float, epsilon: float, step: int, weight_decay: float,
                    flag: Any) -> None:
        # Keras Adam: alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t); AdamW decays first.
        alpha = lr * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
        decay = lr * weight_decay
        if not self._fusable(var, grad, m, v):
            g = grad.astype(var.dtype, copy=False)
            w = var - decay * var if decay else var
            mi = m + (g - m) * (1 - beta1)
            vi = v + (g * g - v) * (1 - beta2)
            self._gated(var, w - alpha * mi / (self.cp.sqrt(vi) + epsilon), flag)
            self._gated(m, mi, flag)
            self._gated(v, vi, flag)
            return
        _k.function("adam_update")(
            _grid(var.size), (_BLOCK,),
            (var, grad, m, v, I64(var.size), np.float32(alpha), np.float32(1.0 - beta1),
             np.float32(1.0 - beta2), np.float32(epsilon), np.float32(decay),
             self._flag_or_true(flag)))
