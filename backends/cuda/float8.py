"""The CUDA backend's FP8 encoder: ``quantize_fp8`` from ``kernels.cu`` (scale, saturate,
encode by hand and amax in one pass). Decoding, the emulated GEMM (codes decoded exactly, a
float32 cuBLAS GEMM) and the scale update are shared with the CPU (:mod:`mpcore_xp.float8`);
the decode tables live on the device. cuBLASLt's FP8 GEMMs are not wired yet (the verdict
says so)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import F32
from mpcore_xp.float8 import LAYOUTS, decode_table

from . import kernels as _k
from .kernels import BLOCK, CTYPE, grid


class CudaFloat8:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    _contig: Any
    _fp8_tables: dict[str, Any] | None = None

    def _fp8_table(self, fmt: str) -> Any:
        if self._fp8_tables is None:
            self._fp8_tables = {}
        table = self._fp8_tables.get(fmt)
        if table is None:
            table = self._fp8_tables[fmt] = self.cp.asarray(decode_table(fmt))
        return table

    def quantize_fp8(self, x: Any, scale: Any, fmt: str) -> tuple[Any, Any]:
        cp = self.cp
        if x.dtype not in CTYPE or x.dtype == np.float64:
            x = x.astype(F32)
        x = self._contig(x)
        codes = cp.empty(x.shape, dtype=np.uint8)
        amax = cp.zeros((), dtype=F32)   # the atomic max's start: +0.0's bits are 0
        if x.size:
            _k.function(_k.template("quantize_fp8", CTYPE[x.dtype]))(
                grid(x.size), (BLOCK,),
                (x, scale.astype(F32), codes, amax.view(np.uint32), np.int64(x.size),
                 np.int32(fmt == "e5m2"), np.float32(LAYOUTS[fmt][3])))
        return codes, amax
