"""Numerics tools: find where Inf/NaN come from and which formats a model's values fit.

- :func:`enable_check_numerics` (TF's name): every op checks its output and raises
  :class:`NumericsError` at the first op that produces Inf or NaN.
- :func:`inspect_numerics`: one float32 step of a model, every forward and backward op measured
  against float16, bfloat16 and float8 formats: the first op to produce a non-finite value,
  overflow, underflow and rounding error per layer, the window of safe loss scales and a
  suggested dtype per layer (:class:`NumericsReport`).
"""

from __future__ import annotations

from mpcore.debugging.check_numerics import (
    NumericsError,
    check_numerics_enabled,
    disable_check_numerics,
    enable_check_numerics,
)
from mpcore.debugging.formats import FORMATS
from mpcore.debugging.inspector import DEFAULT_DTYPES, inspect_numerics
from mpcore.debugging.report import LayerSummary, LossScaleWindow, NumericsReport, OpRecord
from mpcore.debugging.scopes import layer_scope, watching

__all__ = ["DEFAULT_DTYPES", "FORMATS", "LayerSummary", "LossScaleWindow", "NumericsError",
           "NumericsReport", "OpRecord", "check_numerics_enabled", "disable_check_numerics",
           "enable_check_numerics", "inspect_numerics", "layer_scope", "watching"]
