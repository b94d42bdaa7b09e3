"""The OpenCL backend (PyOpenCL): every kernel in OpenCL C, on any OpenCL device.

This module holds the backend's identity, its devices and verdicts, its activation (the device
opened, the float16 variant and the GEMM vector width settled) and its kernel table: the class
:class:`OpenCLBackend` is the kernel families' mixins put together. The module map, and what to
touch to add a kernel, are in ``README.md`` beside this file.

Arrays live in device buffers (:class:`~mpcore_opencl.arrays.CLArray`, always C-contiguous);
the host sees them only at the edges (``to_host``, printing, the loss-scale decision). Kernels
that take indices (gathers, labels) never follow an invalid one: they record it in a device
error record that the host reads along with its next read, and raise there (IndexError for
indices, ValueError for labels). bfloat16 is stored as 16-bit words converted in the kernel with
round-to-nearest-even and computed in float32. float16 is stored as half and runs in one of two
kernel variants (:mod:`mpcore_opencl.half`). Both accumulate reductions, softmax, losses and
GEMMs in float32. Device choice and auto-selection: see :mod:`mpcore_opencl.devices`.
"""

from __future__ import annotations

import os
from typing import Any

from mpcore.core.backend import Backend, BackendUnavailableError, Device, KernelBuildError, Support
from mpcore.plugins.extras import install_command

from . import devices as _devices
from .creation import CreationKernels
from .elementwise import ElementwiseKernels
from .float8 import Float8Kernels
from .half import HalfChoice, choose_half, half_mode, planned_half, unmeasured_half_choice
from .image import ImageKernels
from .linalg import LinalgKernels
from .nn import NNKernels
from .optim import OptimKernels
from .probe import WIDTH_ENV, ProbeResult, fixed_width, probe
from .programs import Key
from .reduce import ReduceKernels
from .rules import opencl_policy_support
from .shape import ShapeKernels

# The runtime (pyopencl) is imported on activation only: `import mpcore` must not load it.


class OpenCLBackend(CreationKernels, ElementwiseKernels, ReduceKernels, LinalgKernels,
                    ShapeKernels, NNKernels, ImageKernels, OptimKernels, Float8Kernels,
                    Backend):
    """OpenCL C kernels on one OpenCL device (a GPU when there is one). Its kernel table is
    the methods of the family mixins it is made of (one module each: creation, elementwise,
    reduce, linalg, shape, nn, image, optim)."""

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
        return planned_half(device)

    def half_choice(self) -> HalfChoice:
        """The float16 kernel variants on this backend's device, decided once: by
        ``MPCORE_OPENCL_HALF`` (native needs cl_khr_fp16), else convert on a device without
        cl_khr_fp16, else per kernel family by measuring
        (:func:`~mpcore_opencl.half.choose_half`)."""
        if self._half is None:
            self._half = choose_half(self)
        return self._half

    def compile_program(self, program: Any) -> Any:
        """A traced step as its recorded launches (:mod:`mpcore_opencl.replay`)."""
        from .replay import compile_program

        return compile_program(self.runtime, program)

    def synchronize(self) -> None:
        if self._rt is not None:
            self._rt.finish()

    def _activate(self) -> None:
        from .runtime import Runtime

        if self.unavailable_reason() is None and self._rt is None:
            desc = self.device()
            # a bad MPCORE_OPENCL_HALF fails here, not at a first float16 op
            if unmeasured_half_choice(half_mode(), desc) is not None:
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
