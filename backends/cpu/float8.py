"""The CPU's FP8 encoder: ``quantize_fp8`` through ml_dtypes' float8 types (the reference the
OpenCL and CUDA encoders are checked against, bit for bit). The decoding kernels, the emulated
GEMM and the scale update are shared with CUDA (:mod:`mpcore_xp.float8`)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from mpcore_xp.float8 import F32, LAYOUTS

_TYPES = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}


class CpuFloat8:
    """Mixed into CpuBackend."""

    _fp8_amax: Any

    def quantize_fp8(self, x: np.ndarray, scale: np.ndarray, fmt: str) -> tuple[Any, Any]:
        """(codes, amax): ``x * scale`` in float32, clipped to the format's largest value
        (ml_dtypes' casts do not saturate: 480 would become NaN in e4m3fn, 1e30 inf in e5m2;
        np.clip keeps NaN), rounded to nearest even by ml_dtypes' cast."""
        limit = F32(LAYOUTS[fmt][3])
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.clip(np.asarray(x).astype(F32) * scale.astype(F32), -limit, limit)
            codes = y.astype(_TYPES[fmt]).view(np.uint8)
        return codes, self._fp8_amax(np.asarray(x))
