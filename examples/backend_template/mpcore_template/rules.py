"""The template's verdict rule: a pure function of a device description.

Keeping the rule free of any device access lets it be tested for hardware that is not present
(see tests/test_template.py): describe the device, ask the rule. Replace the facts below with
your hardware's.
"""

from __future__ import annotations

from mpcore import Device, Support
from mpcore.mixed_precision.policy import POLICIES

# The CPU flags a real 16-bit GEMM would need; the template's kernels use none of them.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")


def template_policy_support(policy: str, device: Device) -> Support:
    """Can ``policy`` run on ``device`` with the template's kernels, fast, and why."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid names: {', '.join(POLICIES)}")
    compute = POLICIES[policy][0]
    if compute in ("float32", "float64"):
        return Support(True, True, f"{compute} matmuls run through NumPy's BLAS in blocks")
    flags = BF16_FLAGS if compute == "bfloat16" else FP16_FLAGS
    present = [f for f in flags if f in device.features]
    if present:
        # Honest about hardware it leaves unused: that is where a real backend would gain.
        return Support(True, False,
                       f"{device.name} has {'/'.join(present)}, but the template computes "
                       f"{compute} in float32 blocks: expect float32 speed at best")
    return Support(True, False,
                   f"{compute} is stored in 16 bits and computed in float32 blocks (this device "
                   f"lacks {' and '.join(flags)}): expect float32 speed at best")
