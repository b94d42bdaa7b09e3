"""Numerics tools: find where Inf/NaN come from and which formats a model's values fit.

- :func:`enable_check_numerics` (TF's name): every op checks its output and raises
  :class:`NumericsError` at the first op that produces Inf or NaN.
- :func:`inspect_numerics`: one float32 step of a model, every forward and backward op measured
  against float16, bfloat16 and float8 formats: the first op to produce a non-finite value,
  overflow, underflow and rounding error per layer, the window of safe loss scales and a
  suggested dtype per layer (:class:`NumericsReport`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpcore.debugging.check_numerics import (
    NumericsError,
    check_numerics_enabled,
    disable_check_numerics,
    enable_check_numerics,
)
from mpcore.debugging.formats import FORMATS
from mpcore.layers.scopes import layer_scope, watching

if TYPE_CHECKING:
    from mpcore.debugging.inspector import DEFAULT_DTYPES, inspect_numerics
    from mpcore.debugging.report import LayerSummary, LossScaleWindow, NumericsReport, OpRecord

# The inspector runs models, so it imports the layers, which import this package (for
# scopes): its names load on first use.
_LAZY = {"DEFAULT_DTYPES": "inspector", "inspect_numerics": "inspector",
         "LayerSummary": "report", "LossScaleWindow": "report", "NumericsReport": "report",
         "OpRecord": "report"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpcore.debugging' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mpcore.debugging.{module}"), name)
    globals()[name] = value
    return value

__all__ = ["DEFAULT_DTYPES", "FORMATS", "LayerSummary", "LossScaleWindow", "NumericsError",
           "NumericsReport", "OpRecord", "check_numerics_enabled", "disable_check_numerics",
           "enable_check_numerics", "inspect_numerics", "layer_scope", "watching"]
