"""What the CPU backend's elementwise kernels add to the shared ones: NumPy's error state, the
operand rule for host scalars, erf, and relu into a recycled buffer.

16-bit relu works on the bits: NumPy's bfloat16 (ml_dtypes) and float16 ``maximum`` convert
every element, 7-8x slower than two or three 16-bit integer passes. Viewed as int16, the
bfloat16 values ``maximum(x, 0)`` keeps whole are exactly those whose bits exceed those of -inf
(-128): every non-negative value and every NaN of either sign; the rest (negative numbers, -inf
and -0) become +0, as ml_dtypes' ``maximum`` makes them. NumPy's float16 ``maximum`` keeps -0
as well, so there the bits are first offset (uint16, wrapping) to put -0 among the kept ones
(tests/backends/cpu/test_cpu_relu16.py checks all 65536 patterns of each). The 0/1 mask is
written into the result and multiplied in place, so no temporary array is made."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from mpcore_xp import BF16, F16

#: NumPy's error state for kernels that may overflow: under loss scaling an overflow to inf is
#: expected and handled (the step is skipped), not a bug to warn about.
quiet = functools.partial(np.errstate, over="ignore", invalid="ignore", divide="ignore",
                          under="ignore")

# relu's bit thresholds (see the module's docstring)
_BF16_NEG_INF = np.int16(-128)
_F16_OFFSET, _F16_KEPT = np.uint16(0x8001), np.uint16(0x7C00)

# A ufunc on 0-d arrays returns a NumPy scalar, so 0-d tensors hold np.generic values.
_ARRAYS = (np.ndarray, np.generic)


def operands(a: Any, b: Any) -> tuple[Any, Any]:
    """Python scalars take the array's dtype (ml_dtypes' bfloat16 would widen to float32)."""
    if isinstance(a, _ARRAYS):
        if not isinstance(b, _ARRAYS):
            b = np.asarray(b, dtype=a.dtype)
    elif isinstance(b, _ARRAYS):
        a = np.asarray(a, dtype=b.dtype)
    return a, b


def _erf(x: np.ndarray) -> np.ndarray:
    """erf: exact (math.erf) in float64; in lower precision Abramowitz & Stegun 7.1.26
    (|error| < 1.5e-7, below float32's resolution of erf's range)."""
    if x.dtype == np.float64:
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    x32 = x.astype(np.float32, copy=False)
    # the same arithmetic in place in three buffers (it was fourteen temporaries): a GELU
    # layer's erf is a tenth of a transformer's step
    f32 = np.float32
    a = np.abs(x32)
    t = np.multiply(a, f32(0.3275911))
    t += f32(1.0)
    np.reciprocal(t, out=t)
    poly = np.multiply(t, f32(1.061405429))
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += f32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(f32(1.0), poly, out=poly)
    np.copysign(poly, x32, out=poly)
    return poly.astype(x.dtype, copy=False)


class CpuElementwise:
    """Mixed into CpuBackend, whose ``buffer`` gives the outputs."""

    buffer: Any

    def ieee_cos(self, x: np.ndarray) -> np.ndarray:
        """The cosine schedules' cosine (mpcore.optimizers.cosine_math.cos) of each element,
        in one call: its algorithm on Python floats, which are this device's float64, so the
        host's bits by construction (a schedule's rate is one element, where its basic
        operations as kernels are about 80 calls)."""
        from mpcore.optimizers.cosine_math import cos

        x = np.asarray(x, np.float64)
        return np.array([cos(v) for v in x.reshape(-1).tolist()], np.float64).reshape(x.shape)

    def erf(self, x: np.ndarray) -> np.ndarray:
        with quiet():
            return _erf(x)

    def relu(self, x: np.ndarray) -> np.ndarray:
        zero = np.zeros((), dtype=x.dtype)
        if not x.ndim:
            return np.maximum(x, zero)
        out = self.buffer(x.shape, x.dtype)
        if x.dtype == BF16:
            bits = np.ascontiguousarray(x).view(np.int16)
            keep = out.view(np.int16)
            np.greater(bits, _BF16_NEG_INF, out=keep, casting="unsafe")
        elif x.dtype == F16:
            bits = np.ascontiguousarray(x).view(np.uint16)
            keep = out.view(np.uint16)
            # bits - 0x8001 (wrapping): -0 -> 0xFFFF, non-negatives -> 0x7FFF..0xFFFE,
            # negative NaNs -> 0x7C00.., -inf and negative numbers below
            np.subtract(bits, _F16_OFFSET, out=keep)
            np.greater_equal(keep, _F16_KEPT, out=keep, casting="unsafe")
        else:
            return np.maximum(x, zero, out=out)
        np.multiply(keep, bits, out=keep)
        return out
