"""The inspector's FP8 view (``inspect_numerics(..., float8_recipe=...)``): each GEMM operand of
the inspected step, scaled as the recipe would scale it, and what FP8 then does to it: the
share of its non-zero values that saturate at the format's largest value (overflow) and that
flush to zero (underflow).

Which format: forward GEMM operands take the recipe's forward format (e4m3); in the backward
pass, the operands that are gradients (tensors the backward pass produced) take its backward
format (e5m2 under "hybrid") and the saved activations and weights the forward format, as
Transformer Engine's dgrad and wgrad GEMMs do. Which scale: the one the recipe computes from
the operand's own amax in this step (current scaling's, exactly; for delayed scaling, whose
history one step cannot show, the scale it settles on while the amax holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpcore.debugging import formats as _formats

#: The ops whose operands an FP8 recipe quantises (``dense``: its first two inputs).
GEMM_OPS = ("matmul", "dense", "float8_dot")
_FORMAT_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


@dataclass(frozen=True)
class Float8Operand:
    """One GEMM operand under the recipe."""

    layer: str
    phase: str          # "forward" or "backward"
    op: str
    operand: int        # 0: the left operand, 1: the right one
    gradient: bool      # a gradient (backward format) or a value (forward format)
    format: str         # "float8_e4m3fn" or "float8_e5m2"
    amax: float
    scale: float
    overflow: float     # share of its non-zero finite values that saturate
    underflow: float    # share that flush to zero

    def describe(self) -> str:
        return (f"{self.phase:8} {self.layer:20} {self.op:10} "
                f"{'grad' if self.gradient else 'value'}{self.operand} {self.format:14} "
                f"scale {self.scale:<10.4g} overflow {self.overflow:7.2%} underflow "
                f"{self.underflow:7.2%}")


def recipe_scale(amax: float, fp8_max: float, recipe: Any) -> float:
    """The scale ``recipe`` gives an operand of this ``amax`` (1 where the amax is zero or not
    finite, the start of every scale): Transformer Engine's ``fp8_max / amax / 2**margin``,
    rounded down to a power of two where the recipe does."""
    if not (amax > 0 and math.isfinite(amax)):
        return 1.0
    if recipe.power_of_two_scales:
        k = math.floor(math.log2(fp8_max / amax))
        while math.ldexp(amax, k + 1) <= fp8_max:   # log2's rounding, corrected exactly
            k += 1
        while math.ldexp(amax, k) > fp8_max:
            k -= 1
        return math.ldexp(1.0, min(max(k - recipe.margin, -149), 127))
    return fp8_max / amax / 2.0 ** recipe.margin


def measure(values: Any, recipe: Any, gradient: bool) -> tuple[str, float, float, float,
                                                              float]:
    """``(format, amax, scale, overflow, underflow)`` of a host array under ``recipe``."""
    import numpy as np

    name = recipe.backward_format if gradient else recipe.forward_format
    fmt = _formats.get(_FORMAT_NAMES[name])
    v = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    v = v[np.isfinite(v) & (v != 0)]
    if v.size == 0:
        return fmt.name, 0.0, 1.0, 0.0, 0.0
    amax = float(v.max())
    scale = recipe_scale(amax, fmt.max, recipe)
    scaled = (v * scale).astype(np.float32).astype(np.float64)   # x * scale in float32
    return (fmt.name, amax, scale, float(np.mean(fmt.overflows(scaled))),
            float(np.mean(scaled <= fmt.flush_threshold)))


def table(operands: list[Float8Operand]) -> str:
    if not operands:
        return "no GEMM ran in the inspected step"
    worst = max(operands, key=lambda o: o.overflow + o.underflow)
    if worst.overflow + worst.underflow == 0.0:   # (max would name the first operand)
        last = "most affected: none (no operand saturates or flushes a value to zero)"
    else:
        last = (f"most affected: {worst.layer} ({worst.phase} {worst.op}, "
                f"{'gradient' if worst.gradient else 'value'} operand {worst.operand})")
    return "\n".join([*(o.describe() for o in operands), last])
