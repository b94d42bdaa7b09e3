"""The CUDA backend: CuPy arrays, cuBLAS GEMMs, and the RawModule kernels of ``kernels.cu``.

Every kernel NumPy and CuPy spell the same comes from :class:`mpcore_xp.XpBackend` (the part
the CPU suite exercises); the mixins here hold what is CUDA's own, one module per op family:
casts and random numbers (:mod:`.creation`), relu/sigmoid/erf kernels and CuPy's bfloat16
operand rules (:mod:`.elementwise`), float32-accumulating reductions (:mod:`.reduce`), cuBLAS
GEMM routes (:mod:`.linalg`), ``take_grad`` (:mod:`.shape`), images (:mod:`.image`), softmax,
cross-entropy and relu's backward (:mod:`.nn`), the multi-tensor unscale-and-check and the fused
optimizer updates (:mod:`.optim`).

Availability is decided without importing CuPy (:mod:`.devices`); CuPy is imported when the
backend is first used. No kernel reads device memory from the host: a training step's one
device-to-host read is the loss-scale decision, when the core converts the flag that
``unscale_and_check`` returns to a Python bool; the fused optimizer kernels read that flag on
the device.

Needs CuPy (13 for float16; 14 for bfloat16, through ml_dtypes) and nothing else.
"""

from __future__ import annotations

import importlib
from typing import Any

from mpcore_xp import XpBackend

from mpcore.core.backend import Device, Support
from mpcore.plugins.extras import install_command

from .creation import CudaCreation
from .devices import cupy_missing, describe, device_table, hidden_by_env, no_device
from .elementwise import CudaElementwise
from .float8 import CudaFloat8
from .image import CudaImage
from .linalg import CudaLinalg
from .nn import CudaNn
from .optim import CudaOptim
from .reduce import CudaReduce
from .rules import compatibility_check, cuda_policy_support
from .shape import CudaShape
from .tensor_cores import check_tensor_core_dims


class CudaBackend(CudaCreation, CudaElementwise, CudaReduce, CudaLinalg, CudaShape, CudaImage,
                  CudaNn, CudaOptim, CudaFloat8, XpBackend):
    """NVIDIA GPUs through CuPy (device 0, or CuPy's current device)."""

    name = "cuda"
    priority = 300
    install_hint = install_command("cuda")

    #: CuPy never warns on overflow, so no kernel needs an error state.
    quiet_dtypes: frozenset[Any] = frozenset()

    _cupy: Any = None
    _static_devices: list[tuple[str, str, int, int]] | None = None

    # --- availability and devices -------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        # the GPU first: without one (or with every one hidden) CuPy is not what is missing
        return hidden_by_env() or no_device() or cupy_missing()

    def install_advice(self) -> str:
        # a pip command only where a GPU is there and CuPy is what it lacks
        missing = cupy_missing()
        return self.install_hint if missing and self.unavailable_reason() == missing else ""

    @property
    def cp(self) -> Any:
        """The cupy module, imported on first use."""
        if self._cupy is None:
            self._cupy = importlib.import_module("cupy")
        return self._cupy

    @property
    def xp(self) -> Any:  # type: ignore[override]
        return self.cp

    def cupy_version(self) -> tuple[int, int] | None:
        parts = str(self.cp.__version__).split(".")
        try:
            return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
        except (IndexError, ValueError):
            return None

    def _device_table(self) -> list[tuple[str, str, int, int]]:
        if self._static_devices is None:
            self._static_devices = device_table(self.cp.cuda.runtime)
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
            free = int(self.cp.cuda.runtime.memGetInfo()[0]) if i == current else None
            out.append(describe(i, name, cc, sms, total, free))
        return out

    def device(self) -> Device:
        devices = self.devices()
        if not devices:
            return super().device()  # raises, naming the backend
        current = self.cp.cuda.runtime.getDevice()
        return devices[current] if current < len(devices) else devices[0]

    def policy_support(self, policy: str, device: Device) -> Support:
        return cuda_policy_support(policy, device.capability, self.cupy_version(),
                                   self._cublaslt_reason(policy))

    def compatibility_message(self, policy: str) -> tuple[bool, str]:
        """The guide's text, speaking of every GPU of the host."""
        return compatibility_check(policy, self.devices(), self.cupy_version(),
                                   self._cublaslt_reason(policy))

    @staticmethod
    def _cublaslt_reason(policy: str) -> str | None:
        """Why FP8 GEMMs cannot use cuBLASLt here (mixed_float8 only: it loads the library)."""
        if policy != "mixed_float8":
            return None
        from .cublaslt import unavailable_reason

        return unavailable_reason()

    def layer_hint(self, layer_name: str, dims: Any, policy: Any) -> None:
        """The tensor-core tip: warn once per layer when a dimension is not a multiple of 8."""
        check_tensor_core_dims(layer_name, dims, policy)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    #: Whether traced steps capture CUDA graphs (``MPCORE_CUDA_GRAPHS=0`` turns them off too).
    graphs = True

    def compile_program(self, program: Any) -> Any:
        """A traced step's runs of kernel calls as CUDA graphs (:mod:`.graphs`; the plan in
        :mod:`.graph_plan`), or the default replay where nothing can be captured."""
        from .graphs import compile_program

        return compile_program(self, program)

    def _contig(self, x: Any) -> Any:
        """``x`` C-contiguous, as every ``kernels.cu`` kernel reads its operands. (Not
        ``ascontiguousarray`` alone: it makes a 0-d array 1-d, as NumPy's does.)"""
        return x if x.flags.c_contiguous else self.cp.ascontiguousarray(x)
