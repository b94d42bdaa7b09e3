"""The shared base of the array-library backends (NumPy on the CPU, CuPy on CUDA GPUs).

:class:`XpBackend` holds every kernel that NumPy and CuPy spell the same, written once against
``self.xp`` (the array module); ``mpcore_cpu`` and ``mpcore_cuda`` subclass it and override
only what differs: GEMM routes, conversions, buffer pools, raw kernels, devices and verdicts.
This package is a library those plugins import, not a plugin itself (it registers nothing).
"""

from __future__ import annotations

from .backend import XpBackend
from .dtypes import BF16, DTYPES, F16, F32, F64, I64, LOW

__all__ = ["BF16", "DTYPES", "F16", "F32", "F64", "I64", "LOW", "XpBackend"]
