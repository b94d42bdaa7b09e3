"""mpcore's CUDA backend (CuPy), registered through the ``mpcore`` entry point."""

from __future__ import annotations

import mpcore

from .backend import CudaBackend

__all__ = ["CudaBackend"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [CudaBackend()]
