"""The FP8 kernels NumPy and CuPy share: decoding through a 256-entry table, the emulated FP8
GEMM (decode exactly, float32 GEMM, scale once), dequantisation and the scale update.

Encoding (``quantize_fp8``) is each backend's own: the CPU casts with ml_dtypes, CUDA runs a
hand-written kernel. Codes are uint8 arrays of OCP FP8 bits (``e4m3``: float8_e4m3fn,
``e5m2``: float8_e5m2); every value of either format is exact in float32, so a table lookup
decodes exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

F32 = np.float32

#: format name -> (exponent bits, mantissa bits, exponent bias, largest finite value)
LAYOUTS: dict[str, tuple[int, int, int, float]] = {
    "e4m3": (4, 3, 7, 448.0),
    "e5m2": (5, 2, 15, 57344.0),
}
_F32_MAX = np.float32(np.finfo(np.float32).max)


def decode_table(fmt: str) -> np.ndarray:
    """The float32 value of each of the 256 codes of ``fmt`` (NaN codes NaN, e5m2's
    infinities infinite), from the bit layout alone."""
    ebits, mbits, bias, _ = LAYOUTS[fmt]
    table = np.empty(256, dtype=np.float32)
    top = (1 << ebits) - 1
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> mbits) & top, code & ((1 << mbits) - 1)
        if fmt == "e4m3" and e == top and m == (1 << mbits) - 1:
            value = math.nan                     # e4m3fn: S.1111.111 is NaN, no infinities
        elif fmt == "e5m2" and e == top:
            value = math.inf if m == 0 else math.nan
        elif e == 0:
            value = math.ldexp(m, 1 - bias - mbits)
        else:
            value = math.ldexp((1 << mbits) + m, e - bias - mbits)
        table[code] = sign * value
    return table


_TABLES = {fmt: decode_table(fmt) for fmt in LAYOUTS}


def fp8_scale_host(xp: Any, amax: Any, scale: Any, fp8_max: float, margin: int,
                   power_of_two: bool) -> Any:
    """Transformer Engine's scale from ``amax`` (float32 arrays of shape ()), in ``xp``."""
    amax = amax.astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if power_of_two:
            # 2**floor(log2(fp8_max / amax)) of the exact quotient, without a division:
            # amax = m * 2**e and fp8_max = M * 2**E with m, M in [0.5, 1), so the floor is
            # E - e, less one where m > M
            mant, exp = xp.frexp(amax)
            big_m, big_e = math.frexp(fp8_max)
            k = big_e - exp.astype(np.int32) - (mant > F32(big_m)).astype(np.int32) - margin
            sf = xp.ldexp(F32(1), xp.clip(k, -149, 127).astype(np.int32)).astype(F32)
        else:
            sf = (F32(fp8_max) / amax) / F32(2.0 ** margin)
            sf = xp.where(xp.isinf(sf), _F32_MAX, sf)
        ok = (amax > 0) & xp.isfinite(amax)
    return xp.where(ok, sf, scale.astype(F32)).astype(F32).reshape(())


class Float8Kernels:
    """Mixin of :class:`~mpcore_xp.XpBackend`: the FP8 kernels both libraries spell alike."""

    xp: Any
    cast: Any
    matmul: Any

    def _fp8_table(self, fmt: str) -> Any:
        """The decode table of ``fmt`` as the library's array (a backend on a device keeps a
        copy there)."""
        return _TABLES[fmt]

    def _fp8_decode(self, codes: Any, fmt: str) -> Any:
        return self._fp8_table(fmt)[codes]

    def _fp8_amax(self, x: Any) -> Any:
        xp = self.xp
        if x.size == 0:
            return xp.zeros((), dtype=F32)
        return xp.max(xp.abs(x)).astype(F32).reshape(())

    def _fp8_inverse(self, scale: Any) -> Any:
        return (F32(1) / scale.astype(F32)).astype(F32)

    def dequantize_fp8(self, codes: Any, scale: Any, fmt: str, dtype: str) -> Any:
        with np.errstate(over="ignore", invalid="ignore"):
            y = self._fp8_decode(codes, fmt) * self._fp8_inverse(scale)
        return self.cast(y, dtype) if dtype != "float32" else y

    def fp8_matmul(self, a: Any, b: Any, a_scale: Any, b_scale: Any, a_fmt: str, b_fmt: str,
                   transpose_a: bool, transpose_b: bool, dtype: str) -> Any:
        # the table's float32 GEMM: a plugin's (oneDNN on the CPU) where one took it over, so
        # FP8 steps use the same GEMM library, and thread pool, as the rest of the step
        table = getattr(self, "_kernel_table", None)
        gemm = table["matmul"] if table else self.matmul
        product = gemm(self._fp8_decode(a, a_fmt), self._fp8_decode(b, b_fmt),
                       transpose_a, transpose_b)
        with np.errstate(over="ignore", invalid="ignore"):
            inv = (self._fp8_inverse(a_scale) * self._fp8_inverse(b_scale)).astype(F32)
            y = product * inv
        return self.cast(y, dtype) if dtype != "float32" else y

    def fp8_scale(self, amax: Any, scale: Any, fp8_max: float, margin: int,
                  power_of_two: bool) -> Any:
        return fp8_scale_host(self.xp, amax, scale, fp8_max, margin, power_of_two)
