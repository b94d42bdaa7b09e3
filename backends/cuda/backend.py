"""The CUDA backend (CuPy). Availability is decided without importing CuPy or opening the
driver, so that `import mpcore` stays cheap on machines with and without a GPU."""

from __future__ import annotations

import glob
import importlib.util
from functools import lru_cache

from mpcore.backend import Backend


@lru_cache(maxsize=1)
def _cupy_missing() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy not installed"
    return None


@lru_cache(maxsize=1)
def _no_device() -> str | None:
    # The NVIDIA kernel driver exposes one node per GPU; no node, no CUDA device.
    if not glob.glob("/dev/nvidia[0-9]*") and not glob.glob("/proc/driver/nvidia/gpus/*"):
        return "no CUDA device"
    return None


class CudaBackend(Backend):
    name = "cuda"
    priority = 300
    install_hint = 'pip install "mpcore[cuda]"'

    def unavailable_reason(self) -> str | None:
        return _cupy_missing() or _no_device()
