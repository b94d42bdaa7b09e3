"""Whether a CUDA GPU can be used, decided without importing CuPy or opening the driver (so
``import mpcore`` stays cheap with and without a GPU), and the GPUs CuPy sees."""

from __future__ import annotations

import glob
import importlib.util
import os
from functools import lru_cache
from typing import Any

from mpcore.core.backend import Device

from .rules import TENSOR_CORE_CAPABILITY


@lru_cache(maxsize=1)
def cupy_missing() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy not installed"
    return None


@lru_cache(maxsize=1)
def no_device() -> str | None:
    # The NVIDIA kernel driver exposes one node per GPU; no node, no CUDA device. WSL2 has
    # none of those: its GPUs come through /dev/dxg, with the driver's libcuda under
    # /usr/lib/wsl (a Windows host without an NVIDIA driver has /dev/dxg alone).
    if glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"):
        return None
    if glob.glob("/dev/dxg") and glob.glob("/usr/lib/wsl/lib/libcuda.so*"):
        return None
    return "no CUDA device"


def hidden_by_env() -> str | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return "no CUDA device (CUDA_VISIBLE_DEVICES hides every GPU)"
    return None


def device_table(runtime: Any) -> list[tuple[str, str, int, int]]:
    """(name, compute capability, SM count, total memory) of every GPU: getDeviceProperties
    needs no context, and these are fixed for the life of the process."""
    table = []
    for i in range(runtime.getDeviceCount()):
        props = runtime.getDeviceProperties(i)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        table.append((name, f"{props['major']}.{props['minor']}",
                      int(props["multiProcessorCount"]), int(props["totalGlobalMem"])))
    return table


def describe(index: int, name: str, cc: str, sms: int, total: int, free: int | None) -> Device:
    """The :class:`Device` of one GPU, with its tensor-core features."""
    major, minor = (int(p) for p in cc.split("."))
    features = {f"{dt}_tensor_cores" for dt, need in TENSOR_CORE_CAPABILITY.items()
                if (major, minor) >= need}
    return Device(name=name, vendor="NVIDIA", kind="gpu", capability=cc,
                  features=frozenset(features), index=str(index),
                  details={"compute_capability": cc, "sm_count": sms,
                           "memory_total": total, "memory_free": free})
