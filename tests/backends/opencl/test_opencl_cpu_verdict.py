"""The OpenCL verdict for a CPU device says only what holds on every CPU (issue 33, item 10): it
said "a CPU without AVX512-BF16 or AMX" on a CPU that has both (the device description has no
CPU flags, and mpcore's OpenCL kernels compute 16-bit values in float32 on any CPU)."""

from __future__ import annotations

import pytest
from mpcore_opencl.rules import opencl_policy_support

from mpcore.core.backend import Device

POCL = Device(name="pthread-Intel Xeon Sapphire Rapids", vendor="GenuineIntel", kind="cpu",
              features=frozenset({"cl_khr_fp64"}), index="0:0")


@pytest.mark.parametrize("policy, wide", [("mixed_bfloat16", "AVX512-BF16 or AMX"),
                                          ("bfloat16", "AVX512-BF16 or AMX"),
                                          ("mixed_float16", "AVX512-FP16")])
def test_a_cpu_device_verdict_holds_whatever_the_cpu_has(policy: str, wide: str) -> None:
    support = opencl_policy_support(policy, POCL)
    assert support.supported and not support.fast
    assert "a CPU without" not in support.reason
    assert (f"mpcore's OpenCL kernels use no {wide} instructions, whether or not this CPU has "
            "them") in support.reason
    assert "computed in float32 (emulated)" in support.reason
