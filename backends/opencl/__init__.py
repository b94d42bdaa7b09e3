"""mpcore's OpenCL backend (PyOpenCL), registered through the ``mpcore`` entry point."""

from __future__ import annotations

import mpcore

from .backend import OpenCLBackend

__all__ = ["OpenCLBackend"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [OpenCLBackend()]
