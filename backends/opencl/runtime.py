"""The OpenCL runtime under the backend: one context and queue, device arrays, and programs
built from the ``kernels/*.cl`` templates once per (template, dtypes, options) and cached with
their kernel objects.

Native arrays are :class:`CLArray`: a device buffer holding a C-contiguous array (shape, dtype).
Kernels read strided views (transpose, broadcast, slicing) through their ``_s``/``_bc``
variants, so no kernel ever needs a non-contiguous input and every result is contiguous.
"""

from __future__ import annotations

import math
from functools import cached_property
from importlib import resources
from typing import Any

import ml_dtypes
import numpy as np
import pyopencl as cl
import pyopencl.tools as cl_tools

NP_DTYPES: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_),
}
NAMES: dict[np.dtype[Any], str] = {v: k for k, v in NP_DTYPES.items()}

# dtype -> (storage C type, compute C type, load, store); {p} pointer, {i} index, {v} value
_C: dict[str, tuple[str, str, str, str]] = {
    "float16": ("half", "float", "vload_half({i}, {p})", "vstore_half_rte((float)({v}), {i}, {p})"),
    "bfloat16": ("ushort", "float", "bf16_to_f32({p}[{i}])",
                 "{p}[{i}] = f32_to_bf16((float)({v}))"),
    "float32": ("float", "float", "{p}[{i}]", "{p}[{i}] = (float)({v})"),
    "float64": ("double", "double", "{p}[{i}]", "{p}[{i}] = (double)({v})"),
    "int8": ("char", "char", "{p}[{i}]", "{p}[{i}] = (char)({v})"),
    "int16": ("short", "short", "{p}[{i}]", "{p}[{i}] = (short)({v})"),
    "int32": ("int", "int", "{p}[{i}]", "{p}[{i}] = (int)({v})"),
    "int64": ("long", "long", "{p}[{i}]", "{p}[{i}] = (long)({v})"),
    "uint8": ("uchar", "uchar", "{p}[{i}]", "{p}[{i}] = (uchar)({v})"),
    "uint16": ("ushort", "ushort", "{p}[{i}]", "{p}[{i}] = (ushort)({v})"),
    "uint32": ("uint", "uint", "{p}[{i}]", "{p}[{i}] = (uint)({v})"),
    "uint64": ("ulong", "ulong", "{p}[{i}]", "{p}[{i}] = (ulong)({v})"),
    "bool": ("uchar", "uchar", "{p}[{i}]", "{p}[{i}] = (uchar)(({v}) != 0)"),
}
#: NumPy type of a kernel's scalar argument in the compute type of a dtype.
SCALAR: dict[str, Any] = {
    "float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
    "float64": np.float64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "bool": np.uint8,
}
FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
MAX_DIMS = 8


def slot_macros(slot: str, dtype: str) -> str:
    """The LOAD_/STORE_/_ST/_CT/_FLOAT macros of one dtype slot (A, B, O ...)."""
    st, ct, load, store = _C[dtype]
    return "\n".join((
        f"#define {slot}_ST {st}", f"#define {slot}_CT {ct}",
        f"#define {slot}_FLOAT {int(dtype in FLOATS)}",
        f"#define {slot}_HALF {int(dtype == 'float16')}",
        f"#define {slot}_BF16 {int(dtype == 'bfloat16')}",
        f"#define LOAD_{slot}(p, i) ({load.format(p='(p)', i='(i)')})",
        f"#define STORE_{slot}(p, i, v) {store.format(p='(p)', i='(i)', v='v')}",
    ))


def _read_template(name: str) -> str:
    return resources.files(__package__).joinpath("kernels", name).read_text(encoding="utf-8")


class CLArray:
    """A C-contiguous array in a device buffer (the backend's native array)."""

    __slots__ = ("__weakref__", "base", "data", "dtype", "runtime", "shape", "size")

    def __init__(self, runtime: Runtime, shape: tuple[int, ...], dtype: np.dtype[Any],
                 data: Any = None, base: CLArray | None = None) -> None:
        self.runtime = runtime
        self.shape = shape
        self.dtype = dtype
        self.size = math.prod(shape)
        # Zero-size arrays still get a buffer so that every array can be a kernel argument.
        self.data = data if data is not None else runtime.allocate(max(self.size, 1)
                                                                   * dtype.itemsize)
        self.base = base  # a reshape shares its source's buffer and keeps it alive

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get(self) -> np.ndarray:
        """A host copy (NumPy array; bfloat16 through ml_dtypes)."""
        out = np.empty(self.shape, dtype=self.dtype)
        if self.size:
            cl.enqueue_copy(self.runtime.queue, out, self.data, is_blocking=True)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CLArray({self.get()!r}, dtype={NAMES[self.dtype]})"


class Program:
    """A built program and its kernel objects, fetched once."""

    __slots__ = ("kernels",)

    def __init__(self, program: cl.Program) -> None:
        self.kernels = {k.function_name: k for k in program.all_kernels()}

    def __getitem__(self, name: str) -> cl.Kernel:
        return self.kernels[name]


class Runtime:
    """Context, queue, memory pool and program cache of one OpenCL device."""

    def __init__(self, device: cl.Device) -> None:
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        self.fp64 = "cl_khr_fp64" in device.extensions
        self.max_wg = int(device.max_work_group_size)
        self.local = min(256, self.max_wg)
        self._programs: dict[tuple[Any, ...], Program] = {}
        self._templates: dict[str, str] = {}

    def allocate(self, nbytes: int) -> Any:
        return self.pool.allocate(nbytes)

    @cached_property
    def common(self) -> str:
        head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if self.fp64 else ""
        return head + _read_template("common.cl")

    def template(self, name: str) -> str:
        text = self._templates.get(name)
        if text is None:
            text = self._templates[name] = _read_template(name)
        return text

    def program(self, template: str, slots: tuple[tuple[str, str], ...], extra: str = "",
                options: tuple[str, ...] = ()) -> Program:
        """The program of ``template`` with dtype ``slots`` ((slot, dtype) pairs) and
        ``extra`` source appended (instantiations); built on first use, then cached."""
        key = (template, slots, extra, options)
        prog = self._programs.get(key)
        if prog is None:
            for _, dtype in slots:
                if dtype == "float64" and not self.fp64:
                    raise TypeError(f"float64 needs cl_khr_fp64, which {self.device.name} "
                                    "lacks; valid dtypes here: float16, bfloat16, float32 and "
                                    "the integer types")
            macros = "\n".join(slot_macros(slot, dtype) for slot, dtype in slots)
            src = "\n".join((self.common, macros, self.template(template), extra))
            built = cl.Program(self.context, src).build(options=list(options))
            prog = self._programs[key] = Program(built)
        return prog

    # --- launching ----------------------------------------------------------------------
    def launch(self, kernel: cl.Kernel, n: int, *args: Any) -> None:
        """Run ``kernel`` over ``n`` work-items (1-D, rounded up to whole work-groups)."""
        if n <= 0:
            return
        local = self.local
        kernel(self.queue, ((n + local - 1) // local * local,), (local,), *args)

    def empty(self, shape: tuple[int, ...], dtype: str) -> CLArray:
        return CLArray(self, shape, NP_DTYPES[dtype])

    def upload(self, host: np.ndarray) -> CLArray:
        if not host.flags.c_contiguous:
            host = np.array(host, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        out = CLArray(self, tuple(host.shape), host.dtype)
        if out.size:
            cl.enqueue_copy(self.queue, out.data, host, is_blocking=True)
        return out

    def finish(self) -> None:
        self.queue.finish()


def vec8(values: tuple[int, ...] | list[int]) -> np.ndarray:
    """Up to 8 ints right-aligned in an OpenCL int8 argument (padding: size 1, stride 0)."""
    pad = MAX_DIMS - len(values)
    return np.array((1,) * pad + tuple(values), dtype=np.int32) if pad else np.array(
        values, dtype=np.int32)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def coalesce(shape: tuple[int, ...], *strides: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                         list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbours that are contiguous in every operand, so that
    most broadcasts need 2 or 3 dimensions and every view fits in MAX_DIMS."""
    dims = [(d, [s[i] for s in strides]) for i, d in enumerate(shape) if d != 1]
    merged: list[tuple[int, list[int]]] = []
    for d, st in dims:
        if merged:
            pd, pst = merged[-1]
            if all(ps == s * d for ps, s in zip(pst, st)):
                merged[-1] = (pd * d, st)
                continue
        merged.append((d, st))
    if not merged:
        return (), [() for _ in strides]
    return (tuple(d for d, _ in merged),
            [tuple(st[k] for _, st in merged) for k in range(len(strides))])
