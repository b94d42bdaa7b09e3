"""The CUDA backend's image kernels (NHWC): im2col patches, col2im, max pooling and its
gradient, from ``kernels.cu``. ``pads`` is (top, bottom, left, right)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid


def _output_size(h: int, w: int, kh: int, kw: int, sh: int, sw: int,
                 pads: tuple[int, int, int, int]) -> tuple[int, int]:
    """(OH, OW) of a window of (kh, kw) moved by (sh, sw) over the padded (h, w)."""
    top, bottom, left, right = pads
    return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1


class CudaImage:
    """Mixed into CudaBackend."""

    cp: Any
    _contig: Any

    def _image_floats(self, x: Any) -> Any:
        if x.dtype not in KERNEL_FLOATS:
            raise TypeError(f"image kernels take floating tensors, got {x.dtype}")
        return self._contig(x)

    def _launch(self, kernel: str, dtype: Any, operands: tuple[Any, ...], out: Any,
                geometry: tuple[int, ...]) -> Any:
        """``kernel`` over every element of ``out``: its operands, ``out``, its size, then the
        window geometry (h, w, c, oh, ow, kh, kw, sh, sw, top, left) as int32."""
        if out.size:
            _k.function(_k.template(kernel, CTYPE[dtype]))(
                grid(out.size), (BLOCK,),
                (*operands, out, np.int64(out.size), *map(np.int32, geometry)))
        return out

    def extract_patches(self, x: Any, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        oh, ow = _output_size(h, w, kh, kw, sh, sw, pads)
        out = self.cp.empty((n, oh, ow, kh * kw * c), dtype=x.dtype)
        return self._launch("im2col", x.dtype, (x,), out,
                            (h, w, c, oh, ow, kh, kw, sh, sw, pads[0], pads[2]))

    def extract_patches_grad(self, g: Any, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> Any:
        g = self._image_floats(g)
        n, h, w, c = x_shape
        oh, ow = g.shape[1], g.shape[2]
        dx = self.cp.empty((n, h, w, c), dtype=g.dtype)
        return self._launch("col2im", g.dtype, (g,), dx,
                            (h, w, c, oh, ow, kh, kw, sh, sw, pads[0], pads[2]))

    def max_pool2d(self, x: Any, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> Any:
        x = self._image_floats(x)
        n, h, w, c = x.shape
        oh, ow = _output_size(h, w, ph, pw, sh, sw, pads)
        y = self.cp.empty((n, oh, ow, c), dtype=x.dtype)
        return self._launch("maxpool", x.dtype, (x,), y,
                            (h, w, c, oh, ow, ph, pw, sh, sw, pads[0], pads[2]))

    def max_pool2d_grad(self, g: Any, x: Any, y: Any, ph: int, pw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> Any:
        g, x, y = self._image_floats(g), self._image_floats(x), self._image_floats(y)
        _, h, w, c = x.shape
        oh, ow = y.shape[1], y.shape[2]
        dx = self.cp.empty(x.shape, dtype=g.dtype)
        return self._launch("maxpool_grad", g.dtype, (g, x, y), dx,
                            (h, w, c, oh, ow, ph, pw, sh, sw, pads[0], pads[2]))
