"""The OpenCL backend's GEMM (``matmul``): the host side of ``kernels/gemm.cl``.

Two kernel variants, chosen by device kind (:func:`mpcore_opencl.tiling.gemm_variant`): "packed"
on CPU devices and "tiled" on GPUs, each built with the shape :mod:`mpcore_opencl.tiling`
derives from the device description and the vector width that the kernel probe
(:mod:`mpcore_opencl.probe`) verified on the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .arrays import LOW, NP_DTYPES, CLArray
from .programs import KernelFamily
from .tiling import PackedShape, TiledShape, gemm_variant, packed_shape, tiled_shape


def _acc_itemsize(dtype: str) -> int:
    """Bytes of the GEMM's accumulation type (float32 for 16-bit storage)."""
    return 4 if dtype in LOW else int(np.dtype(NP_DTYPES[dtype]).itemsize)


class LinalgKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: matmul and its GEMM shapes."""

    #: "packed" (CPU devices), "tiled" (local memory; GPUs) or None: chosen by device kind.
    gemm_variant: str | None = None
    #: The GEMM vector width: None takes the one the probe verified on the device (see
    #: :meth:`~mpcore_opencl.backend.OpenCLBackend.verified_vector_width`).
    vector_width: int | None = None

    verified_vector_width: Any  # provided by the backend

    def _variant(self) -> str:
        return self.gemm_variant or gemm_variant(self.device())

    def packed_shape(self, dtype: str = "float32") -> PackedShape:
        """The packed GEMM's shape for panels of ``dtype`` on this device."""
        return packed_shape(self.device(), self.verified_vector_width(), _acc_itemsize(dtype))

    def tiled_shape(self, dtype: str = "float32", native: bool = False) -> TiledShape:
        """The tiled GEMM's shape for ``dtype`` on this device (half tiles if ``native``)."""
        staged = 2 if native and dtype == "float16" else _acc_itemsize(dtype)
        return tiled_shape(self.device(), self.verified_vector_width(), staged,
                           _acc_itemsize(dtype))

    def matmul(self, a: CLArray, b: CLArray, transpose_a: bool, transpose_b: bool) -> CLArray:
        return self._matmul(a, b, transpose_a, transpose_b)

    def _matmul(self, a: CLArray, b: CLArray, transpose_a: bool, transpose_b: bool,
                native: bool | None = None) -> CLArray:
        dt = self._dt(a)
        sa, sb = tuple(a.shape), tuple(b.shape)
        batch = sa[:-2]
        m, k = (sa[-1], sa[-2]) if transpose_a else (sa[-2], sa[-1])
        n = sb[-2] if transpose_b else sb[-1]
        nb = math.prod(batch)
        out = self._empty((*batch, m, n), dt)
        if out.size == 0:
            return out
        if k == 0:
            return self.full(out.shape, 0, dt)
        if self._variant() == "packed":
            self._gemm_packed(a, b, transpose_a, transpose_b, m, n, k, nb, out, native)
        else:
            self._gemm_tiled(a, b, transpose_a, transpose_b, m, n, k, nb, out, native)
        return out

    def _gemm_tiled(self, a: CLArray, b: CLArray, transpose_a: bool, transpose_b: bool, m: int,
                    n: int, k: int, nb: int, out: CLArray, native: bool | None = None) -> None:
        dt = self._dt(a)
        shape = self.tiled_shape(dt, self._native((dt,), native))
        prog = self._prog("gemm.cl", ("A", dt), ("O", dt), options=shape.options(),
                          native=native)
        name = "gemm_" + ("t" if transpose_a else "n") + ("t" if transpose_b else "n")
        wx, wy = shape.group
        self.runtime.launch_nd(prog[name], (-(-n // shape.tile_n) * wx,
                                            -(-m // shape.tile_m) * wy, nb), (wx, wy, 1),
                               np.int32(m), np.int32(n), np.int32(k), np.int64(m * k),
                               np.int64(k * n), np.int64(m * n), a.data, b.data, out.data)

    def _gemm_packed(self, a: CLArray, b: CLArray, transpose_a: bool, transpose_b: bool, m: int,
                     n: int, k: int, nb: int, out: CLArray, native: bool | None = None) -> None:
        dt = self._dt(a)
        # panels hold the compute type: float32 for 16-bit storage, half with native half
        acc = dt if self._native((dt,), native) else ("float32" if dt in LOW else dt)
        shape = self.packed_shape(acc)
        wpm, cw = shape.rows, shape.columns
        # Operands already in the compute type are read in place where the kernel can (see
        # gemm.cl) and where that is faster than packing (tiling.py): A when it has a whole
        # block of rows, B untransposed with a whole block of columns, each up to its size
        # limit; the others are packed into zero-padded panels.
        in_place = dt == acc and dt not in LOW
        direct_a = in_place and m >= wpm and a.nbytes // nb <= shape.in_place_a_bytes
        direct_b = (in_place and not transpose_b and n >= cw
                    and b.nbytes // nb <= shape.in_place_b_bytes)
        pm_n, pn_n = -(-m // wpm), -(-n // cw)
        wgx, wgy = min(shape.group[0], pn_n), min(shape.group[1], pm_n)
        pm, pn = -(-pm_n // wgy) * wgy, -(-pn_n // wgx) * wgx
        opts = shape.options()
        rt = self.runtime
        # (row, k) of op(A) and (column, k) of op(B), as element strides
        a_rs, a_ks = (1, m) if transpose_a else (k, 1)
        b_rs, b_ks = (k, 1) if transpose_b else (1, n)
        if direct_a:
            a_arg, a_ps, a_bs, m_last = a, wpm * a_rs, m * k, m - wpm
        else:
            a_arg = self._pack(a, m, k, pm, wpm, a_rs, a_ks, nb, acc, opts, native)
            a_ps, a_rs, a_ks, a_bs, m_last = k * wpm, 1, wpm, pm * k * wpm, pm * wpm
        if direct_b:
            b_arg, b_ps, b_bs, n_last = b, cw, k * n, n - cw
        else:
            b_arg = self._pack(b, n, k, pn, cw, b_rs, b_ks, nb, acc, opts, native)
            b_ps, b_ks, b_bs, n_last = k * cw, cw, pn * k * cw, pn * cw
        prog = self._prog("gemm.cl", ("A", acc), ("O", dt), options=(*opts, f"-DPW={wpm}"),
                          native=native)
        kernel = prog["gemm_packed" if a_rs == 1 else "gemm_packed_k"]
        rt.launch_nd(kernel, (pn, pm, nb), (wgx, wgy, 1), np.int32(m), np.int32(n),
                     np.int32(k), np.int32(m_last), np.int32(n_last), np.int64(a_ps),
                     np.int64(a_rs), np.int64(a_ks), np.int64(a_bs), np.int64(b_ps),
                     np.int64(b_ks), np.int64(b_bs), a_arg.data, b_arg.data, out.data)

    def _pack(self, src: CLArray, rows: int, k: int, panels: int, width: int, rs: int, ks: int,
              nb: int, acc: str, opts: tuple[str, ...], native: bool | None) -> CLArray:
        """``src`` (element (row, k) at ``row * rs + k * ks`` in each of ``nb`` batches) packed
        into zero-padded panels of ``width`` rows interleaved along K, in ``acc``."""
        dst = self._empty((nb, panels, k, width), acc)
        prog = self._prog("gemm.cl", ("A", self._dt(src)), ("O", acc),
                          options=(*opts, f"-DPW={width}"), native=native)
        local = min(self.runtime.local, k)
        self.runtime.launch_nd(prog["pack_k"], (-(-k // local) * local, panels, nb),
                               (local, 1, 1), np.int32(rows), np.int32(k), np.int32(panels),
                               np.int64(rs), np.int64(ks), np.int64(src.size // nb), src.data,
                               dst.data)
        return dst
