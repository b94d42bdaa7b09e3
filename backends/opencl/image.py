"""Image kernels on NHWC arrays (``kernels/image.cl``): patch extraction (the convolution's
im2col), 2-D max pooling, and their gradients."""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import CLArray
from .programs import KernelFamily


def _output_hw(h: int, w: int, kh: int, kw: int, sh: int, sw: int,
               pads: tuple[int, int, int, int]) -> tuple[int, int]:
    """Height and width of the windows (kh, kw) at strides (sh, sw) over padded (h, w)."""
    top, bottom, left, right = pads
    return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1


class ImageKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the image kernels."""

    def _image(self, kernel: str, dt: str, total: int, geometry: tuple[int, ...],
               *buffers: Any) -> None:
        prog = self._prog("image.cl", ("A", dt), ("O", dt))
        self.runtime.launch(prog[kernel], total, np.int32(total),
                            *(np.int32(v) for v in geometry), *buffers)

    def extract_patches(self, x: CLArray, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = x.shape
        oh, ow = _output_hw(h, w, kh, kw, sh, sw, pads)
        out = self._empty((n, oh, ow, kh * kw * c), self._dt(x))
        self._image("extract_patches", self._dt(x), out.size,
                    (h, w, c, oh, ow, kh, kw, sh, sw, pads[0], pads[2]), x.data, out.data)
        return out

    def extract_patches_grad(self, g: CLArray, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = (int(d) for d in x_shape)
        oh, ow = g.shape[1], g.shape[2]
        out = self._empty((n, h, w, c), self._dt(g))
        self._image("extract_patches_grad", self._dt(g), out.size,
                    (h, w, c, oh, ow, kh, kw, sh, sw, pads[0], pads[2]), g.data, out.data)
        return out

    def max_pool2d(self, x: CLArray, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> CLArray:
        n, h, w, c = x.shape
        oh, ow = _output_hw(h, w, ph, pw, sh, sw, pads)
        out = self._empty((n, oh, ow, c), self._dt(x))
        self._image("max_pool2d", self._dt(x), out.size,
                    (h, w, c, oh, ow, ph, pw, sh, sw, pads[0], pads[2]), x.data, out.data)
        return out

    def max_pool2d_grad(self, g: CLArray, x: CLArray, y: CLArray, ph: int, pw: int, sh: int,
                        sw: int, pads: tuple[int, int, int, int]) -> CLArray:
        _, h, w, c = x.shape
        oh, ow = y.shape[1], y.shape[2]
        dt = self._dt(g)
        if self._dt(x) != dt:
            x, y = self.cast(x, dt), self.cast(y, dt)
        out = self._empty(tuple(x.shape), dt)
        self._image("max_pool2d_grad", dt, out.size,
                    (h, w, c, oh, ow, ph, pw, sh, sw, pads[0], pads[2]), g.data, x.data, y.data,
                    out.data)
        return out
