"""The OpenCL backend (PyOpenCL): every kernel in OpenCL C, on any OpenCL device.

Arrays live in device buffers (:class:`~mpcore_opencl.runtime.CLArray`, always C-contiguous);
the host sees them only at the edges (``to_host``, printing, the loss-scale decision). Kernels
that take indices (gathers, labels) never follow an invalid one: they record it in a device
error record that the host reads along with its next read, and raise there (IndexError for
indices, ValueError for labels). bfloat16 is stored as 16-bit words converted in the kernel with
round-to-nearest-even and computed in float32. float16 is stored as half and runs in one of two
kernel variants (see :mod:`mpcore_opencl.runtime`): "convert" reads and writes it with
``vload_half``/``vstore_half`` (no ``cl_khr_fp16`` needed) and computes in float32; "native"
(``cl_khr_fp16``) computes elementwise ops in half and keeps GEMM tiles and panels in half. Both
accumulate reductions, softmax, losses and GEMMs in float32. Programs are generated per dtype
and variant from the templates in ``kernels/`` on first use and cached with their kernel objects.

Which float16 variant runs: ``MPCORE_OPENCL_HALF=auto|native|convert`` (default auto; see
:meth:`OpenCLBackend.half_choice`). ``auto`` uses convert on a device without ``cl_khr_fp16``.
On a device with it, it measures both variants once per device and process
(:func:`measure_half_variants`: a float16 GEMM and an elementwise multiply, a fraction of a
second) and decides per kernel family: the elementwise programs run native where the multiply
is faster, the GEMM and every other program where the GEMM is. On Intel's CPU runtime here,
for instance, native elementwise kernels ran 2.2x faster (half loads and stores vectorise;
``vload_half`` does not) and the native GEMM 0.7x, so it runs native elementwise kernels and
convert GEMMs. The decision and its figures are part of the float16 verdict's reason
(``check_policy``, ``mpcore info``).

Device choice and auto-selection: see :mod:`mpcore_opencl.devices`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpcore.backend import Backend, BackendUnavailableError, Device, KernelBuildError, Support
from mpcore.extras import install_command
from mpcore.settings import env_choice

from . import devices as _devices
from .arrays import MAX_DIMS, NAMES, NP_DTYPES, SCALAR, CLArray, coalesce, contiguous_strides, vec8
from .linalg import LinalgKernels
from .probe import WIDTH_ENV, ProbeResult, fixed_width, probe
from .rules import FP16, opencl_policy_support

# The runtime (pyopencl) is imported on activation only: `import mpcore` must not load it.
Key = tuple[Any, ...]

FLOATS = ("float16", "bfloat16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
LOW = ("float16", "bfloat16")

# op -> C expression over x (and y) in the compute type, for float and integer dtypes
# (None: not defined there; the core only calls these ops on floats).
UNARY: dict[str, tuple[str | None, str | None]] = {
    "copy": ("x", "x"),
    "negative": ("-x", "-x"),
    "abs": ("fabs(x)", "(x < 0 ? -x : x)"),
    "sign": ("(isnan(x) ? x : (A_CT)((x > 0) - (x < 0)))", "(A_CT)((x > 0) - (x < 0))"),
    "square": ("x * x", "x * x"),
    "relu": ("((x > 0 || isnan(x)) ? x : (A_CT)0)", "(x > 0 ? x : (A_CT)0)"),
    "exp": ("exp(x)", None), "log": ("log(x)", None), "sqrt": ("sqrt(x)", None),
    "tanh": ("tanh(x)", None), "erf": ("erf(x)", None),
    "sigmoid": ("(A_CT)0.5 * ((A_CT)1 + tanh((A_CT)0.5 * x))", None),
}
UNARY_BOOL: dict[str, tuple[str, str]] = {
    "isfinite": ("isfinite(x)", "1"),
    "logical_not": ("x == 0", "x == 0"),
}
BINARY: dict[str, tuple[str | None, str | None]] = {
    "add": ("x + y", "x + y"), "subtract": ("x - y", "x - y"), "multiply": ("x * y", "x * y"),
    "divide": ("x / y", None), "power": ("pow(x, y)", None),
    # NaN wins, as NumPy's maximum/minimum
    "maximum": ("((x > y || isnan(x)) ? x : y)", "(x > y ? x : y)"),
    "minimum": ("((x < y || isnan(x)) ? x : y)", "(x < y ? x : y)"),
}
BINARY_BOOL: dict[str, str] = {
    "equal": "x == y", "not_equal": "x != y", "less": "x < y", "less_equal": "x <= y",
    "greater": "x > y", "greater_equal": "x >= y",
    "logical_and": "(x != 0) && (y != 0)", "logical_or": "(x != 0) || (y != 0)",
}

HALF_MODES = ("auto", "native", "convert")
#: ``auto`` runs a kernel family native when its measured speedup exceeds this (a gain within
#: timing noise is not worth a second set of kernels).
MIN_NATIVE_GAIN = 1.05


def half_mode() -> str:
    """The float16 kernel variant asked for by ``MPCORE_OPENCL_HALF`` (default ``auto``)."""
    return env_choice("MPCORE_OPENCL_HALF", HALF_MODES)


@dataclass(frozen=True)
class HalfMeasurement:
    """float16 speed of the native-half and the convert kernels on one device: a GEMM
    (GFLOP/s) and an elementwise multiply (GB/s moved: two reads and a write)."""

    device: str
    gemm_n: int
    gemm_native_gflops: float
    gemm_convert_gflops: float
    elements: int
    ew_native_gbps: float
    ew_convert_gbps: float
    seconds: float

    @property
    def gemm_speedup(self) -> float:
        return self.gemm_native_gflops / self.gemm_convert_gflops

    @property
    def ew_speedup(self) -> float:
        return self.ew_native_gbps / self.ew_convert_gbps

    @property
    def gemm_native(self) -> bool:
        """Whether the GEMM (and the kernel families that follow it) should run native."""
        return self.gemm_speedup > MIN_NATIVE_GAIN

    @property
    def elementwise_native(self) -> bool:
        """Whether the elementwise kernels should run native."""
        return self.ew_speedup > MIN_NATIVE_GAIN

    def __str__(self) -> str:
        return (f"native vs convert half kernels: float16 GEMM n={self.gemm_n} "
                f"{self.gemm_native_gflops:.1f} vs {self.gemm_convert_gflops:.1f} GFLOP/s "
                f"({self.gemm_speedup:.2f}x), multiply of {self.elements} elements "
                f"{self.ew_native_gbps:.1f} vs {self.ew_convert_gbps:.1f} GB/s "
                f"({self.ew_speedup:.2f}x)")


@dataclass(frozen=True)
class HalfChoice:
    """The float16 kernel variants the backend runs on its device, and why: ``variant`` for
    the GEMMs and every program but the elementwise ones, which run ``elementwise``."""

    variant: str  # "native" or "convert"
    elementwise: str  # "native" or "convert"
    mode: str  # MPCORE_OPENCL_HALF
    reason: str
    measured: HalfMeasurement | None = None

    @property
    def native(self) -> bool:
        return self.variant == "native"

    @property
    def native_elementwise(self) -> bool:
        return self.elementwise == "native"


def measure_half_variants(backend: OpenCLBackend, n: int = 512, elements: int = 1 << 22,
                          repeats: int = 3) -> HalfMeasurement:
    """Time the native-half and the convert float16 kernels on ``backend``'s device (which
    must have cl_khr_fp16): an n x n GEMM (the device's GEMM variant) and a multiply of
    ``elements`` values, best of ``repeats`` after a warm-up, the variants taking turns so
    that a load change hits both. About a second at most on a CPU device, far less on a GPU."""
    device = backend.device()
    if FP16 not in device.features:
        raise ValueError(f"{device.name} ({device.index}) lacks {FP16}: it has no native-half "
                         "kernels to measure")
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    ga, gb = (backend.asarray(rng.uniform(-1, 1, (n, n)).astype(np.float16), "float16")
              for _ in range(2))
    ea, eb = (backend.asarray(rng.uniform(-1, 1, elements).astype(np.float16), "float16")
              for _ in range(2))
    eo = backend._empty((elements,), "float16")
    rt = backend.runtime

    def gemm(native: bool) -> None:
        backend._matmul(ga, gb, False, False, native)

    def multiply(native: bool) -> None:
        kernel = backend._elementwise("float16", "float16", native)["k_multiply"]
        rt.launch(kernel, elements, np.int32(elements), ea.data, eb.data, eo.data)

    best: dict[tuple[str, bool], float] = {}
    for round_ in range(repeats + 1):  # round 0 warms up: builds programs, allocates
        for name, fn in (("gemm", gemm), ("ew", multiply)):
            for native in (True, False):
                t0 = time.perf_counter()
                fn(native)
                rt.finish()
                elapsed = time.perf_counter() - t0
                if round_:
                    best[name, native] = min(best.get((name, native), math.inf), elapsed)
    flops, moved = 2.0 * n ** 3, 3.0 * 2 * elements
    return HalfMeasurement(
        device.name, n, flops / best["gemm", True] / 1e9, flops / best["gemm", False] / 1e9,
        elements, moved / best["ew", True] / 1e9, moved / best["ew", False] / 1e9,
        time.perf_counter() - start)


def _expr(table_entry: tuple[str | None, str | None], dtype: str) -> str | None:
    f, i = table_entry
    if dtype in FLOATS:
        return f
    if dtype == "bool":
        return None
    if i is not None and dtype in UNSIGNED:
        i = i.replace("(x < 0 ? -x : x)", "x")
    return i


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(out)


def _broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides that read a contiguous ``shape`` as ``out`` (0 on broadcast axes)."""
    st = contiguous_strides(shape)
    lead = len(out) - len(shape)
    return (0,) * lead + tuple(0 if d == 1 and o != 1 else s
                               for d, s, o in zip(shape, st, out[lead:]))


def _view(shape: tuple[int, ...], key: tuple[Any, ...]) -> tuple[int, tuple[int, ...],
                                                                  tuple[int, ...]]:
    """(offset, shape, strides) in elements of the basic-indexing view ``x[key]``."""
    strides = contiguous_strides(shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices for an array of rank {len(shape)}")
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded: list[Any] = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (len(shape) - sum(1 for k in expanded if k is not None)))
    offset = 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    dim = 0
    for k in expanded:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, stride = shape[dim], strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            count = len(range(start, stop, step))
            offset += start * stride if count else 0
            out_shape.append(count)
            out_strides.append(stride * step)
        else:
            i = int(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
            offset += (i % size) * stride
        dim += 1
    return offset, tuple(out_shape), tuple(out_strides)


def _unmeasured_half_choice(mode: str, device: Device) -> HalfChoice | None:
    """The float16 variants ``MPCORE_OPENCL_HALF=mode`` settles on ``device`` without
    measuring, or None where ``auto`` has to measure (a device with cl_khr_fp16)."""
    if mode != "auto":
        return HalfChoice(mode, mode, mode, f"MPCORE_OPENCL_HALF={mode}")
    if FP16 not in device.features:
        where = f"{device.name} ({device.index})" if device.index else device.name
        return HalfChoice("convert", "convert", mode,
                          f"MPCORE_OPENCL_HALF=auto: {where} lacks {FP16}, so the convert "
                          "kernels run")
    return None


class OpenCLBackend(LinalgKernels, Backend):
    """OpenCL C kernels on one OpenCL device (a GPU when there is one)."""

    name = "opencl"
    priority = 200
    install_hint = install_command("opencl", "pocl") + " (PoCL: an OpenCL CPU device)"

    def __init__(self) -> None:
        self._rt: Any = None
        self._device: Device | None = None
        self._devices: list[tuple[Device, Any]] | None = None
        self._ew: dict[Key, Any] = {}
        self._flat: dict[Key, Any] = {}  # (op, dtype, out) -> same-shape binary kernel
        self._half: HalfChoice | None = None
        self._probe: ProbeResult | None = None

    # --- availability, devices, verdicts ------------------------------------------------
    def unavailable_reason(self) -> str | None:
        return _devices.driver_missing()

    def auto_select(self) -> bool:
        return self.is_available() and _devices.gpu_driver_present()

    def _found(self) -> list[tuple[Device, Any]]:
        if self._devices is None:
            self._devices = _devices.enumerate_devices()
        return self._devices

    def devices(self) -> list[Device]:
        if self.unavailable_reason() is not None:
            return []
        return [desc for desc, _ in self._found()]

    def device(self) -> Device:
        if self._device is None:
            reason = self.unavailable_reason()
            if reason is not None:
                raise BackendUnavailableError(f"backend 'opencl' is not available: {reason}")
            try:
                self._device, _ = _devices.choose(self._found(),
                                                  os.environ.get("MPCORE_OPENCL_DEVICE"))
            except RuntimeError as exc:
                raise BackendUnavailableError(str(exc)) from None
        return self._device

    #: Whether this backend has native-half (cl_khr_fp16) kernels (it does: which variant runs
    #: on a device is :meth:`half_choice`) and matrix-engine bfloat16 kernels (not yet, so
    #: bfloat16 is never judged fast). A subclass changes these to say what it runs.
    native_half_kernels = True
    matrix_kernels = False

    def policy_support(self, policy: str, device: Device) -> Support:
        native, note = self._half_plan(device)
        return opencl_policy_support(policy, device, native_half_kernels=native,
                                     matrix_kernels=self.matrix_kernels, half_note=note)

    def _half_plan(self, device: Device) -> tuple[bool, str]:
        """(native half kernels run on ``device``, why): the decision itself for this
        backend's device, else what ``MPCORE_OPENCL_HALF`` would do on a described one."""
        if not self.native_half_kernels:
            return False, ""
        own = self._device
        if own is not None and (device.index, device.name) == (own.index, own.name):
            choice = self.half_choice()
            return choice.native, choice.reason
        plan = _unmeasured_half_choice(half_mode(), device)
        if plan is not None:  # (native without cl_khr_fp16 is ignored by the rules)
            return plan.native, plan.reason
        if device.kind != "cpu":
            return True, ("MPCORE_OPENCL_HALF=auto, assuming the measurement made once when the "
                          "device is used finds the native GEMM faster")
        return False, ("MPCORE_OPENCL_HALF=auto, assuming the measurement made once when the "
                       "device is used finds the native GEMM no faster, as on CPUs without "
                       "AVX512-FP16")

    def half_choice(self) -> HalfChoice:
        """The float16 kernel variants on this backend's device, decided once: by
        ``MPCORE_OPENCL_HALF`` (native needs cl_khr_fp16), else convert on a device without
        cl_khr_fp16, else per kernel family by :func:`measure_half_variants`."""
        if self._half is None:
            mode = half_mode()
            device = self.device()
            where = f"{device.name} ({device.index})"
            if mode == "native" and FP16 not in device.features:
                found = [f"{d.index} = {d.name}" for d in self.devices()
                         if FP16 in d.features]
                raise ValueError(
                    f"MPCORE_OPENCL_HALF=native needs {FP16}, which the OpenCL device {where} "
                    "lacks; use MPCORE_OPENCL_HALF=auto or convert, or pick a device that has it "
                    "with MPCORE_OPENCL_DEVICE ("
                    + ("; ".join(found) or f"none here has {FP16}; pip install intel-opencl-rt "
                                            "intel-cmplr-lib-rt adds a CPU device with it")
                    + ")")
            choice = _unmeasured_half_choice(mode, device)
            if choice is None:
                m = measure_half_variants(self)
                gemm = "native" if m.gemm_native else "convert"
                ew = "native" if m.elementwise_native else "convert"
                choice = HalfChoice(gemm, ew, mode, f"MPCORE_OPENCL_HALF=auto measured {m}: "
                                    f"{gemm} GEMM kernels and {ew} elementwise kernels run", m)
            self._half = choice
        return self._half

    def synchronize(self) -> None:
        if self._rt is not None:
            self._rt.finish()

    def _activate(self) -> None:
        from .runtime import Runtime

        if self.unavailable_reason() is None and self._rt is None:
            desc = self.device()
            # a bad MPCORE_OPENCL_HALF fails here, not at a first float16 op
            if _unmeasured_half_choice(half_mode(), desc) is not None:
                self.half_choice()  # decided without measuring (native: checks cl_khr_fp16)
            dev = next(d for x, d in self._found() if x.index == desc.index)
            self.verified_vector_width()  # before this process builds anything on the device
            try:
                self._rt = Runtime(dev)
            except Exception as exc:
                raise BackendUnavailableError(
                    f"OpenCL device {desc.index} ({desc.name}) cannot be opened: {exc}") from exc
        super()._activate()

    def verified_vector_width(self) -> int:
        """The GEMM vector width on this backend's device: ``vector_width`` or
        ``MPCORE_OPENCL_VECTOR_WIDTH`` when set, else the widest the kernel probe
        (:mod:`mpcore_opencl.probe`, in a subprocess) found to build and compute correctly;
        raises :class:`~mpcore.KernelBuildError` where none does."""
        if self.vector_width is not None:
            return self.vector_width
        fixed = fixed_width()
        if fixed is not None:
            return fixed
        if self._probe is None:
            self._probe = probe(self.device())
        if self._probe.vector_width is None:
            desc = self.device()
            raise KernelBuildError(
                f"OpenCL device {desc.index} ({desc.name}, driver "
                f"{desc.details.get('driver_version', '?')}) fails mpcore's kernel probe: "
                f"{self._probe.summary()}. A failed probe is not cached: the next process tries "
                f"again. {WIDTH_ENV} fixes the GEMM vector width and skips the probe")
        return self._probe.vector_width

    @property
    def runtime(self) -> Any:
        if self._rt is None:
            self.kernels()
        return self._rt

    # --- programs -----------------------------------------------------------------------
    def _native(self, dtypes: Any, native: bool | None, elementwise: bool = False) -> bool:
        """Whether programs over ``dtypes`` use native half: ``native`` when given (the
        measurement builds both variants), else the device's decision for the kernel family
        where float16 is in."""
        if native is not None:
            return native
        if "float16" not in dtypes:
            return False
        choice = self.half_choice()
        return choice.native_elementwise if elementwise else choice.native

    def _elementwise(self, dtype: str, out: str, native: bool | None = None) -> Any:
        """The elementwise program of ``dtype`` -> ``out``: same-dtype arithmetic, dtype ->
        bool predicates, or (other pairs) the conversion ``copy``; ``native``: the float16
        variant (default: the device's)."""
        key = ("ew", dtype, out) if native is None else ("ew", dtype, out, native)
        prog = self._ew.get(key)
        if prog is None:
            lines = []
            if out == dtype:
                for op, entry in UNARY.items():
                    e = _expr(entry, dtype) if op != "copy" else "x"
                    if e is not None:
                        lines.append(f"UNARY(k_{op}, {e})")
                for op, entry in BINARY.items():
                    e = _expr(entry, dtype)
                    if e is not None:
                        lines.append(f"BINARY(k_{op}, {e})")
                if dtype == "bool":
                    lines += ["BINARY(k_maximum, x || y)", "BINARY(k_minimum, x && y)",
                              "BINARY(k_add, x || y)", "BINARY(k_multiply, x && y)"]
            if out == "bool":
                for op, (f, i) in UNARY_BOOL.items():
                    lines.append(f"UNARY(k_{op}, {f if dtype in FLOATS else i})")
                for op, e in BINARY_BOOL.items():
                    lines.append(f"BINARY(k_{op}, {e})")
                if dtype != "bool":
                    lines.append("UNARY(k_copy, x)")
            elif out != dtype:
                lines.append("UNARY(k_copy, x)")
            prog = self.runtime.program("elementwise.cl", (("A", dtype), ("O", out)),
                                        "\n".join(lines), ("-DWITH_COPY", "-DWITH_WHERE"),
                                        self._native((dtype, out), native, elementwise=True))
            self._ew[key] = prog
        return prog

    def _prog(self, template: str, *slots: tuple[str, str], options: tuple[str, ...] = (),
              native: bool | None = None) -> Any:
        key = (template, slots, options) if native is None else (template, slots, options,
                                                                 native)
        prog = self._ew.get(key)
        if prog is None:
            prog = self._ew[key] = self.runtime.program(
                template, slots, "", options, self._native([dt for _, dt in slots], native))
        return prog

    # --- helpers ------------------------------------------------------------------------
    def _dt(self, x: CLArray) -> str:
        return NAMES[x.dtype]

    def _empty(self, shape: tuple[int, ...], dtype: str) -> CLArray:
        return self.runtime.empty(tuple(int(d) for d in shape), dtype)

    def _scalar(self, value: Any, dtype: str) -> Any:
        # Round the scalar to the array's dtype first, as NumPy does for a Python scalar.
        with np.errstate(over="ignore", invalid="ignore"):
            return SCALAR[dtype](np.asarray(value).astype(NP_DTYPES[dtype]))

    def _gather(self, x: CLArray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                out_dtype: str | None = None) -> CLArray:
        """A contiguous copy of the strided view (offset, shape, strides) of ``x``,
        converted to ``out_dtype``."""
        dt = self._dt(x)
        od = out_dtype or dt
        out = self._empty(shape, od)
        if out.size == 0:
            return out
        cshape, (cst,) = coalesce(shape, strides)
        if len(cshape) > MAX_DIMS:
            raise ValueError(f"the OpenCL backend handles views of at most {MAX_DIMS} "
                             f"non-mergeable axes, got shape {shape}")
        rt = self.runtime
        rt.launch(self._elementwise(dt, od)["k_copy_s"], out.size, np.int32(out.size),
                  np.int32(len(cshape)), vec8(cshape), vec8(cst), np.int32(offset), x.data,
                  out.data)
        return out

    def _scatter(self, src: CLArray, out: CLArray, offset: int, shape: tuple[int, ...],
                 strides: tuple[int, ...]) -> None:
        """Write contiguous ``src`` into the strided view (offset, shape, strides) of ``out``."""
        if src.size == 0:
            return
        cshape, (cst,) = coalesce(shape, strides)
        if len(cshape) > MAX_DIMS:
            raise ValueError(f"the OpenCL backend handles views of at most {MAX_DIMS} "
                             f"non-mergeable axes, got shape {shape}")
        self.runtime.launch(self._elementwise(self._dt(src), self._dt(out))["copy_w"], src.size,
                            np.int32(src.size), np.int32(len(cshape)), vec8(cshape), vec8(cst),
                            np.int32(offset), src.data, out.data)

    def _contiguous_view(self, x: CLArray, perm: tuple[int, ...]) -> CLArray:
        st = contiguous_strides(x.shape)
        return self._gather(x, 0, tuple(x.shape[p] for p in perm), tuple(st[p] for p in perm))

    # --- host interop and creation ------------------------------------------------------
    def asarray(self, value: Any, dtype: str) -> CLArray:
        if isinstance(value, CLArray) and value.runtime is self.runtime:
            return value if self._dt(value) == dtype else self.cast(value, dtype)
        if hasattr(value, "get") and not isinstance(value, np.ndarray):
            value = value.get()  # another device's array (CuPy, PyOpenCL) via the host
        with np.errstate(over="ignore", invalid="ignore"):
            host = np.asarray(value, dtype=NP_DTYPES[dtype])
        return self.runtime.upload(host)

    def to_host(self, x: CLArray) -> np.ndarray:
        out = x.get()
        out.flags.writeable = False
        return out

    def full(self, shape: tuple[int, ...], value: float, dtype: str) -> CLArray:
        out = self._empty(shape, dtype)
        self.runtime.launch(self._elementwise(dtype, dtype)["fill"], out.size, np.int32(out.size),
                            self._scalar(value, dtype), out.data)
        return out

    def cast(self, x: CLArray, dtype: str) -> CLArray:
        out = self._empty(x.shape, dtype)
        self.runtime.launch(self._elementwise(self._dt(x), dtype)["k_copy"], x.size,
                            np.int32(x.size), x.data, out.data)
        return out

    def copy(self, x: CLArray) -> CLArray:
        return self.cast(x, self._dt(x))

    def _random(self, kernel: str, shape: tuple[int, ...], dtype: str, seed: int, p: float,
                q: float) -> CLArray:
        out = self._empty(shape, dtype)
        prog = self._prog("random.cl", ("O", dtype))
        self.runtime.launch(prog[kernel], out.size, np.int32(out.size),
                            np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.float32(p), np.float32(q),
                            out.data)
        return out

    def random_uniform(self, shape: tuple[int, ...], dtype: str, seed: int, minval: float,
                       maxval: float) -> CLArray:
        return self._random("random_uniform", shape, dtype, seed, minval, maxval - minval)

    def random_normal(self, shape: tuple[int, ...], dtype: str, seed: int, mean: float,
                      stddev: float) -> CLArray:
        return self._random("random_normal", shape, dtype, seed, mean, stddev)

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str,
                     seed: int) -> CLArray:
        return self._random("dropout_mask", shape, dtype, seed, rate, 1.0 / (1.0 - rate))

    # --- elementwise --------------------------------------------------------------------
    def _unary(self, op: str, x: CLArray, out: str | None = None) -> CLArray:
        dt = self._dt(x)
        od = out or dt
        o = self._empty(x.shape, od)
        try:
            kernel = self._elementwise(dt, od)[f"k_{op}"]
        except KeyError:
            raise TypeError(f"{op} is not defined for {dt} on the OpenCL backend") from None
        self.runtime.launch(kernel, x.size, np.int32(x.size), x.data, o.data)
        return o

    def _binary(self, op: str, a: Any, b: Any, out: str | None = None) -> CLArray:
        # The common case first, with no more Python than it needs: per-op host time is what
        # small tensors pay (the kernel of a same-shape, same-dtype pair is cached by its key).
        if (type(a) is CLArray and type(b) is CLArray and a.shape == b.shape
                and a.dtype == b.dtype):
            kernel = self._flat.get((op, a.dtype, out))
            if kernel is not None:
                rt = self._rt
                o = CLArray(rt, a.shape, NP_DTYPES[out] if out else a.dtype)
                rt.launch(kernel, o.size, np.int32(o.size), a.data, b.data, o.data)
                return o
        rt = self.runtime
        if isinstance(a, CLArray):
            dt = self._dt(a)
        elif isinstance(b, CLArray):
            dt = self._dt(b)
        else:
            raise TypeError(f"{op}: at least one operand must be a device array")
        od = out or dt
        try:
            prog = self._elementwise(dt, od)
            name = f"k_{op}"
            prog[name]
        except KeyError:
            raise TypeError(f"{op} is not defined for {dt} on the OpenCL backend") from None
        if not isinstance(b, CLArray):
            o = self._empty(a.shape, od)
            rt.launch(prog[name + "_as"], o.size, np.int32(o.size), a.data,
                      self._scalar(b, dt), o.data)
            return o
        if not isinstance(a, CLArray):
            o = self._empty(b.shape, od)
            rt.launch(prog[name + "_sa"], o.size, np.int32(o.size), self._scalar(a, dt),
                      b.data, o.data)
            return o
        if a.dtype != b.dtype:
            raise TypeError(f"{op}: operands of different dtypes ({dt}, {self._dt(b)}); the "
                            "core casts them to one dtype first")
        if a.shape == b.shape:
            o = self._empty(a.shape, od)
            self._flat[(op, a.dtype, out)] = prog[name]
            rt.launch(prog[name], o.size, np.int32(o.size), a.data, b.data, o.data)
            return o
        shape = _broadcast_shape(tuple(a.shape), tuple(b.shape))
        o = self._empty(shape, od)
        if o.size == 0:
            return o
        cshape, (sa, sb) = coalesce(shape, _broadcast_strides(a.shape, shape),
                                    _broadcast_strides(b.shape, shape))
        if len(cshape) > MAX_DIMS:
            raise ValueError(f"{op}: broadcasting over more than {MAX_DIMS} axes")
        rt.launch(prog[name + "_bc"], o.size, np.int32(o.size), np.int32(len(cshape)),
                  vec8(cshape), vec8(sa), vec8(sb), a.data, b.data, o.data)
        return o

    def add(self, a: Any, b: Any) -> CLArray:
        return self._binary("add", a, b)

    def subtract(self, a: Any, b: Any) -> CLArray:
        return self._binary("subtract", a, b)

    def multiply(self, a: Any, b: Any) -> CLArray:
        return self._binary("multiply", a, b)

    def divide(self, a: Any, b: Any) -> CLArray:
        return self._binary("divide", a, b)

    def power(self, a: Any, b: Any) -> CLArray:
        return self._binary("power", a, b)

    def maximum(self, a: Any, b: Any) -> CLArray:
        return self._binary("maximum", a, b)

    def minimum(self, a: Any, b: Any) -> CLArray:
        return self._binary("minimum", a, b)

    def equal(self, a: Any, b: Any) -> CLArray:
        return self._binary("equal", a, b, "bool")

    def not_equal(self, a: Any, b: Any) -> CLArray:
        return self._binary("not_equal", a, b, "bool")

    def less(self, a: Any, b: Any) -> CLArray:
        return self._binary("less", a, b, "bool")

    def less_equal(self, a: Any, b: Any) -> CLArray:
        return self._binary("less_equal", a, b, "bool")

    def greater(self, a: Any, b: Any) -> CLArray:
        return self._binary("greater", a, b, "bool")

    def greater_equal(self, a: Any, b: Any) -> CLArray:
        return self._binary("greater_equal", a, b, "bool")

    def logical_and(self, a: Any, b: Any) -> CLArray:
        return self._binary("logical_and", a, b, "bool")

    def logical_or(self, a: Any, b: Any) -> CLArray:
        return self._binary("logical_or", a, b, "bool")

    def logical_not(self, x: CLArray) -> CLArray:
        return self._unary("logical_not", x, "bool")

    def isfinite(self, x: CLArray) -> CLArray:
        return self._unary("isfinite", x, "bool")

    def negative(self, x: CLArray) -> CLArray:
        return self._unary("negative", x)

    def abs(self, x: CLArray) -> CLArray:
        return self._unary("abs", x)

    def sign(self, x: CLArray) -> CLArray:
        return self._unary("sign", x)

    def exp(self, x: CLArray) -> CLArray:
        return self._unary("exp", x)

    def log(self, x: CLArray) -> CLArray:
        return self._unary("log", x)

    def sqrt(self, x: CLArray) -> CLArray:
        return self._unary("sqrt", x)

    def square(self, x: CLArray) -> CLArray:
        return self._unary("square", x)

    def relu(self, x: CLArray) -> CLArray:
        return self._unary("relu", x)

    def sigmoid(self, x: CLArray) -> CLArray:
        return self._unary("sigmoid", x)

    def tanh(self, x: CLArray) -> CLArray:
        return self._unary("tanh", x)

    def erf(self, x: CLArray) -> CLArray:
        return self._unary("erf", x)

    def where(self, cond: CLArray, a: CLArray, b: CLArray) -> CLArray:
        dt = self._dt(a) if isinstance(a, CLArray) else self._dt(b)
        if not isinstance(a, CLArray):
            a = self.full((), a, dt)
        if not isinstance(b, CLArray):
            b = self.full((), b, dt)
        if self._dt(cond) != "bool":
            cond = self.cast(cond, "bool")
        prog = self._elementwise(dt, dt)
        if cond.shape == a.shape == b.shape:
            o = self._empty(a.shape, dt)
            self.runtime.launch(prog["where_flat"], o.size, np.int32(o.size), cond.data, a.data,
                                b.data, o.data)
            return o
        shape = _broadcast_shape(_broadcast_shape(tuple(cond.shape), tuple(a.shape)),
                                 tuple(b.shape))
        o = self._empty(shape, dt)
        if o.size == 0:
            return o
        cshape, (sc, sa, sb) = coalesce(shape, _broadcast_strides(cond.shape, shape),
                                        _broadcast_strides(a.shape, shape),
                                        _broadcast_strides(b.shape, shape))
        if len(cshape) > MAX_DIMS:
            raise ValueError(f"where: broadcasting over more than {MAX_DIMS} axes")
        self.runtime.launch(prog["where_bc"], o.size, np.int32(o.size), np.int32(len(cshape)),
                            vec8(cshape), vec8(sc), vec8(sa), vec8(sb), cond.data, a.data,
                            b.data, o.data)
        return o

    def bias_add(self, x: CLArray, bias: CLArray) -> CLArray:
        dt = self._dt(x)
        o = self._empty(x.shape, dt)
        c = int(bias.shape[0]) if bias.shape else 1
        self.runtime.launch(self._elementwise(dt, dt)["bias_add"], o.size, np.int32(o.size),
                            np.int32(c), x.data, bias.data, o.data)
        return o

    def relu_grad(self, g: CLArray, y: CLArray) -> CLArray:
        dt = self._dt(g)
        if self._dt(y) != dt:
            y = self.cast(y, dt)
        if tuple(y.shape) != tuple(g.shape):
            return self.multiply(g, self.cast(self.greater(y, 0), dt))
        o = self._empty(g.shape, dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", "int32"))
        self.runtime.launch(prog["relu_grad"], o.size, np.int32(o.size), g.data, y.data, o.data)
        return o

    # --- reductions ---------------------------------------------------------------------
    def _as_outer_k_inner(self, x: CLArray,
                          axis: Any) -> tuple[CLArray, int, int, int, tuple[int, ...]]:
        """``x`` (transposed if needed) as (outer, K, inner) with the reduced axes in K; and
        the kept shape."""
        shape = tuple(x.shape)
        nd = len(shape)
        axes = tuple(range(nd)) if axis is None else tuple(sorted(a % max(nd, 1) for a in axis))
        kept = tuple(d for i, d in enumerate(shape) if i not in axes)
        real = [a for a in axes if shape[a] != 1]
        if real and real != list(range(real[0], real[-1] + 1)) and any(
                shape[i] != 1 for i in range(real[0], real[-1] + 1) if i not in axes):
            # reduced axes are not adjacent: move them last
            perm = tuple(i for i in range(nd) if i not in axes) + axes
            x = self._contiguous_view(x, perm)
            return x, math.prod(kept), math.prod(shape[a] for a in axes), 1, kept
        if not real:
            return x, math.prod(kept), 1, 1, kept
        first, last = real[0], real[-1]
        outer = math.prod(shape[:first])
        inner = math.prod(shape[last + 1:])
        return x, outer, math.prod(shape[a] for a in axes), inner, kept

    def _reduce(self, kind: str, x: CLArray, axis: Any, keepdims: bool,
                mean: bool = False) -> CLArray:
        dt = self._dt(x)
        shape = tuple(x.shape)
        nd = len(shape)
        axes = tuple(range(nd)) if axis is None else tuple(a % max(nd, 1) for a in axis)
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        xv, outer, k, inner, _ = self._as_outer_k_inner(x, axis)
        if k == 0:
            if kind != "sum":
                raise ValueError(f"zero-size array to reduction operation {kind} which has no "
                                 "identity")
            return self.full(out_shape, math.nan if mean else 0, dt)
        acc = "float32" if dt in LOW else dt
        rt = self.runtime
        cur, cur_dt = xv, dt
        while True:
            cols = outer * inner
            if cols >= 1024 or k <= 64:
                chunk = k
            else:
                chunk = max(64, -(-k * cols // 4096))
            nchunks = -(-k // chunk)
            final = nchunks == 1
            od = dt if final else acc
            out = self._empty(out_shape if final else (outer, nchunks, inner), od)
            prog = self._prog("reduce.cl", ("A", cur_dt), ("O", od))
            scale = 1.0 / (math.prod(shape[a] for a in axes) or 1) if (mean and final) else 1.0
            rt.launch(prog[f"reduce_{kind}"], outer * nchunks * inner, np.int32(outer),
                      np.int32(k), np.int32(inner), np.int32(chunk), np.int32(nchunks),
                      SCALAR[cur_dt](scale if cur_dt in FLOATS else 1),
                      np.int32(bool(mean and final)), cur.data, out.data)
            if final:
                return out
            cur, cur_dt, k = out, od, nchunks

    def sum(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("sum", x, axis, keepdims)

    def mean(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("sum", x, axis, keepdims, mean=True)

    def max(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("max", x, axis, keepdims)

    def min(self, x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        return self._reduce("min", x, axis, keepdims)

    def argmax(self, x: CLArray, axis: int) -> CLArray:
        shape = tuple(x.shape)
        if not shape:
            return self.full((), 0, "int64")
        axis %= len(shape)
        if shape[axis] == 0:
            raise ValueError("attempt to get argmax of an empty sequence")
        outer, k, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        out = self._empty(shape[:axis] + shape[axis + 1:], "int64")
        prog = self._prog("reduce.cl", ("A", self._dt(x)), ("O", self._dt(x)))
        self.runtime.launch(prog["reduce_argmax"], outer * inner, np.int32(outer), np.int32(k),
                            np.int32(inner), x.data, out.data)
        return out

    # --- shapes and indexing ------------------------------------------------------------
    def reshape(self, x: CLArray, shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(x.size // known if d == -1 else d for d in shape)
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot reshape an array of size {x.size} into shape {shape}")
        return CLArray(x.runtime, shape, x.dtype, data=x.data, base=x)

    def transpose(self, x: CLArray, perm: tuple[int, ...]) -> CLArray:
        return self._contiguous_view(x, tuple(perm))

    def broadcast_to(self, x: CLArray, shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        return self._gather(x, 0, shape, _broadcast_strides(tuple(x.shape), shape))

    def concat(self, xs: list[CLArray], axis: int) -> CLArray:
        ref = tuple(xs[0].shape)
        axis %= len(ref)
        total = sum(int(x.shape[axis]) for x in xs)
        out_shape = (*ref[:axis], total, *ref[axis + 1:])
        out = self._empty(out_shape, self._dt(xs[0]))
        st = contiguous_strides(out_shape)
        start = 0
        for x in xs:
            self._scatter(x, out, start * st[axis], tuple(x.shape), st)
            start += int(x.shape[axis])
        return out

    def take(self, x: CLArray, indices: CLArray, axis: int) -> CLArray:
        indices = self._index_array(indices)
        shape = tuple(x.shape)
        axis %= len(shape)
        outer, size, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        out = self._empty((*shape[:axis], *indices.shape, *shape[axis + 1:]), self._dt(x))
        prog = self._prog("index.cl", ("A", self._dt(x)), ("O", self._dt(x)),
                          ("L", self._dt(indices)))
        rt = self.runtime
        rt.launch(prog["take"], out.size, np.int32(out.size), np.int32(size),
                  np.int32(indices.size), np.int32(inner), x.data, indices.data, out.data,
                  rt.error_record())
        del outer
        return out

    def take_grad(self, g: CLArray, indices: CLArray, axis: int,
                  shape: tuple[int, ...]) -> CLArray:
        indices = self._index_array(indices)
        dt = self._dt(g)
        shape = tuple(int(d) for d in shape)
        out = self.full(shape, 0, dt)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        prog = self._prog("index.cl", ("A", dt), ("O", dt), ("L", self._dt(indices)))
        rt = self.runtime
        rt.launch(prog["take_grad"], outer * inner, np.int32(outer), np.int32(shape[axis]),
                  np.int32(indices.size), np.int32(inner), g.data, indices.data, out.data,
                  rt.error_record())
        return out

    def _index_array(self, indices: Any) -> CLArray:
        if not isinstance(indices, CLArray):
            indices = self.asarray(np.asarray(indices), str(np.asarray(indices).dtype))
        if self._dt(indices) not in SIGNED + UNSIGNED:
            raise TypeError(f"indices must be integers, got {self._dt(indices)}")
        return indices

    def getitem(self, x: CLArray, key: tuple[Any, ...]) -> CLArray:
        offset, shape, strides = _view(tuple(x.shape), tuple(key))
        return self._gather(x, offset, shape, strides)

    def getitem_grad(self, g: CLArray, key: tuple[Any, ...],
                     shape: tuple[int, ...]) -> CLArray:
        shape = tuple(int(d) for d in shape)
        out = self.full(shape, 0, self._dt(g))
        offset, vshape, strides = _view(shape, tuple(key))
        if math.prod(vshape) != g.size:
            g = self.broadcast_to(g, vshape)
        self._scatter(g, out, offset, vshape, strides)
        return out

    def one_hot(self, indices: CLArray, depth: int, dtype: str) -> CLArray:
        indices = self._index_array(indices)
        out = self._empty((*indices.shape, depth), dtype)
        prog = self._prog("index.cl", ("A", dtype), ("O", dtype), ("L", self._dt(indices)))
        self.runtime.launch(prog["one_hot"], out.size, np.int32(out.size), np.int32(depth),
                            indices.data, out.data)
        return out

    # --- images (NHWC) ------------------------------------------------------------------
    def _image(self, kernel: str, dt: str, total: int, geometry: tuple[int, ...],
               *buffers: Any) -> None:
        prog = self._prog("image.cl", ("A", dt), ("O", dt))
        self.runtime.launch(prog[kernel], total, np.int32(total),
                            *(np.int32(v) for v in geometry), *buffers)

    def extract_patches(self, x: CLArray, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - kh) // sh + 1
        ow = (w + left + right - kw) // sw + 1
        out = self._empty((n, oh, ow, kh * kw * c), self._dt(x))
        self._image("extract_patches", self._dt(x), out.size,
                    (h, w, c, oh, ow, kh, kw, sh, sw, top, left), x.data, out.data)
        return out

    def extract_patches_grad(self, g: CLArray, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = (int(d) for d in x_shape)
        oh, ow = g.shape[1], g.shape[2]
        out = self._empty((n, h, w, c), self._dt(g))
        self._image("extract_patches_grad", self._dt(g), out.size,
                    (h, w, c, oh, ow, kh, kw, sh, sw, pads[0], pads[2]), g.data, out.data)
        return out

    def max_pool2d(self, x: CLArray, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - ph) // sh + 1
        ow = (w + left + right - pw) // sw + 1
        out = self._empty((n, oh, ow, c), self._dt(x))
        self._image("max_pool2d", self._dt(x), out.size,
                    (h, w, c, oh, ow, ph, pw, sh, sw, top, left), x.data, out.data)
        return out

    def max_pool2d_grad(self, g: CLArray, x: CLArray, y: CLArray, ph: int, pw: int, sh: int,
                        sw: int, pads: tuple[int, int, int, int]) -> CLArray:
        _, h, w, c = x.shape
        oh, ow = y.shape[1], y.shape[2]
        dt = self._dt(g)
        if self._dt(x) != dt:
            x, y = self.cast(x, dt), self.cast(y, dt)
        out = self._empty(tuple(x.shape), dt)
        self._image("max_pool2d_grad", dt, out.size,
                    (h, w, c, oh, ow, ph, pw, sh, sw, pads[0], pads[2]), g.data, x.data, y.data,
                    out.data)
        return out

    # --- softmax and losses -------------------------------------------------------------
    def _softmax(self, kernel: str, x: CLArray, axis: int) -> CLArray:
        dt = self._dt(x)
        shape = tuple(x.shape)
        if not shape:
            x = self.reshape(x, (1,))
            shape, axis = (1,), 0
        axis %= len(shape)
        outer, k, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        out = self._empty(tuple(x.shape), dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", "int32"))
        self.runtime.launch(prog[kernel], outer * inner, np.int32(outer), np.int32(k),
                            np.int32(inner), x.data, out.data)
        return out

    def softmax(self, x: CLArray, axis: int) -> CLArray:
        return self._softmax("softmax", x, axis)

    def log_softmax(self, x: CLArray, axis: int) -> CLArray:
        return self._softmax("log_softmax", x, axis)

    def sparse_softmax_cross_entropy(self, logits: CLArray,
                                     labels: CLArray) -> tuple[CLArray, CLArray]:
        # No host read here (it would stall every training step): an out-of-range label goes
        # to the device error record and raises ValueError at the next host read, at the latest
        # the loss-scale flag read that ends a loss-scaled step (whose NaN gradients make the
        # step skip), else the next numpy()/print/metric read or synchronize().
        labels = self._index_array(labels)
        dt = self._dt(logits)
        n, classes = (int(d) for d in logits.shape)
        loss = self._empty((n,), dt)
        probs = self._empty((n, classes), dt)
        rt = self.runtime
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", self._dt(labels)))
        rt.launch(prog["sparse_xent"], n, np.int32(n), np.int32(classes), logits.data,
                  labels.data, loss.data, probs.data, rt.error_record())
        return loss, probs

    def sparse_softmax_cross_entropy_grad(self, probs: CLArray, labels: CLArray,
                                          g: CLArray) -> CLArray:
        labels = self._index_array(labels)
        dt = self._dt(probs)
        if self._dt(g) != dt:
            g = self.cast(g, dt)
        out = self._empty(tuple(probs.shape), dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", self._dt(labels)))
        rt = self.runtime
        rt.launch(prog["sparse_xent_grad"], out.size, np.int32(out.size),
                  np.int32(probs.shape[1]), probs.data, labels.data, g.data, out.data,
                  rt.error_record())
        return out

    # --- loss scaling and optimizers ----------------------------------------------------
    def _flag(self) -> CLArray:
        return self.full((), 1, "bool")

    def unscale_and_check(self, grads: list[CLArray],
                          inv_scale: float) -> tuple[list[CLArray], CLArray]:
        flag = self._flag()
        outs = []
        for g in grads:
            o = self._empty(tuple(g.shape), "float32")
            prog = self._prog("optim.cl", ("A", self._dt(g)))
            self.runtime.launch(prog["unscale"], g.size, np.int32(g.size),
                                np.float32(inv_scale), g.data, o.data, flag.data)
            outs.append(o)
        return outs, flag

    def all_finite(self, xs: list[CLArray]) -> CLArray:
        flag = self._flag()
        for x in xs:
            prog = self._prog("optim.cl", ("A", self._dt(x)))
            self.runtime.launch(prog["all_finite"], x.size, np.int32(x.size), x.data, flag.data)
        return flag

    def _update_args(self, var: CLArray, grad: CLArray, flag: Any) -> tuple[Any, Any, Any]:
        dt = self._dt(var)
        if dt not in ("float32", "float64"):
            raise TypeError(f"optimizer kernels update float32/float64 master weights, got {dt}")
        if self._dt(grad) != dt:
            grad = self.cast(grad, dt)
        if flag is None:
            return grad, np.int32(0), var.data  # any buffer: the kernel does not read it
        return grad, np.int32(1), flag.data

    def sgd_update(self, var: CLArray, grad: CLArray, velocity: CLArray | None, lr: float,
                   momentum: float, nesterov: bool, flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        vel = velocity.data if velocity is not None else var.data
        self.runtime.launch(prog["sgd"], var.size, np.int32(var.size), np.float32(lr),
                            np.float32(momentum), np.int32(bool(nesterov)),
                            np.int32(velocity is not None), use_flag, fbuf, var.data, grad.data,
                            vel)

    def rmsprop_update(self, var: CLArray, grad: CLArray, ms: CLArray, mom: CLArray | None,
                       lr: float, rho: float, momentum: float, epsilon: float,
                       flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        self.runtime.launch(prog["rmsprop"], var.size, np.int32(var.size), np.float32(lr),
                            np.float32(rho), np.float32(momentum), np.float32(epsilon),
                            np.int32(mom is not None), use_flag, fbuf, var.data, grad.data,
                            ms.data, (mom if mom is not None else ms).data)

    def adam_update(self, var: CLArray, grad: CLArray, m: CLArray, v: CLArray, lr: float,
                    beta1: float, beta2: float, epsilon: float, step: int, weight_decay: float,
                    flag: Any) -> None:
        grad, use_flag, fbuf = self._update_args(var, grad, flag)
        prog = self._prog("optim.cl", ("A", self._dt(var)))
        alpha = lr * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
        self.runtime.launch(prog["adam"], var.size, np.int32(var.size), np.float32(lr),
                            np.float32(alpha), np.float32(beta1), np.float32(beta2),
                            np.float32(epsilon), np.float32(weight_decay), use_flag, fbuf,
                            var.data, grad.data, m.data, v.data)
