"""FP8 kernels (``kernels/fp8.cl``): quantise (scale, saturate, encode, amax in one pass),
dequantise, the emulated FP8 GEMM (codes decoded exactly to float32, the float32 GEMM of
:mod:`.linalg`, one scaling epilogue) and the scale update. OpenCL C has no FP8 type, so the
codes are encoded and decoded from the float bits by hand, bit-exact to ml_dtypes."""

from __future__ import annotations

import numpy as np

from .arrays import CLArray
from .programs import KernelFamily

_LIMITS = {"e4m3": 448.0, "e5m2": 57344.0}
#: Divisions correctly rounded, as NumPy's: 1/scale and fp8_max/amax then give the CPU's bits
#: (OpenCL allows 2.5 ulp otherwise).
_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt",)


class Float8Kernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the FP8 kernels."""

    _matmul: object

    def _fp8(self, dtype: str) -> object:
        return self._prog("fp8.cl", ("A", dtype), ("O", dtype), options=_OPTIONS, native=False)

    def quantize_fp8(self, x: CLArray, scale: CLArray, fmt: str) -> tuple[CLArray, CLArray]:
        codes = self._empty(tuple(x.shape), "uint8")
        amax = self.full((), 0.0, "float32")   # the atomic max's start: +0.0's bits are 0
        self.runtime.launch(self._fp8(self._dt(x))["quantize_fp8"], x.size, np.int32(x.size),
                            x.data, scale.data, np.int32(fmt == "e5m2"),
                            np.float32(_LIMITS[fmt]), codes.data, amax.data)
        return codes, amax

    def dequantize_fp8(self, codes: CLArray, scale: CLArray, fmt: str, dtype: str) -> CLArray:
        out = self._empty(tuple(codes.shape), dtype)
        self.runtime.launch(self._fp8(dtype)["dequantize_fp8"], out.size, np.int32(out.size),
                            codes.data, scale.data, np.int32(fmt == "e5m2"), out.data)
        return out

    def _fp8_decode(self, codes: CLArray, fmt: str) -> CLArray:
        out = self._empty(tuple(codes.shape), "float32")
        self.runtime.launch(self._fp8("float32")["decode_fp8"], out.size, np.int32(out.size),
                            codes.data, np.int32(fmt == "e5m2"), out.data)
        return out

    def fp8_matmul(self, a: CLArray, b: CLArray, a_scale: CLArray, b_scale: CLArray,
                   a_fmt: str, b_fmt: str, transpose_a: bool, transpose_b: bool,
                   dtype: str) -> CLArray:
        product = self._matmul(self._fp8_decode(a, a_fmt), self._fp8_decode(b, b_fmt),  # type: ignore[operator]
                               transpose_a, transpose_b)
        out = self._empty(tuple(product.shape), dtype)
        self.runtime.launch(self._fp8(dtype)["fp8_epilogue"], out.size, np.int32(out.size),
                            product.data, a_scale.data, b_scale.data, out.data)
        return out

    def fp8_scale(self, amax: CLArray, scale: CLArray, fp8_max: float, margin: int,
                  power_of_two: bool) -> CLArray:
        out = self._empty((), "float32")
        self.runtime.launch(self._fp8("float32")["fp8_scale"], 1, amax.data, scale.data,
                            np.float32(fp8_max), np.int32(margin), np.int32(power_of_two),
                            out.data)
        return out
