""":class:`XpBackend`: a :class:`~mpcore.core.backend.Backend` whose kernels are written against an
array module with NumPy's API (``self.xp``), one family per module.

A subclass sets ``xp`` (NumPy, or CuPy imported on first use), and overrides the kernels its
library computes differently. Two hooks adapt the shared kernels without copying them:
:meth:`XpBackend.operands` (how a host scalar meets an array) and :attr:`XpBackend.errstate`
(NumPy warns on overflow, which loss scaling expects; CuPy never warns).
"""

from __future__ import annotations

import contextlib
from typing import Any

from mpcore.core.backend import Backend

from .creation import CreationKernels
from .dtypes import LOW
from .elementwise import ElementwiseKernels
from .float8 import Float8Kernels
from .linalg import LinalgKernels
from .nn import NnKernels
from .normalization import NormalizationKernels
from .reduce import ReduceKernels
from .shape import ShapeKernels


class XpBackend(CreationKernels, ElementwiseKernels, ReduceKernels, LinalgKernels,
                ShapeKernels, NnKernels, NormalizationKernels, Float8Kernels, Backend):
    """The kernels NumPy and CuPy share. Abstract: a subclass gives ``xp`` and the kernels
    that need its library's own routes (asarray, to_host, cast, copy, random numbers, matmul,
    dropout, loss scaling, optimizer updates, images)."""

    #: The array module (``numpy``, ``cupy``): a class attribute or a property.
    xp: Any = None
    #: Elementwise kernels on these dtypes run under :attr:`errstate` (the quiet ones always).
    quiet_dtypes: frozenset[Any] = LOW
    #: A context manager factory that silences floating-point warnings (none by default).
    errstate: Any = staticmethod(contextlib.nullcontext)

    def widened(self, x: Any) -> Any:
        """``x`` in float32 where it is 16-bit (float32 and float64 as they are), through the
        backend's own ``cast``: the fused kernels that compute 16-bit data in float32 (GELU,
        the normalizations) widen with it, and the CPU's converts float16 in a vectorised
        pass where NumPy's astype converts it in software."""
        return x if x.dtype not in LOW else self.cast(x, "float32")  # type: ignore[attr-defined]

    def narrowed(self, y: Any, dtype: Any) -> Any:
        """``y`` rounded to ``dtype`` (once, through ``cast``) where it is not in it already."""
        return y if y.dtype == dtype else self.cast(y, dtype.name)  # type: ignore[attr-defined]

    def operands(self, a: Any, b: Any) -> tuple[Any, Any]:
        """The two operands of a binary kernel as the library should see them (unchanged
        here; a backend makes a host scalar take the array's dtype where its library would
        widen it)."""
        return a, b
