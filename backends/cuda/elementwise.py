"""What the CUDA backend's elementwise kernels add to the shared ones: the operand rules CuPy's
bfloat16 loops need, and relu, sigmoid and erf as ``kernels.cu`` kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import BF16

from . import kernels as _k
from .kernels import BLOCK, CTYPE, KERNEL_FLOATS, grid

_HOST_SCALARS = (bool, int, float, np.generic)


def operands(a: Any, b: Any) -> tuple[Any, Any]:
    """A host scalar next to a bfloat16 array becomes a bfloat16 scalar (as on the CPU backend).

    CuPy 14 cannot apply a weak Python float to its bfloat16 loops (``numpy.result_type(0.0,
    bfloat16)`` is float64), so ``bf16_array * 2.0`` would resolve to the float32 loop and
    return float32. A Python int resolves to bfloat16 already; it is converted all the same."""
    if isinstance(b, _HOST_SCALARS) and getattr(a, "dtype", None) == BF16:
        b = BF16.type(b)
    elif isinstance(a, _HOST_SCALARS) and getattr(b, "dtype", None) == BF16:
        a = BF16.type(a)
    return a, b


def select_operands(a: Any, b: Any) -> tuple[Any, Any, Any]:
    """``cupy.where`` operands and the dtype to view its result as: CuPy 14's where has no
    bfloat16 loop (it would select in float32), so bfloat16 values are selected as raw bits."""
    if getattr(a, "dtype", None) == BF16 and getattr(b, "dtype", None) == BF16:
        return a.view(np.uint16), b.view(np.uint16), BF16
    return a, b, None


class CudaElementwise:
    """Mixed into CudaBackend."""

    cp: Any
    _contig: Any

    def operands(self, a: Any, b: Any) -> tuple[Any, Any]:
        return operands(a, b)

    def _unary(self, op: str, x: Any) -> Any:
        x = self._contig(x)
        out = self.cp.empty(x.shape, dtype=x.dtype)
        if x.size:
            _k.function(_k.template("unary", CTYPE[x.dtype], str(_k.UNARY_OPS[op])))(
                grid(x.size), (BLOCK,), (x, out, np.int64(x.size)))
        return out

    def relu(self, x: Any) -> Any:
        if x.dtype in KERNEL_FLOATS:
            return self._unary("relu", x)
        return self.cp.maximum(x, 0)

    def sigmoid(self, x: Any) -> Any:
        return self._unary("sigmoid", x)

    def erf(self, x: Any) -> Any:
        return self._unary("erf", x)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        a, b, view = select_operands(a, b)
        out = self.cp.where(cond, a, b)
        return out if view is None else out.view(view)
