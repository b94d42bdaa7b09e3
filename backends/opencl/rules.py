"""Verdict rules for OpenCL devices: pure functions of a device description (testable for
devices that are not here).

- float16 arithmetic needs ``cl_khr_fp16``; without it the backend stores float16 and computes
  in float32 (``vload_half``/``vstore_half`` are core OpenCL), which is supported but not fast.
  With it, float16 is fast only on a GPU whose half throughput is native: the driver reports a
  native half vector width > 0, or the GPU is a known double-rate family (Intel Xe/Arc, AMD
  GCN5/Vega and later). NVIDIA exposes ``cl_khr_fp16`` through OpenCL on some drivers, but its
  OpenCL stack has no tensor-core path, so mpcore's kernels run it at float32 speed.
- bfloat16 is fast only where a matrix engine is exposed
  (``cl_intel_subgroup_matrix_multiply_accumulate``) *and* mpcore's kernels use it. They do not
  yet: bfloat16 is stored in 16 bits and computed in float32, supported but not fast.
- A CPU device (PoCL, Intel's CPU runtime): supported, never fast; 16-bit values are converted
  to float32 for every operation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpcore.backend import Device, Support
from mpcore.policy import POLICIES

FP16 = "cl_khr_fp16"
INTEL_MATRIX = "cl_intel_subgroup_matrix_multiply_accumulate"
#: Whether mpcore's kernels drive the Intel matrix engine (they do not yet).
USES_INTEL_MATRIX = False

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


def opencl_policy_support(policy: str, device: Device) -> Support:
    """Judge ``policy`` on the OpenCL ``device`` (its kind, extensions and details)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid names: {', '.join(POLICIES)}")
    compute = POLICIES[policy][0]
    ext = device.features
    where = f"{device.name} ({device.kind}, OpenCL)"
    if compute == "float32":
        return Support(True, True, f"float32 runs natively on {where}")
    if compute == "float64":
        if "cl_khr_fp64" in ext:
            return Support(True, device.kind == "cpu",
                           f"float64 runs through cl_khr_fp64 on {where}"
                           + ("" if device.kind == "cpu" else
                              " (most GPUs run float64 at a small fraction of float32 speed)"))
        return Support(False, False, f"{where} lacks cl_khr_fp64: float64 cannot run on it")
    if device.kind == "cpu":
        return Support(True, False,
                       f"{where} is a CPU device: {compute} is stored in 16 bits and every "
                       "operation converts it to float32 (emulated; expect float32 speed at "
                       "best, and the NumPy cpu backend is usually faster on a CPU)")
    if compute == "float16":
        if FP16 not in ext:
            return Support(True, False,
                           f"{where} lacks {FP16}: float16 is stored in 16 bits "
                           "(vload_half/vstore_half) and computed in float32, so it saves memory "
                           "but is not faster than float32")
        if "nvidia" in device.vendor.lower():
            return Support(True, False,
                           f"{where} exposes {FP16}, but NVIDIA's OpenCL has no tensor-core path: "
                           "float16 matmuls run at float32 speed here; use the cuda backend "
                           '(pip install "mpcore[cuda]") for fast float16 on NVIDIA GPUs')
        if not _native_half(device.details, device.name, device.vendor):
            return Support(True, False,
                           f"{where} has {FP16} but reports no native half vector width: its "
                           "float16 arithmetic is not faster than float32")
        return Support(True, True,
                       f"{where} has {FP16} with native half throughput: float16 arithmetic "
                       "runs at up to twice the float32 rate, and 16-bit storage halves memory "
                       "traffic")
    # bfloat16
    if INTEL_MATRIX in ext and USES_INTEL_MATRIX:
        return Support(True, True, f"bfloat16 matmuls run on the XMX matrix engine of {where} "
                                   f"through {INTEL_MATRIX}")
    if INTEL_MATRIX in ext:
        return Support(True, False,
                       f"{where} exposes {INTEL_MATRIX}, but mpcore's OpenCL kernels do not use "
                       "it yet: bfloat16 is stored in 16 bits and computed in float32 (saves "
                       "memory, not faster than float32)")
    return Support(True, False,
                   f"{where} has no bfloat16 matrix engine exposed to OpenCL "
                   f"({INTEL_MATRIX}): bfloat16 is stored in 16 bits and computed in float32 "
                   "(saves memory, not faster than float32)")
