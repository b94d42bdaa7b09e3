"""Image kernels of the CPU backend (channels last): im2col patches for conv2d, max pooling.

``pads`` is (top, bottom, left, right), computed by the core from the padding mode.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _pad(x: np.ndarray, pads: tuple[int, int, int, int], value: float) -> np.ndarray:
    top, bottom, left, right = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)


def _windows(xp: np.ndarray, kh: int, kw: int, sh: int, sw: int) -> np.ndarray:
    """(N, OH, OW, C, kh, kw) strided view of every window."""
    return sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]


class CpuImage:
    """Mixed into CpuBackend."""

    def extract_patches(self, x: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                        pads: tuple[int, int, int, int]) -> np.ndarray:
        win = _windows(_pad(x, pads, 0), kh, kw, sh, sw)
        n, oh, ow, c = win.shape[:4]
        # (N, OH, OW, kh, kw, C): the patch layout matches a (kh, kw, C, filters) kernel
        return np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3)).reshape(n, oh, ow,
                                                                             kh * kw * c)

    def extract_patches_grad(self, g: np.ndarray, x_shape: tuple[int, ...], kh: int, kw: int,
                             sh: int, sw: int, pads: tuple[int, int, int, int]) -> np.ndarray:
        n, h, w, c = x_shape
        top, bottom, left, right = pads
        oh, ow = g.shape[1], g.shape[2]
        g6 = g.reshape(n, oh, ow, kh, kw, c)
        dxp = np.zeros((n, h + top + bottom, w + left + right, c), dtype=g.dtype)
        for i in range(kh):
            for j in range(kw):
                dxp[:, i:i + sh * oh:sh, j:j + sw * ow:sw, :] += g6[:, :, :, i, j, :]
        return np.ascontiguousarray(dxp[:, top:top + h, left:left + w, :])

    def max_pool2d(self, x: np.ndarray, ph: int, pw: int, sh: int, sw: int,
                   pads: tuple[int, int, int, int]) -> np.ndarray:
        return _windows(_pad(x, pads, -np.inf), ph, pw, sh, sw).max(axis=(4, 5))

    def max_pool2d_grad(self, g: np.ndarray, x: np.ndarray, y: np.ndarray, ph: int, pw: int,
                        sh: int, sw: int, pads: tuple[int, int, int, int]) -> np.ndarray:
        # The gradient goes to the first maximum of each window (as TF's MaxPoolGrad).
        xp = _pad(x, pads, -np.inf)
        oh, ow = y.shape[1], y.shape[2]
        dxp = np.zeros(xp.shape, dtype=g.dtype)
        taken = np.zeros(y.shape, dtype=bool)
        for i in range(ph):
            for j in range(pw):
                xs = xp[:, i:i + sh * oh:sh, j:j + sw * ow:sw, :]
                hit = (xs == y) & ~taken
                dxp[:, i:i + sh * oh:sh, j:j + sw * ow:sw, :] += np.where(hit, g, 0)
                taken |= hit
        top, left = pads[0], pads[2]
        return np.ascontiguousarray(dxp[:, top:top + x.shape[1], left:left + x.shape[2], :])
