"""Checks of public arguments, with errors that name the argument and its valid values.

One rule for Model's entry points, the optimizers and the callbacks: an integer argument takes
a Python or NumPy integer (not a bool, a float or a string: ``batch_size=2.7`` is not silently
truncated, nor ``"32"`` parsed), a number argument a finite Python or NumPy real number (not a
bool or a string); both are checked against their range before any work starts. Every problem
is a ValueError, as elsewhere in mpcore.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence
from typing import Any

#: ``verbose`` of fit/evaluate/predict, as Keras: "auto" is 1.
VERBOSE_CHOICES = (0, 1, 2, "auto")


def is_integer(value: Any) -> bool:
    """An integer (Python's or NumPy's), not a bool."""
    # bool is an int to Python but never a count: verbose=True, batch_size=True are mistakes.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, if it is an integer >= ``minimum``."""
    if not is_integer(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def batch_size(value: Any) -> int:
    """``batch_size`` of fit/evaluate/predict: None (32, as Keras) or an integer >= 1."""
    return 32 if value is None else integer("batch_size", value, 1)


def _describe(low: float, high: float | None, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"> {low:g}" if low_open else f">= {low:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _as_float(value: Any) -> float:
    """A real number as a float (NaN for anything else, inf beyond the float range)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range
        return math.inf


def number(name: str, value: Any, low: float | None = None, high: float | None = None,
           *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float, if it is a finite real number in the given range (``low`` and
    ``high`` included unless ``low_open``/``high_open``)."""
    value_f = _as_float(value)
    above = low is None or (value_f > low if low_open else value_f >= low)
    below = high is None or (value_f < high if high_open else value_f <= high)
    if not (math.isfinite(value_f) and above and below):
        where = "" if low is None else f" {_describe(low, high, low_open, high_open)}"
        raise ValueError(f"{name} must be a finite number{where}, got {value!r}")
    return value_f


def flag(name: str, value: Any) -> bool:
    """``value``, if it is True or False (a string such as "batch" is not silently truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def verbose(value: Any) -> int:
    """``verbose``: 0 (silent), 1 (progress bar), 2 (one line) or "auto" (1)."""
    if isinstance(value, str) and value == "auto":
        return 1
    if not is_integer(value) or value not in (0, 1, 2):
        raise ValueError(f"verbose must be 0 (silent), 1 (progress bar), 2 (one line) or "
                         f"'auto', got {value!r}")
    return int(value)


def instances(name: str, value: Any, kind: type, kind_name: str) -> list[Any]:
    """``value`` (None, or a list or tuple of ``kind``) as a list."""
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(
            isinstance(v, kind) for v in value):
        raise ValueError(f"{name} must be a list of {kind_name} instances, got {value!r}")
    return list(value)


def accepted_arguments(cls: type) -> set[str] | None:
    """The keyword arguments ``cls(...)`` takes, following ``**kwargs`` up the classes it is
    passed to; None where it ends in a catch-all (then anything is passed on)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
        # ``**keras_options`` (the optimizers'): Keras' names of features mpcore lacks, taken
        # at their off values and refused otherwise; not a catch-all to pass a config through
        if not any(p.kind is p.VAR_KEYWORD and p.name != "keras_options" for p in params):
            return names
    return None
