"""The CUDA backend's image kernels (NHWC): im2col patches, col2im, max pooling and its
gradient, from ``kernels.cu``. ``pads`` is (top, bottom, left, right)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import I64

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid


class CudaImage:
    """Mixed into CudaBackend."""

    cp: Any
    _contig: Any

    def _image_floats(self, x: Any) -> Any:
        if x.dtype not in KERNEL_FLOATS:
            raise TypeError(f"image kernels take floating tensors, got {x.dtype}")
        return self._contig(x)

    def extract_patches(self, x: Any, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - kh) // sh + 1
        ow = (w + left + right - kw) // sw + 1
        out = self.cp.empty((n, oh, ow, kh * kw * c), dtype=x.dtype)
        if out.size:
            _k.function(_k.template("im2col", CTYPE[x.dtype]))(
                grid(out.size), (BLOCK,),
                (x, out, I64(out.size), *map(np.int32, (h, w, c, oh, ow, kh, kw, sh, sw, top,
                                                        left))))
        return out

    def extract_patches_grad(self, g: Any, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> Any:
        g = self._image_floats(g)
        n, h, w, c = x_shape
        oh, ow = g.shape[1], g.shape[2]
        dx = self.cp.empty((n, h, w, c), dtype=g.dtype)
        if dx.size:
            _k.function(_k.template("col2im", CTYPE[g.dtype]))(
                grid(dx.size), (BLOCK,),
                (g, dx, I64(dx.size), *map(np.int32, (h, w, c, oh, ow, kh, kw, sh, sw,
                                                      pads[0], pads[2]))))
        return dx

    def max_pool2d(self, x: Any, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        top, bottom, left, right = pads
        oh = (h + top + bottom - ph) // sh + 1
        ow = (w + left + right - pw) // sw + 1
        y = self.cp.empty((n, oh, ow, c), dtype=x.dtype)
        if y.size:
            _k.function(_k.template("maxpool", CTYPE[x.dtype]))(
                grid(y.size), (BLOCK,),
                (x, y, I64(y.size), *map(np.int32, (h, w, c, oh, ow, ph, pw, sh, sw, top,
                                                    left))))
        return y

    def max_pool2d_grad(self, g: Any, x: Any, y: Any, ph: int, pw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        g, x, y = self._image_floats(g), self._image_floats(x), self._image_floats(y)
        _, h, w, c = x.shape
        oh, ow = y.shape[1], y.shape[2]
        dx = self.cp.empty(x.shape, dtype=g.dtype)
        if dx.size:
            _k.function(_k.template("maxpool_grad", CTYPE[g.dtype]))(
                grid(dx.size), (BLOCK,),
                (g, x, y, dx, I64(dx.size), *map(np.int32, (h, w, c, oh, ow, ph, pw, sh, sw,
                                                            pads[0], pads[2]))))
        return dx
