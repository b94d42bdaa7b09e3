"""Verdict rules for CPUs: pure functions of the CPU's feature flags (testable anywhere).

NumPy has no float16 or bfloat16 GEMM (its float16 matmul is a slow scalar loop), so the
CPU backend computes 16-bit matmuls through float32 GEMM: supported, never faster than float32.
A policy is fast only when a plugin kernel set (``KernelSet.fast_dtypes``) provides a real
16-bit GEMM *and* the CPU has the instructions it needs.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpcore.core.backend import Support
from mpcore.mixed_precision.policy import POLICIES
from mpcore.plugins.extras import install_command

# The instructions that make a 16-bit matmul faster than float32 on a CPU.
FAST_FLAGS: dict[str, tuple[str, ...]] = {
    "bfloat16": ("avx512_bf16", "amx_bf16"),
    "float16": ("avx512_fp16", "amx_fp16"),
}


def cpu_policy_support(policy: str, features: frozenset[str],
                       fast_kernels: Mapping[str, str] | None = None) -> Support:
    """Judge ``policy`` on a CPU with ``features`` (its /proc/cpuinfo flags), given the
    16-bit dtypes that plugin kernels run fast (dtype -> who provides them)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid names: {', '.join(POLICIES)}")
    if policy == "mixed_float8":
        return Support(True, False,
                       "FP8 is emulated on the CPU: GEMM operands are quantised to FP8 codes "
                       "(float8_e4m3fn/e5m2 through ml_dtypes), decoded exactly and multiplied "
                       "in float32 (correct, not faster than float32); other ops as "
                       "mixed_bfloat16: "
                       + cpu_policy_support("mixed_bfloat16", features, fast_kernels).reason)
    compute = POLICIES[policy][0]
    if compute in ("float32", "float64"):
        return Support(True, True,
                       f"{compute} runs at full speed on the CPU's SIMD units (BLAS GEMM)")
    flags = FAST_FLAGS[compute]
    have = [f for f in flags if f in features]
    provider = (fast_kernels or {}).get(compute)
    if provider and have:
        return Support(True, True, f"{compute} matmuls run on {'/'.join(have)} through {provider}")
    if provider:
        return Support(True, False,
                       f"{provider} is installed but this CPU lacks {' and '.join(flags)}: its "
                       f"{compute} matmul would be emulated, so matmuls run in float32")
    if have:
        return Support(True, False,
                       f"this CPU has {'/'.join(have)} but NumPy has no {compute} GEMM: {compute} "
                       "is stored in 16 bits and matmuls are computed in float32 (expect float32 "
                       "speed at best)"
                       + (f"; {install_command('onednn')} adds a kernel that uses them"
                          if compute == "bfloat16" else ""))
    return Support(True, False,
                   f"this CPU lacks {' and '.join(flags)}: {compute} is stored in 16 bits and "
                   "computed in float32 (emulated; expect float32 speed at best)")
