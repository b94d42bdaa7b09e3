"""The CPU backend: NumPy kernels, bfloat16 from ml_dtypes.

Every kernel NumPy and CuPy spell the same comes from :class:`mpcore_xp.XpBackend`; the mixins
here hold what is the CPU's own: conversions (:mod:`.creation`), 16-bit elementwise math under
an error state that keeps overflow quiet (:mod:`.elementwise`), 16-bit GEMMs through float32
(:mod:`.linalg`), relu's blocked backward pass (:mod:`.nn`), reductions without NumPy's
wrappers (:mod:`.reduce`), images (:mod:`.image`), the fused optimizer updates
(:mod:`.optim`) and the rewrite of traced steps (:mod:`.compile`). Large outputs come from a
buffer pool (:mod:`.pool`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import LOW, XpBackend

from mpcore.core.backend import Device, Support
from mpcore.plugins.extras import install_command

from .compile import compile_program
from .cpuinfo import cpu_device
from .creation import CpuCreation
from .elementwise import CpuElementwise, operands, quiet
from .float8 import CpuFloat8
from .image import CpuImage
from .indexing import CpuIndexing
from .linalg import CpuLinalg
from .nn import CpuNn
from .optim import CpuOptim
from .pool import POOL, default_limit
from .reduce import CpuReduce
from .rules import cpu_policy_support


class CpuBackend(CpuCreation, CpuElementwise, CpuLinalg, CpuNn, CpuReduce, CpuImage,
                 CpuIndexing, CpuOptim, CpuFloat8, XpBackend):
    """NumPy on the host CPU; always available."""

    name = "cpu"
    priority = 100
    install_hint = install_command()

    xp = np
    quiet_dtypes = LOW
    errstate = staticmethod(quiet)

    def _activate(self) -> None:
        default_limit()  # a bad MPCORE_CPU_POOL_MB fails the first use, naming the variable
        super()._activate()

    def operands(self, a: Any, b: Any) -> tuple[Any, Any]:
        return operands(a, b)

    def devices(self) -> list[Device]:
        return [cpu_device()]

    def policy_support(self, policy: str, device: Device) -> Support:
        return cpu_policy_support(policy, device.features, self.fast_dtypes_from_plugins())

    def buffer(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array for a kernel's output: large ones are recycled by
        :data:`POOL` (a training step reuses the memory of the previous one instead of
        faulting in fresh pages)."""
        return POOL.empty(shape, dtype)

    def compile_program(self, program: Any) -> Any:
        """A traced step rewritten where that gives the same bits with fewer calls
        (:mod:`.compile`), or None for the generic replay."""
        return compile_program(self, program)
