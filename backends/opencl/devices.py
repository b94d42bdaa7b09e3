"""Finding OpenCL devices: a cheap look at the installed drivers (no pyopencl import), the full
enumeration (every platform and device), and the choice of one device.

Auto-selection happens at ``import mpcore`` and must not load pyopencl or open a driver, so it
reads the ICD registry instead: the ``*.icd`` files of ``/etc/OpenCL/vendors`` (or the
directory in ``OCL_ICD_VENDORS``) name the driver libraries installed. A GPU driver (Intel NEO,
AMD ROCm/Orange, NVIDIA, Mesa rusticl/clover, ARM Mali, Qualcomm Adreno, PowerVR) together with
a GPU device node (/dev/dri, /dev/kfd, /dev/nvidia*) means an OpenCL GPU: the backend is
auto-selected over the NumPy CPU backend. A CPU driver alone (PoCL, Intel's CPU runtime) never
is: on a CPU the NumPy backend is the better default, and ``MPCORE_BACKEND=opencl`` still uses
it. When the backend is activated, the chosen device is verified for real.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mpcore.backend import Device

# Substrings of ICD library names (lower case) that belong to GPU drivers.
GPU_DRIVERS = ("igdrcl", "intel-opencl", "amdocl", "rocm", "nvidia", "rusticl", "mesaopencl",
               "mali", "adreno", "pvr", "powervr")
CPU_DRIVERS = ("pocl", "intelocl", "intel-cpu", "libcpu")
GPU_NODES = ("/dev/dri/renderD*", "/dev/kfd", "/dev/nvidia[0-9]*", "/dev/mali*", "/dev/kgsl*")


@dataclass(frozen=True)
class Icd:
    """One installed OpenCL driver, as the ICD registry names it."""

    file: str
    library: str

    @property
    def is_gpu(self) -> bool:
        lib = os.path.basename(self.library).lower() + " " + os.path.basename(self.file).lower()
        return any(s in lib for s in GPU_DRIVERS) and not any(s in lib for s in CPU_DRIVERS)


def icd_dirs() -> list[str]:
    env = os.environ.get("OCL_ICD_VENDORS", "").strip()
    if env:
        return [env] if os.path.isdir(env) else []
    return ["/etc/OpenCL/vendors"]


def read_icds(dirs: Sequence[str] | None = None) -> list[Icd]:
    out = []
    for d in icd_dirs() if dirs is None else dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.icd"))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lib = f.read().strip()
            except OSError:
                continue
            out.append(Icd(path, lib))
    return out


def has_gpu_node() -> bool:
    return any(glob.glob(pattern) for pattern in GPU_NODES)


@lru_cache(maxsize=1)
def driver_missing() -> str | None:
    """Why no OpenCL driver can be here, or None (cheap: no driver is loaded)."""
    if importlib.util.find_spec("pyopencl") is None:
        return "PyOpenCL not installed"
    if read_icds() or importlib.util.find_spec("pocl_binary_distribution") is not None:
        return None
    return ("no OpenCL driver (ICD) found in " + ", ".join(icd_dirs())
            + '; install one, or PoCL with pip install "mpcore[pocl]"')


@lru_cache(maxsize=1)
def gpu_driver_present() -> bool:
    return any(icd.is_gpu for icd in read_icds()) and has_gpu_node()


# --- full enumeration (imports pyopencl) -----------------------------------------------
_KINDS = (("gpu", 4), ("accelerator", 8), ("cpu", 2))


def _kind(type_bits: int) -> str:
    for name, bit in _KINDS:
        if type_bits & bit:
            return name
    return "accelerator"


def describe(platform: Any, device: Any, index: str) -> Device:
    """An mpcore Device from a pyopencl platform and device."""
    ext = frozenset(device.extensions.split())
    return Device(
        name=device.name.strip(), vendor=device.vendor.strip(), kind=_kind(int(device.type)),
        capability=device.version.strip(), features=ext, index=index,
        details={"platform": platform.name.strip(),
                 "compute_units": int(device.max_compute_units),
                 "global_memory_bytes": int(device.global_mem_size),
                 "local_memory_bytes": int(device.local_mem_size),
                 "max_work_group_size": int(device.max_work_group_size),
                 "native_vector_width_half": int(device.native_vector_width_half),
                 "preferred_vector_width_half": int(device.preferred_vector_width_half),
                 "driver_version": device.driver_version.strip()})


def enumerate_devices() -> list[tuple[Device, Any]]:
    """Every device of every platform: (description, pyopencl device), index "p:d"."""
    import pyopencl as cl

    out = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader reports "no platform" as an error
        return []
    for p, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for d, device in enumerate(devices):
            out.append((describe(platform, device, f"{p}:{d}"), device))
    return out


_RANK = {"gpu": 0, "accelerator": 1, "cpu": 2}


def choose(found: Sequence[tuple[Device, Any]], wanted: str | None) -> tuple[Device, Any]:
    """The device named by ``wanted`` ("platform:device"), else the best one: a GPU first,
    then an accelerator, then a CPU; more compute units first within a kind."""
    if not found:
        raise RuntimeError("OpenCL finds no device here")
    if wanted:
        for desc, dev in found:
            if desc.index == wanted.strip():
                return desc, dev
        valid = "; ".join(f"{desc.index} = {desc.name} ({desc.kind})" for desc, _ in found)
        raise ValueError(f"MPCORE_OPENCL_DEVICE={wanted!r} names no OpenCL device; valid values "
                         f"(platform:device): {valid}")
    return min(found, key=lambda item: (_RANK.get(item[0].kind, 3),
                                        -int(item[0].details.get("compute_units", 0))))
