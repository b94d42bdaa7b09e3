"""Verdict rules for OpenCL devices: pure functions of a device description and of what
mpcore's kernels do on it (testable for devices that are not here).

"Fast" needs both the hardware and kernels that use it; the reasons say what actually runs.

- float16 runs in one of two kernel variants. "convert" stores float16 and reads/writes it with
  ``vload_half``/``vstore_half`` (core OpenCL), computing every op, matmuls included, in
  float32: that halves memory traffic and memory use, but compute-bound work runs at float32
  speed. "native" (needs ``cl_khr_fp16``) computes elementwise ops in half and keeps GEMM tiles
  in half, accumulating in float32. float16 is fast only on a GPU with ``cl_khr_fp16`` and
  native half throughput (a native half vector width > 0, or a known double-rate family: Intel
  Xe/Arc, AMD GCN5/Vega and later) where the native kernels run (``native_half_kernels``: the
  backend's choice for the device, ``MPCORE_OPENCL_HALF`` or its measurement; ``half_note``
  says why). NVIDIA's OpenCL has no tensor-core path, so it is never fast there.
- bfloat16 is fast only where a matrix engine is exposed
  (``cl_intel_subgroup_matrix_multiply_accumulate``) *and* the backend's kernels use it
  (``matrix_kernels``; they do not yet): otherwise stored in 16 bits, computed in float32.
- A CPU device (PoCL, Intel's CPU runtime): supported, never fast. The convert kernels run
  there unless native is forced; a CPU without AVX512-FP16 converts half to float32 for the
  arithmetic either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpcore.core.backend import Device, Support
from mpcore.mixed_precision.policy import POLICIES
from mpcore.plugins.extras import install_command

FP16 = "cl_khr_fp16"
INTEL_MATRIX = "cl_intel_subgroup_matrix_multiply_accumulate"
#: Whether mpcore's kernels drive the Intel matrix engine (they do not yet).
USES_INTEL_MATRIX = False
#: Whether mpcore has native-half (cl_khr_fp16 arithmetic) kernels: it does, and a device
#: described without a decision is judged as if they run where the hardware qualifies.
NATIVE_HALF_KERNELS = True
_STORAGE = ("is stored in 16 bits and computed in float32 by every op, matmuls included: that "
            "halves memory traffic and memory use, but compute-bound work runs at float32 "
            "speed")

# GPU families with double-rate half arithmetic, matched in the lower-cased device name when
# the driver reports no native half width.
FAST_HALF_GPUS = ("arc", "xe", "iris xe", "data center gpu", "uhd graphics 7", "vega", "gfx9",
                  "gfx10", "gfx11", "gfx12", "radeon rx 6", "radeon rx 7", "radeon rx 9",
                  "radeon pro w6", "radeon pro w7", "instinct", "mi100", "mi200", "mi250",
                  "mi300")


def _native_half(details: Mapping[str, Any], name: str, vendor: str) -> bool:
    if int(details.get("native_vector_width_half", 0) or 0) > 0:
        return True
    text = f"{name} {vendor}".lower()
    return any(family in text for family in FAST_HALF_GPUS)


def opencl_policy_support(policy: str, device: Device, *,
                          native_half_kernels: bool = NATIVE_HALF_KERNELS,
                          matrix_kernels: bool = USES_INTEL_MATRIX,
                          half_note: str = "") -> Support:
    """Judge ``policy`` on the OpenCL ``device`` (its kind, extensions and details), given
    whether the backend runs native-half kernels (``native_half_kernels``, ignored without
    cl_khr_fp16) and matrix-engine bfloat16 kernels (``matrix_kernels``) on it; ``half_note``
    (why that float16 variant) goes into float16 reasons."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid names: {', '.join(POLICIES)}")
    compute = POLICIES[policy][0]
    ext = device.features
    where = f"{device.name} ({device.kind}, OpenCL)"
    if policy == "mixed_float8":
        other = opencl_policy_support("mixed_bfloat16", device, native_half_kernels=False,
                                      matrix_kernels=matrix_kernels)
        return Support(other.supported, False,
                       f"FP8 is emulated on {where}: OpenCL C has no FP8 type, so codes are "
                       "encoded and decoded by hand and GEMMs multiply the exact values in "
                       "float32 (correct, not faster than float32); other ops as "
                       f"mixed_bfloat16: {other.reason}")
    if compute == "float32":
        return Support(True, True, f"float32 runs natively on {where}")
    if compute == "float64":
        if "cl_khr_fp64" in ext:
            return Support(True, device.kind == "cpu",
                           f"float64 runs through cl_khr_fp64 on {where}"
                           + ("" if device.kind == "cpu" else
                              " (most GPUs run float64 at a small fraction of float32 speed)"))
        return Support(False, False, f"{where} lacks cl_khr_fp64: float64 cannot run on it")
    native = native_half_kernels and FP16 in ext and compute == "float16"
    why = f" ({half_note})" if half_note and compute == "float16" else ""
    if device.kind == "cpu":
        # Only what holds on every CPU: the device description has no CPU flags, and the
        # kernels' arithmetic does not depend on them (the verdict once said "a CPU without
        # AVX512-BF16 or AMX" on a CPU that has both)
        wide = "AVX512-FP16" if compute == "float16" else "AVX512-BF16 or AMX"
        kernels = ("mpcore's native-half kernels" if native else
                   "kernels that compute it in float32, matmuls included")
        return Support(True, False,
                       f"{where} is a CPU device: {compute} is stored in 16 bits, which halves "
                       f"memory traffic, and runs {kernels}{why}; mpcore's OpenCL kernels use "
                       f"no {wide} instructions, whether or not this CPU has them, so 16-bit "
                       "values are computed in float32 (emulated) and it is not faster than "
                       "float32 (the NumPy cpu backend, with oneDNN's bfloat16 GEMM where the "
                       "CPU has AVX512-BF16 or AMX, is usually faster on a CPU)")
    if compute == "float16":
        if FP16 not in ext:
            return Support(True, False, f"{where} lacks {FP16}: float16 {_STORAGE}{why}")
        if "nvidia" in device.vendor.lower():
            return Support(True, False,
                           f"{where} exposes {FP16}{why}, but NVIDIA's OpenCL has no tensor-core "
                           "path: "
                           "float16 matmuls run at float32 speed here; use the cuda backend "
                           f"({install_command('cuda')}) for fast float16 on NVIDIA GPUs")
        if not _native_half(device.details, device.name, device.vendor):
            return Support(True, False,
                           f"{where} has {FP16} but reports no native half vector width: its "
                           f"half arithmetic is not faster than float32{why}; float16 "
                           f"{_STORAGE}")
        if not native:
            return Support(True, False,
                           f"{where} has {FP16} with native half throughput, but mpcore runs its "
                           f"convert kernels on it{why}: float16 {_STORAGE}")
        return Support(True, True,
                       f"{where} has {FP16} with native half throughput and mpcore runs "
                       f"native-half kernels on it{why}: float16 arithmetic runs at up to twice "
                       "the float32 rate, GEMM tiles are staged in half, and 16-bit storage "
                       "halves memory traffic")
    # bfloat16
    if INTEL_MATRIX in ext and matrix_kernels:
        return Support(True, True, f"bfloat16 matmuls run on the XMX matrix engine of {where} "
                                   f"through {INTEL_MATRIX}")
    if INTEL_MATRIX in ext:
        return Support(True, False,
                       f"{where} exposes {INTEL_MATRIX}, but mpcore's OpenCL kernels do not use "
                       f"it yet: bfloat16 {_STORAGE}")
    return Support(True, False,
                   f"{where} has no bfloat16 matrix engine exposed to OpenCL "
                   f"({INTEL_MATRIX}): bfloat16 {_STORAGE}")
