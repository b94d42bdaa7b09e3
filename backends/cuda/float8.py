"""The CUDA backend's FP8 kernels: ``quantize_fp8`` from ``fp8.cu`` (scale, saturate, encode by
hand and amax in one pass) and ``fp8_matmul``, native through cuBLASLt (:mod:`.cublaslt`) where
:func:`.fp8_gemm.fp8_gemm_route` allows it and the library loads, else emulated. Decoding, the
emulated GEMM (codes decoded exactly, a float32 cuBLAS GEMM) and the scale update are shared
with the CPU (:mod:`mpcore_xp.float8`); the decode tables live on the device.

The native GEMM is TN (``x @ wt^T``, both K-contiguous): an operand stored the other way round
has its codes transposed first by ``transpose_u8`` (``fp8.cu``: 32 x 32 tiles in shared
memory, coalesced both ways, where CuPy's ``ascontiguousarray`` of a transposed uint8 view
reads one byte per 32-byte sector). ``MPCORE_CUDA_FP8_GEMM=emulated|cublaslt|auto`` picks the
route for comparisons."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import F32
from mpcore_xp.float8 import LAYOUTS, decode_table

from . import kernels as _k
from .fp8_gemm import (
    Fp8GemmRoute,
    RouteLog,
    fp8_gemm_choice,
    fp8_gemm_route,
    gemm_scale,
    tn_operands,
)
from .kernels import BLOCK, CTYPE, grid

#: Tile of ``transpose_u8`` (32 x 32 codes) and its block (32 x 8 threads).
_TILE, _TILE_ROWS = 32, 8


class CudaFloat8:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    _contig: Any
    _fp8_tables: dict[str, Any] | None = None
    _fp8_routes: RouteLog | None = None
    _device_table: Any

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

    def fp8_transpose(self, codes: Any) -> Any:
        """The (cols, rows) C-contiguous transpose of 2-D uint8 ``codes``."""
        rows, cols = codes.shape
        out = self.cp.empty((cols, rows), dtype=np.uint8)
        if codes.size:
            _k.function("transpose_u8")(
                (-(-rows // _TILE), -(-cols // _TILE)), (_TILE, _TILE_ROWS),
                (self._contig(codes), out, np.int64(rows), np.int64(cols)))
        return out

    def _fp8_route(self, m: int, k: int, n: int, a_fmt: str, b_fmt: str) -> Fp8GemmRoute:
        """The route of one GEMM here: the switch, the shape and formats on this GPU, the
        library; a route that is not native is logged once per shape and reason."""
        from .cublaslt import unavailable_reason

        choice = fp8_gemm_choice()
        device = self.cp.cuda.runtime.getDevice()
        cc = self._device_table()[device][1]
        route = fp8_gemm_route(m, k, n, tuple(int(p) for p in cc.split(".")), (a_fmt, b_fmt))
        if route.native:
            why = unavailable_reason()
            if why is not None:
                if choice == "cublaslt":
                    raise RuntimeError(f"MPCORE_CUDA_FP8_GEMM=cublaslt, but {why}")
                route = Fp8GemmRoute(False, f"{why}: the GEMM runs emulated")
        if self._fp8_routes is None:
            self._fp8_routes = RouteLog()
        self._fp8_routes.note(f"fp8_matmul ({m}, {k}) @ ({k}, {n})", route)
        return route

    def fp8_matmul(self, a: Any, b: Any, a_scale: Any, b_scale: Any, a_fmt: str, b_fmt: str,
                   transpose_a: bool, transpose_b: bool, dtype: str) -> Any:
        tn = tn_operands(a.shape, b.shape, transpose_a, transpose_b)
        if 0 in (tn.m, tn.k, tn.n) or not self._fp8_route(tn.m, tn.k, tn.n, a_fmt,
                                                           b_fmt).native:
            return super().fp8_matmul(a, b, a_scale, b_scale, a_fmt, b_fmt,  # type: ignore[misc]
                                      transpose_a, transpose_b, dtype)
        from .cublaslt import device_gemm

        x = self.fp8_transpose(a) if tn.transpose_x else self._fp8_aligned(a)
        wt = self.fp8_transpose(b) if tn.transpose_w else self._fp8_aligned(b)
        scale = gemm_scale(self.cp, a_scale, b_scale)
        return device_gemm(self.cp)(x, wt, scale, a_fmt, b_fmt, dtype)

    def _fp8_aligned(self, codes: Any) -> Any:
        """``codes`` C-contiguous and 16-byte aligned, as cuBLASLt's FP8 GEMMs read them."""
        codes = self._contig(codes)
        return codes if codes.data.ptr % 16 == 0 else codes.copy()
