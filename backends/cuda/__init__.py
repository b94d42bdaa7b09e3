"""mpcore's CUDA backend (CuPy), registered through the ``mpcore`` entry point.

Importing this package does not import CuPy: the backend imports it when first used.
"""

from __future__ import annotations

import mpcore

from .backend import CudaBackend
from .rules import compatibility_check, cuda_policy_support, device_string
from .tensor_cores import TensorCoreWarning, check_tensor_core_dims

__all__ = ["CudaBackend", "TensorCoreWarning", "check_tensor_core_dims", "compatibility_check",
           "cuda_policy_support", "device_string"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [CudaBackend()]
