"""The OpenCL runtime under the backend: one context and queue, a memory pool, the device error
record, and programs built from the ``kernels/*.cl`` templates once per (template, dtypes,
options, half variant) and cached with their kernel objects. The native array type,
:class:`CLArray`, and the layout helpers are in :mod:`mpcore_opencl.arrays` (importable without
pyopencl).

float16 slots come in two variants. "convert" (any device): stored as half, read and written
with ``vload_half``/``vstore_half_rte`` and computed in float32. "native" (``cl_khr_fp16``
devices): plain half loads and stores and half arithmetic (``X_CT`` is ``half``). Either way
``X_AT``, the accumulation type, is float32 for 16-bit dtypes: reductions, softmax and losses,
gradients that sum and every GEMM accumulate in float32 (Keras semantics), and scalars reach
kernels as float32 (``X_PT``), rounded to the dtype first by the host.
"""

from __future__ import annotations

import contextlib
import secrets
import warnings
from collections.abc import Callable, Sequence
from functools import cached_property
from importlib import resources
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.tools as cl_tools

from mpcore.core.backend import KernelBuildError

from .arrays import FLOATS, MAX_ITEMS, NP_DTYPES, CLArray

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
#: float16 with cl_khr_fp16 arithmetic ("native"): half loads and stores, rounded to nearest
#: even explicitly (a plain cast would use the device's default rounding mode).
_HALF_NATIVE = ("half", "half", "{p}[{i}]", "{p}[{i}] = convert_half_rte({v})")
FP16_PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
#: Codes of the device error record (common.cl ``record_error``): exception and message, with
#: the offending ``value`` and the axis ``size``; 256 + code marks an unsigned value. A kernel
#: that records one never dereferences the bad index; the host raises at its next read (see
#: ``Runtime.read``).
ERRORS: dict[int, tuple[type[Exception], str]] = {
    1: (IndexError, "take: index {value} is out of bounds for an axis of size {size} (valid "
                    "indices: -{size} to {last}); the gather wrote 0 there"),
    2: (IndexError, "take gradient: index {value} is out of bounds for an axis of size {size} "
                    "(valid indices: -{size} to {last}); its gradient was dropped"),
    3: (ValueError, "label {value} is out of range: labels must be in [0, {size}) for logits "
                    "with {size} classes (its loss and gradients are NaN)"),
}
#: Lines of a build log quoted in a KernelBuildError.
LOG_LINES = 12
_DETECTED = ("; found on the OpenCL device and reported at the first host read after the kernel "
             "that met it")


def slot_macros(slot: str, dtype: str, native_half: bool = False) -> str:
    """The LOAD_/STORE_/_ST/_CT/_AT/_PT/_FLOAT macros of one dtype slot (A, B, O ...); a
    float16 slot in the native-half variant when ``native_half``."""
    st, ct, load, store = _HALF_NATIVE if native_half and dtype == "float16" else _C[dtype]
    at = "float" if dtype in ("float16", "bfloat16") else _C[dtype][1]
    return "\n".join((
        f"#define {slot}_ST {st}", f"#define {slot}_CT {ct}", f"#define {slot}_AT {at}",
        f"#define {slot}_PT {at}",
        f"#define {slot}_FLOAT {int(dtype in FLOATS)}",
        f"#define {slot}_HALF {int(dtype == 'float16')}",
        f"#define {slot}_BF16 {int(dtype == 'bfloat16')}",
        f"#define {slot}_UNSIGNED {int(dtype.startswith('uint') or dtype == 'bool')}",
        f"#define LOAD_{slot}(p, i) ({load.format(p='(p)', i='(i)')})",
        f"#define STORE_{slot}(p, i, v) {store.format(p='(p)', i='(i)', v='v')}",
    ))


def _read_template(name: str) -> str:
    return resources.files(__package__).joinpath("kernels", name).read_text(encoding="utf-8")


#: NumPy dtypes of by-value kernel arguments, by OpenCL C type name (int8: a vector of 8 ints,
#: passed as raw bytes). Vector types not listed here go through pyopencl's generic path.
ARG_DTYPES: dict[str, Any] = {
    "char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16,
    "int": np.int32, "uint": np.uint32, "long": np.int64, "ulong": np.uint64,
    "float": np.float32, "double": np.float64, "int8": np.dtype((np.void, 32)),
}


class Program:
    """A built program and its kernel objects, fetched once.

    Each kernel is told its by-value argument types, so pyopencl packs scalars with
    ``struct.pack`` instead of its generic per-argument path: that cuts a small launch's host
    time about fourfold, which is most of a small op's cost.
    Intel's CPU runtime gives no argument info for a program that pyopencl loads from its binary
    cache (``arg_info`` False): those kernels stay on the generic path, which is slower per launch
    but correct, rather than paying an uncached rebuild (about a second per program) per process.

    A kernel asked for that the program lacks is not a KeyError at the call: a driver can build a
    program without some of its kernels (PoCL 3.0 does, for vector code its LLVM cannot lower,
    and a stale cache entry can do the same), so the runtime rebuilds the program once with
    every cache bypassed and raises :class:`~mpcore.KernelBuildError` if it is still missing.
    """

    __slots__ = ("_recover", "arg_info", "generic", "kernels", "log")

    def __init__(self, program: cl.Program, log: str = "",
                 recover: Callable[[Program, str], cl.Kernel] | None = None) -> None:
        self.kernels = {k.function_name: k for k in program.all_kernels()}
        declared = {name: _declare_scalar_args(k) for name, k in self.kernels.items()}
        #: kernels left on pyopencl's generic (slow) argument path
        self.generic = sorted(name for name, ok in declared.items() if not ok)
        #: whether the driver described the kernels' arguments
        self.arg_info = None not in declared.values()
        #: the build log (compiler warnings), kept for error messages
        self.log = log
        self._recover = recover

    def __getitem__(self, name: str) -> cl.Kernel:
        kernel = self.kernels.get(name)
        if kernel is None:
            if self._recover is None:
                raise KeyError(f"the program has no kernel {name!r}; it has: "
                               + (", ".join(sorted(self.kernels)) or "none"))
            kernel = self._recover(self, name)
        return kernel

    def adopt(self, other: Program) -> None:
        """Take ``other``'s kernels (a rebuild of the same source)."""
        self.kernels, self.generic, self.arg_info = other.kernels, other.generic, other.arg_info
        self.log = other.log


def _declare_scalar_args(kernel: cl.Kernel) -> bool | None:
    """Declare ``kernel``'s by-value argument types: True if done, False if an argument type is
    not packed here, None if the driver gives no argument info."""
    info = cl.kernel_arg_info
    try:
        types = []
        for i in range(kernel.num_args):
            if kernel.get_arg_info(i, info.ADDRESS_QUALIFIER) != \
                    cl.kernel_arg_address_qualifier.PRIVATE:
                types.append(None)  # a buffer
                continue
            name = kernel.get_arg_info(i, info.TYPE_NAME)
            if name not in ARG_DTYPES:
                return False  # an argument type we do not pack: keep the generic path
            types.append(ARG_DTYPES[name])
    except cl.Error:
        return None  # no argument info from this driver: the generic path still works
    kernel.set_scalar_arg_dtypes(types)
    return True


class Runtime:
    """Context, queue, memory pool and program cache of one OpenCL device."""

    def __init__(self, device: cl.Device) -> None:
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        self.fp64 = "cl_khr_fp64" in device.extensions
        self.fp16 = "cl_khr_fp16" in device.extensions
        self.max_wg = int(device.max_work_group_size)
        self.local = min(256, self.max_wg)
        self._programs: dict[tuple[Any, ...], Program] = {}
        self._templates: dict[str, str] = {}
        self._errors: Any = None  # the device error record (4 ints), made on first use
        self._armed = False  # a kernel that may record an error ran since the last check

    def allocate(self, nbytes: int) -> Any:
        return self.pool.allocate(nbytes)

    @cached_property
    def common(self) -> str:
        head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if self.fp64 else ""
        if ("portable computing language" in self.device.platform.name.lower()
                and self.device.type & cl.device_type.CPU):
            head += "#define MP_POCL 1\n"  # its builtins are calls on a CPU: see common.cl
        return head + _read_template("common.cl")

    def template(self, name: str) -> str:
        text = self._templates.get(name)
        if text is None:
            text = self._templates[name] = _read_template(name)
        return text

    def program(self, template: str, slots: tuple[tuple[str, str], ...], extra: str = "",
                options: tuple[str, ...] = (), native_half: bool = False) -> Program:
        """The program of ``template`` with dtype ``slots`` ((slot, dtype) pairs) and
        ``extra`` source appended (instantiations), its float16 slots in the native-half
        variant when ``native_half``; built on first use, then cached."""
        native_half = native_half and any(dtype == "float16" for _, dtype in slots)
        key = (template, slots, extra, options, native_half)
        prog = self._programs.get(key)
        if prog is None:
            for _, dtype in slots:
                if dtype == "float64" and not self.fp64:
                    raise TypeError(f"float64 needs cl_khr_fp64, which {self.device.name} "
                                    "lacks; valid dtypes here: float16, bfloat16, float32 and "
                                    "the integer types")
            if native_half and not self.fp16:
                raise ValueError(f"native-half kernels need cl_khr_fp16, which "
                                 f"{self.device.name.strip()} lacks")
            macros = "\n".join(slot_macros(slot, dtype, native_half) for slot, dtype in slots)
            head = FP16_PRAGMA if native_half else ""
            src = "\n".join((head + self.common, macros, self.template(template), extra))
            label = f"{template} ({', '.join(f'{s}={d}' for s, d in slots)})"
            prog = self._programs[key] = self._checked_build(label, src, options)
        return prog

    # --- building -----------------------------------------------------------------------
    def _build(self, label: str, src: str, options: Sequence[str],
               uncached: bool = False) -> Program:
        """Build ``src``; ``uncached`` adds a unique macro, which changes the cache key of
        pyopencl's binary cache and of the driver's own (PoCL's), so both are bypassed."""
        opts = ["-cl-kernel-arg-info", *options]  # argument info: fast launches (Program)
        if uncached:
            opts.append(f"-DMPCORE_UNCACHED_BUILD={secrets.token_hex(8)}")
        try:
            with warnings.catch_warnings():
                # a successful build's log (Intel's runtime always writes one) is noise here;
                # it is kept for the error when a kernel turns out missing
                warnings.simplefilter("ignore", cl.CompilerWarning)
                built = cl.Program(self.context, src).build(options=opts)
        except cl.Error as exc:
            raise KernelBuildError(self._failure(label, opts, f"did not build: {exc}", "")) \
                from exc
        log = ""
        with contextlib.suppress(cl.Error):  # no log from this driver: the message says so
            log = str(built.get_build_info(self.device, cl.program_build_info.LOG) or "")
        return Program(built, log, lambda prog, name: self._recover(prog, name, label, src,
                                                                     options))

    def _checked_build(self, label: str, src: str, options: Sequence[str]) -> Program:
        """Build, and rebuild once uncached if the driver gave a program with no kernels (a
        failed build is retried uncached too: a corrupt cache entry fails the same way)."""
        try:
            prog = self._build(label, src, options)
        except KernelBuildError:
            prog = self._build(label, src, options, uncached=True)
        if not prog.kernels:
            prog = self._build(label, src, options, uncached=True)
            if not prog.kernels:
                raise KernelBuildError(self._failure(
                    label, options, "built without any kernel, even with the caches bypassed",
                    prog.log))
        return prog

    def _recover(self, prog: Program, name: str, label: str, src: str,
                 options: Sequence[str]) -> cl.Kernel:
        """``prog`` lacks kernel ``name``: rebuild it uncached once; raise if still missing."""
        rebuilt = self._build(label, src, options, uncached=True)
        if name not in rebuilt.kernels:
            built = ", ".join(sorted(rebuilt.kernels)) or "none"
            raise KernelBuildError(self._failure(
                label, options, f"built without kernel {name!r} (it has: {built}), even with "
                "the caches bypassed", rebuilt.log))
        prog.adopt(rebuilt)
        return prog.kernels[name]

    def _failure(self, label: str, options: Sequence[str], what: str, log: str) -> str:
        """The KernelBuildError text: the program, the device and driver, options, log."""
        dev = self.device
        lines = [line for line in log.strip().splitlines() if line.strip()]
        shown = "\n    ".join(lines[:LOG_LINES]) if lines else "(empty)"
        if len(lines) > LOG_LINES:
            shown += f"\n    ... ({len(lines) - LOG_LINES} more lines)"
        return (f"OpenCL program {label} {what} on device {dev.name.strip()} "
                f"({dev.platform.name.strip()}, {dev.version.strip()}, driver "
                f"{dev.driver_version.strip()}); build options: {' '.join(options) or '-'}; "
                f"build log:\n    {shown}")

    # --- launching ----------------------------------------------------------------------
    def launch(self, kernel: cl.Kernel, n: int, *args: Any) -> None:
        """Run ``kernel`` over ``n`` work-items (1-D, rounded up to whole work-groups)."""
        if n <= 0:
            return
        if n > MAX_ITEMS:
            raise ValueError(f"{kernel.function_name}: {n} elements; the OpenCL kernels handle "
                             f"at most {MAX_ITEMS} per array")
        local = self.local
        kernel(self.queue, ((n + local - 1) // local * local,), (local,), *args)

    def launch_nd(self, kernel: cl.Kernel, global_size: tuple[int, ...],
                  local_size: tuple[int, ...], *args: Any) -> None:
        """Run ``kernel`` over an explicit N-D range. Every launch goes through :meth:`launch`
        or this (a traced step's replay records them here: :mod:`mpcore_opencl.replay`)."""
        kernel(self.queue, global_size, local_size, *args)

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
        """Wait for the queue; raise what a kernel recorded in the error record meanwhile."""
        self.queue.finish()
        if self._armed:
            record = np.empty(4, dtype=np.int32)
            cl.enqueue_copy(self.queue, record, self._errors, is_blocking=True)
            self._raise_recorded(record)

    # --- device-side errors -------------------------------------------------------------
    def error_record(self) -> Any:
        """The error record buffer for a kernel argument; arms the check at the next read."""
        if self._errors is None:
            self._errors = self.allocate(16)
            cl.enqueue_fill_buffer(self.queue, self._errors, np.int32(0), 0, 16)
        self._armed = True
        return self._errors

    def read(self, out: np.ndarray, data: Any) -> None:
        """Copy device ``data`` into ``out`` (a blocking read: the host's sync point). When a
        kernel that may record an error ran since the last check, the 16-byte record is read in
        the same wait (queued first, so the in-order queue completes both) and raised."""
        record = None
        if self._armed:
            record = np.empty(4, dtype=np.int32)
            cl.enqueue_copy(self.queue, record, self._errors, is_blocking=not out.size)
        if out.size:
            cl.enqueue_copy(self.queue, out, data, is_blocking=True)
        if record is not None:
            self._raise_recorded(record)

    def _raise_recorded(self, record: np.ndarray) -> None:
        self._armed = False
        code = int(record[0])
        if not code:
            return
        cl.enqueue_fill_buffer(self.queue, self._errors, np.int32(0), 0, 16)
        size = int(record[1])
        value = int(np.array(record[2:4]).view(np.uint64 if code & 256 else np.int64)[0])
        code &= 255
        kind, message = ERRORS.get(code, (RuntimeError, "unknown device error code " + str(code)))
        raise kind(message.format(value=value, size=size, last=size - 1) + _DETECTED)
