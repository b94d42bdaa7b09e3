"""float16 ``add``, ``subtract`` and ``multiply`` of large arrays through float32.

NumPy's float16 loops convert both operands of every element to float32 in software, operate,
and round the result back (``npy_float_to_half(npy_half_to_float(a) + npy_half_to_float(b))``):
a residual add of 2M elements takes 15-22 ms there, 30x a float32 add. The same three steps
done a whole array at a time, the conversions through ONNX Runtime's vectorised ``Cast`` (the
``convert`` this plugin installs), give the same bits: the float32 operation is the same IEEE
operation, and the one rounding back to float16 is the same round-to-nearest-even
(tests/backends/cpu/test_onnxruntime_arithmetic.py checks it against NumPy's loops).
Smaller or mixed-dtype operands go to the kernel the table held before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import F16

from .creation import MIN_ELEMENTS

NAMES = ("add", "subtract", "multiply")

Kernel = Callable[..., Any]


class WidenedArithmetic:
    """The kernel ``name`` for float16 arrays of at least :data:`MIN_ELEMENTS` (the larger
    operand): both widened with ``cast``, the NumPy ufunc in float32 (in place in a widened
    operand where the shapes allow), the result rounded once with ``cast``; everything else
    through ``previous``."""

    def __init__(self, name: str, previous: Kernel, cast: Kernel) -> None:
        self.__name__ = name
        self.ufunc = getattr(np, name)
        self.previous = previous
        self.cast = cast
        self.calls = 0  # calls taken through float32 (for tests and diagnostics)

    def __call__(self, a: Any, b: Any) -> Any:
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == F16 and b.dtype == F16 and max(a.size, b.size) >= MIN_ELEMENTS):
            return self.previous(a, b)
        wa, wb = self.cast(a, "float32"), self.cast(b, "float32")
        shape = np.broadcast_shapes(wa.shape, wb.shape)
        # a widened operand of the result's shape is this call's own array: reuse it
        out = wa if wa.shape == shape else wb if wb.shape == shape else None
        with np.errstate(all="ignore"):  # as the CPU backend's 16-bit kernels: quiet
            wide = self.ufunc(wa, wb, out=out)
        self.calls += 1
        return self.cast(wide, "float16")


def wraps(cast: Callable[[], Kernel]) -> dict[str, Callable[[Kernel | None], Kernel]]:
    """The ``KernelSet.wraps`` entries: each over the kernel the table held (the CPU
    backend's); ``cast()`` gives the backend's cast once the table is complete."""

    def factory(name: str) -> Callable[[Kernel | None], Kernel]:
        def make(previous: Kernel | None) -> Kernel:
            if previous is None:
                raise RuntimeError(f"the CPU backend has no {name!r} kernel to wrap")
            return WidenedArithmetic(name, previous, lambda x, dtype: cast()(x, dtype))
        return make

    return {name: factory(name) for name in NAMES}
