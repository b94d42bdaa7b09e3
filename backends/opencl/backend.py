"""The OpenCL backend (PyOpenCL)."""

from __future__ import annotations

import importlib.util
from functools import lru_cache

from mpcore.backend import Backend


@lru_cache(maxsize=1)
def _pyopencl_missing() -> str | None:
    if importlib.util.find_spec("pyopencl") is None:
        return "PyOpenCL not installed"
    return None


class OpenCLBackend(Backend):
    name = "opencl"
    priority = 200
    install_hint = 'pip install "mpcore[opencl]"'

    def unavailable_reason(self) -> str | None:
        return _pyopencl_missing()

    def auto_select(self) -> bool:
        return False  # until GPU detection lands, never chosen over the CPU backend
