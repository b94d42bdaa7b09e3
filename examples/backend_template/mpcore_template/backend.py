"""TemplateBackend: the CPU backend with two kernels of its own, a device description and a
verdict rule.

It subclasses :class:`mpcore_cpu.CpuBackend`, so every kernel it does not define comes from the
NumPy reference backend; an author porting to new hardware replaces kernels one at a time and
runs ``mpcore conformance template`` after each. The two kernels overridden here show the
contract points that matter most:

- ``matmul``: 16-bit operands must accumulate in float32 and round once at the end. This one
  walks the K dimension in panels of :data:`BLOCK`, widening one panel at a time, so a 16-bit
  GEMM never holds float32 copies of whole operands.
- ``sigmoid`` (and ``tanh``): 16-bit inputs are computed in float32 and rounded once, which is
  more accurate than evaluating the formula in 16 bits; the result keeps the input's dtype, as
  every kernel must.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from mpcore import Device, Support
from mpcore_cpu import CpuBackend, cpu_device

from .rules import template_policy_support

#: K-panel width of the blocked matmul (elements).
BLOCK = 256

_WIDE = {np.dtype(np.float64): np.float64}


def _accumulator(dtype: np.dtype) -> Any:
    return _WIDE.get(dtype, np.float32)


@functools.lru_cache(maxsize=1)
def template_device() -> Device:
    """The device the template computes on: the host CPU, described in its own words."""
    cpu = cpu_device()
    return Device(name=f"template (NumPy) on {cpu.name}", vendor=cpu.vendor, kind="cpu",
                  capability=f"NumPy {np.__version__}", features=cpu.features,
                  details={"matmul_block": BLOCK, **dict(cpu.details)})


class TemplateBackend(CpuBackend):
    """A third-party backend built on the CPU backend."""

    name = "template"
    # Below the CPU backend: auto-detection never prefers the template over it.
    priority = 10
    install_hint = "pip install mpcore-backend-template"

    def auto_select(self) -> bool:
        # A template is chosen on purpose (MPCORE_BACKEND=template or mp.set_backend), never
        # by accident.
        return False

    def devices(self) -> list[Device]:
        return [template_device()]

    def policy_support(self, policy: str, device: Device) -> Support:
        return template_policy_support(policy, device)

    def matmul(self, a: np.ndarray, b: np.ndarray, transpose_a: bool,
               transpose_b: bool) -> np.ndarray:
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        dtype = a.dtype
        if dtype.kind in "biu":  # (bfloat16's kind is "V", not "f": test for integers)
            return np.matmul(a, b)
        wide = _accumulator(dtype)
        k = a.shape[-1]
        # Under loss scaling an Inf/NaN batch or a 16-bit overflow is expected (the step is
        # skipped), not a warning for the user.
        with np.errstate(over="ignore", invalid="ignore"):
            if k <= BLOCK:
                out = np.matmul(a.astype(wide, copy=False), b.astype(wide, copy=False))
            else:
                out = np.zeros((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2],
                                b.shape[-1]), dtype=wide)
                partial = np.empty_like(out)
                for k0 in range(0, k, BLOCK):
                    np.matmul(a[..., k0:k0 + BLOCK].astype(wide, copy=False),
                              b[..., k0:k0 + BLOCK, :].astype(wide, copy=False), out=partial)
                    out += partial
            return out.astype(dtype, copy=False)

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        wide = x.astype(_accumulator(x.dtype), copy=False)
        # exp(-|x|) never overflows, and e / (1 + e) for x < 0 avoids the cancellation of
        # 1 - something-near-1 (0.5 * (1 + tanh(x / 2)) loses 1e-4 relative at x = -8)
        with np.errstate(invalid="ignore"):  # nan in, nan out
            e = np.exp(-np.abs(wide))
            out = np.where(wide >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        return out.astype(x.dtype, copy=False)

    def tanh(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x.astype(_accumulator(x.dtype), copy=False)).astype(x.dtype, copy=False)
