"""mpcore's OpenCL backend (PyOpenCL), registered through the ``mpcore`` entry point like any
third-party plugin. Importing it does not import pyopencl: that happens when the backend is
first used. Subclass :class:`OpenCLBackend` to extend it. Which module holds what, and what to
touch to add a kernel: ``README.md`` beside this file."""

from __future__ import annotations

import mpcore

from .backend import OpenCLBackend
from .devices import choose, describe, enumerate_devices, read_icds
from .rules import opencl_policy_support

__all__ = ["OpenCLBackend", "choose", "describe", "enumerate_devices", "opencl_policy_support",
           "read_icds"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [OpenCLBackend()]
