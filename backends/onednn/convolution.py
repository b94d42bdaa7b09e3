"""The optional ``conv2d``, ``conv2d_backprop_input`` and ``conv2d_backprop_filter`` kernels of
the CPU backend, on oneDNN's convolution primitives (:class:`~.conv.ConvCache`) for the dtypes
the plugin chose; anything else is computed as the core's composite computes it (im2col with
the CPU backend's ``extract_patches``, the installed ``matmul`` kernel, col2im with its
``extract_patches_grad``), so installing these kernels changes no result but the speed.

A oneDNN failure (a problem this library has no implementation for, an error while creating
a primitive) is never fatal: that problem goes to the composite from then on, and the failure
is logged once (logger ``mpcore``) and kept in :attr:`ConvKernels.failures`.

Finite values give the composite's results to rounding; non-finite ones the composite's NaN
and infinity pattern, with two exceptions (tests/backends/cpu/test_cpu_providers_nonfinite.py
leaves them out). oneDNN never multiplies the zero padding, so an infinite weight or a NaN or
infinite output gradient that meets the padding gives no NaN there, where the composite's
``0 * inf`` does (the gradient still has NaN elsewhere: every window's center tap lies in the
image). And the bfloat16 backward-weights kernel also multiplies image pixels that no window
reads (a "valid" convolution's last rows or columns): an infinity there gives a NaN kernel
gradient that the composite, which never reads such a pixel, does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import DTYPES

from .conv import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Alloc, ConvCache, Pads, output_shape
from .dnnl import float16_as_float32, kernel_table, run_or_remember

Kernel = Callable[..., Any]


class ConvKernels:
    """The three kernels over one :class:`ConvCache`: ``dtypes`` (oneDNN names, "float32"
    and/or "bfloat16") go to oneDNN; ``patches``, ``patches_grad`` and ``matmul`` are the
    CPU backend's kernels the composite is built of; ``alloc`` gives the result arrays."""

    def __init__(self, cache: ConvCache, dtypes: frozenset[str], patches: Kernel,
                 patches_grad: Kernel, matmul: Kernel, alloc: Alloc | None = None,
                 cast: Kernel | None = None) -> None:
        self.cache = cache
        #: the backend's cast (its float16 conversions are vectorised where NumPy's are not)
        self.cast = cast or (lambda x, dtype: x.astype(dtype))
        self.dtypes = {DTYPES[d]: d for d in dtypes}
        self.patches = patches
        self.patches_grad = patches_grad
        self.matmul = matmul
        self.alloc = alloc
        #: problem -> why oneDNN could not run it (those problems take the composite)
        self.failures: dict[tuple[Any, ...], str] = {}

    def table(self) -> dict[str, Kernel]:
        """The kernels by name, each carrying ``cache`` (its primitives: what the tests count
        to see that oneDNN ran) and ``conv`` (this object)."""
        return kernel_table(self, ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"),
                            "conv")

    def _onednn(self, kind: str, dtype: np.dtype, problem: tuple[Any, ...],
                run: Callable[[], np.ndarray]) -> np.ndarray | None:
        """``run()`` where oneDNN takes this problem, else None (the caller's composite)."""
        if dtype not in self.dtypes or 0 in problem[0] or 0 in problem[1]:
            return None
        return run_or_remember(self.failures, (kind, *problem, dtype.name), run,
                               f"convolution {kind}", "im2col composite")  # type: ignore[no-any-return]

    def conv2d(self, x: np.ndarray, kernel: np.ndarray, sh: int, sw: int,
               pads: Pads) -> np.ndarray:
        """(N, OH, OW, filters): ``x`` (NHWC) convolved with ``kernel`` (kh, kw, C, filters)."""
        # float16 as float32 (dnnl.float16_as_float32): the im2col composite would round its
        # col2im sums in float16 and runs 5x slower
        if float16_as_float32(self.dtypes, x, kernel):
            wide = self.cast
            return wide(self.conv2d(wide(x, "float32"), wide(kernel, "float32"), sh, sw, pads),
                        "float16")
        out = self._onednn(FORWARD, x.dtype, (x.shape, kernel.shape, sh, sw, pads),
                           lambda: self.cache.forward(x, kernel, sh, sw, pads, self.alloc))
        if out is not None:
            return out
        kh, kw, c, filters = kernel.shape
        y_shape = output_shape(x.shape, kernel.shape, sh, sw, pads)
        cols = self.patches(x, kh, kw, sh, sw, pads).reshape(-1, kh * kw * c)
        return self.matmul(cols, kernel.reshape(kh * kw * c, filters), False,  # type: ignore[no-any-return]
                           False).reshape(y_shape)

    def conv2d_backprop_input(self, dy: np.ndarray, kernel: np.ndarray,
                              x_shape: tuple[int, ...], sh: int, sw: int,
                              pads: Pads) -> np.ndarray:
        """The gradient of :meth:`conv2d` with respect to its image (of shape ``x_shape``)."""
        x_shape = tuple(x_shape)
        if float16_as_float32(self.dtypes, dy, kernel):
            wide = self.cast
            return wide(self.conv2d_backprop_input(wide(dy, "float32"), wide(kernel, "float32"),
                                                   x_shape, sh, sw, pads), "float16")
        out = self._onednn(BACKWARD_DATA, dy.dtype, (x_shape, kernel.shape, sh, sw, pads),
                           lambda: self.cache.backward_data(dy, kernel, x_shape, sh, sw, pads,
                                                            self.alloc))
        if out is not None:
            return out
        kh, kw, c, filters = kernel.shape
        cols = self.matmul(dy.reshape(-1, filters), kernel.reshape(kh * kw * c, filters), False,
                           True)
        return self.patches_grad(cols.reshape(*dy.shape[:3], kh * kw * c),  # type: ignore[no-any-return]
                                 x_shape, kh, kw, sh, sw, pads)

    def conv2d_backprop_filter(self, x: np.ndarray, dy: np.ndarray,
                               kernel_shape: tuple[int, ...], sh: int, sw: int,
                               pads: Pads) -> np.ndarray:
        """The gradient of :meth:`conv2d` with respect to its kernel (of ``kernel_shape``)."""
        kernel_shape = tuple(kernel_shape)
        if float16_as_float32(self.dtypes, x, dy):
            wide = self.cast
            return wide(self.conv2d_backprop_filter(wide(x, "float32"), wide(dy, "float32"),
                                                    kernel_shape, sh, sw, pads), "float16")
        out = self._onednn(BACKWARD_WEIGHTS, x.dtype, (x.shape, kernel_shape, sh, sw, pads),
                           lambda: self.cache.backward_weights(x, dy, kernel_shape, sh, sw,
                                                               pads, self.alloc))
        if out is not None:
            return out
        kh, kw, c, filters = kernel_shape
        if math.prod(dy.shape) == 0:
            return np.zeros(kernel_shape, x.dtype)
        cols = self.patches(x, kh, kw, sh, sw, pads).reshape(-1, kh * kw * c)
        return self.matmul(cols, dy.reshape(-1, filters), True,  # type: ignore[no-any-return]
                           False).reshape(kernel_shape)
