"""mpcore's CPU backend (NumPy), registered through the ``mpcore`` entry point like any
third-party plugin. Subclass :class:`CpuBackend` to extend it."""

from __future__ import annotations

import mpcore

from .backend import CpuBackend
from .cpuinfo import cpu_device, parse_cpuinfo
from .rules import cpu_policy_support

__all__ = ["CpuBackend", "cpu_device", "cpu_policy_support", "parse_cpuinfo"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [CpuBackend()]
