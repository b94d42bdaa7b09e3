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

A pip-installed Intel CPU runtime (``pip install intel-opencl-rt intel-cmplr-lib-rt``; it
exposes ``cl_khr_fp16``, which PoCL lacks) puts ``libintelocl.so`` in ``<prefix>/lib`` and an
``.icd`` file naming a conda build path that does not exist, so no ICD loader finds it. Before
mpcore first imports pyopencl (:func:`enumerate_devices`), :func:`expose_pip_runtimes` finds
the library through ``importlib.metadata`` and points ``OCL_ICD_VENDORS`` at a generated vendors
directory (under ``$XDG_CACHE_HOME/mpcore`` or ``~/.cache/mpcore``, named by a hash of its
contents) that lists the ``/etc/OpenCL/vendors`` drivers plus this one. Why a directory, found
by experiment with the ocl-icd in pyopencl's wheel: it ignores ``OCL_ICD_FILENAMES``; it reads
``OCL_ICD_VENDORS`` *instead of* ``/etc/OpenCL/vendors`` (a directory: its ``*.icd`` files; a
library path: that library alone, PoCL dropped), and always adds the PoCL it ships in
``pyopencl/.libs`` after a directory's drivers. A vendors directory is also what ocl-icd and the
Khronos loader of a system pyopencl read. A user's own ``OCL_ICD_VENDORS`` or
``OCL_ICD_FILENAMES`` is an explicit choice of drivers and is left exactly as set (add the path
from :func:`pip_cpu_runtime` to it to use the Intel runtime); so is a system whose vendors
directory already names an Intel CPU runtime. A process that initialises pyopencl's loader before
mpcore does will not see the runtime.

The Intel runtime is a CPU driver: never auto-selected over the NumPy backend, and among CPU
devices PoCL stays the default (see :func:`choose`).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mpcore.core.backend import Device
from mpcore.plugins.extras import install_command

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


#: Where the ICD loader looks for vendor files unless OCL_ICD_VENDORS names a folder.
SYSTEM_VENDORS = "/etc/OpenCL/vendors"


def icd_dirs() -> list[str]:
    env = os.environ.get("OCL_ICD_VENDORS", "").strip()
    if env:
        return [env] if os.path.isdir(env) else []
    return [SYSTEM_VENDORS]


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


#: The PyPI distribution of Intel's CPU OpenCL runtime, and its driver library.
INTEL_CPU_DIST = "intel-opencl-rt"
INTEL_CPU_LIBRARY = "libintelocl.so"


@lru_cache(maxsize=1)
def pip_cpu_runtime() -> str | None:
    """The real path of a pip-installed ``intel-opencl-rt``'s ``libintelocl.so``, or None."""
    try:
        dist = importlib.metadata.distribution(INTEL_CPU_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == INTEL_CPU_LIBRARY:
            path = os.path.realpath(str(dist.locate_file(file)))
            if os.path.isfile(path):
                return path
    return None


def _cache_root() -> list[str]:
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = xdg or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "mpcore"),
            os.path.join(tempfile.gettempdir(), f"mpcore-{os.getuid()}")]


def _write_vendors(entries: dict[str, str]) -> str | None:
    """A vendors directory holding ``entries`` (file name -> library), made atomically (a
    rename) so that concurrent processes never see it half written; None if none can be made."""
    digest = hashlib.sha1(repr(sorted(entries.items())).encode()).hexdigest()[:12]
    for root in _cache_root():
        final = os.path.join(root, f"opencl-vendors-{digest}")
        if os.path.isdir(final):
            return final
        try:
            os.makedirs(root, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".vendors-", dir=root)
            for name, library in entries.items():
                with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                    f.write(library + "\n")
            try:
                os.rename(tmp, final)
            except OSError:  # another process made it first
                for name in entries:
                    os.remove(os.path.join(tmp, name))
                os.rmdir(tmp)
            if os.path.isdir(final):
                return final
        except OSError:
            continue
    return None


def expose_pip_runtimes() -> str | None:
    """Let the ICD loader see a pip-installed Intel CPU runtime besides the system's drivers
    and PoCL (see the module docstring): sets ``OCL_ICD_VENDORS`` to a generated vendors
    directory and returns it; None (environment untouched) when there is no such runtime, the
    user set ``OCL_ICD_VENDORS``/``OCL_ICD_FILENAMES``, or the system already has one."""
    library = pip_cpu_runtime()
    if library is None or any(os.environ.get(var, "").strip()
                              for var in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES")):
        return None
    system = read_icds([SYSTEM_VENDORS])
    if any("intelocl" in os.path.basename(icd.library).lower() for icd in system):
        return None
    entries = {os.path.basename(icd.file): icd.library for icd in system}
    entries["mpcore-intel-cpu-pip.icd"] = library
    vendors = _write_vendors(entries)
    if vendors is not None:
        os.environ["OCL_ICD_VENDORS"] = vendors
        driver_missing.cache_clear()
        gpu_driver_present.cache_clear()
    return vendors


@lru_cache(maxsize=1)
def driver_missing() -> str | None:
    """Why no OpenCL driver can be here, or None (cheap: no driver is loaded)."""
    if importlib.util.find_spec("pyopencl") is None:
        return "PyOpenCL not installed"
    if (read_icds() or importlib.util.find_spec("pocl_binary_distribution") is not None
            or pip_cpu_runtime() is not None):
        return None
    return ("no OpenCL driver (ICD) found in " + ", ".join(icd_dirs())
            + "; install one, or PoCL with " + install_command("pocl"))


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
                 "max_work_item_sizes": [int(x) for x in device.max_work_item_sizes],
                 "native_vector_width_float": int(device.native_vector_width_float),
                 "preferred_vector_width_float": int(device.preferred_vector_width_float),
                 "native_vector_width_half": int(device.native_vector_width_half),
                 "preferred_vector_width_half": int(device.preferred_vector_width_half),
                 "driver_version": device.driver_version.strip()})


def enumerate_devices() -> list[tuple[Device, Any]]:
    """Every device of every platform: (description, pyopencl device), index "p:d"."""
    expose_pip_runtimes()  # before pyopencl's loader reads the vendors directory
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


def _is_pocl(desc: Device) -> bool:
    text = f"{desc.details.get('platform', '')} {desc.capability}".lower()
    return "portable computing language" in text or "pocl" in text


def choose(found: Sequence[tuple[Device, Any]], wanted: str | None) -> tuple[Device, Any]:
    """The device named by ``wanted`` ("platform:device"), else the best one: a GPU first,
    then an accelerator, then a CPU; more compute units first within a kind. Among CPU
    devices PoCL comes first whatever the platform order: it is the device mpcore's OpenCL
    suite runs on in CI, so installing another CPU runtime (Intel's, for cl_khr_fp16) changes
    nothing until MPCORE_OPENCL_DEVICE picks it. Ties keep the enumeration order."""
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
                                        item[0].kind == "cpu" and not _is_pocl(item[0]),
                                        -int(item[0].details.get("compute_units", 0))))
