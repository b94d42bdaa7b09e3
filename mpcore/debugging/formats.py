"""The candidate 16- and 8-bit formats the inspector measures values against, and what a value
of float32 becomes in each: overflow, a subnormal, a flush to zero, or a rounding error.

The format table is plain numbers (checked against ``ml_dtypes.finfo`` in the tests), so a bad
dtype name is refused without importing NumPy. The measurements run on host copies with NumPy
and ml_dtypes, imported when first measured: like :mod:`mpcore.conformance`, the inspector is
a tool that reads every value to the host, not a training path.

Float8 casts in ml_dtypes do not saturate (500.0 becomes NaN in float8_e4m3fn), so values are
clipped to the format's range before the cast that measures the rounding error; the overflow
itself is counted from the magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    """A floating format: its largest finite value, smallest normal and subnormal magnitudes and
    the bits of its significand after the point."""

    name: str
    max: float
    smallest_normal: float
    smallest_subnormal: float
    mantissa_bits: int

    @property
    def overflow_threshold(self) -> float:
        """Half an ulp above ``max``: larger magnitudes overflow, and so does this one where
        the tie rounds away from ``max`` (see :meth:`overflows`)."""
        return self.max + 2.0 ** (math.floor(math.log2(self.max)) - self.mantissa_bits - 1)

    @property
    def tie_overflows(self) -> bool:
        """Whether the tie at :attr:`overflow_threshold` overflows: round-to-nearest-even
        leaves it at ``max`` only where ``max``'s significand is even (float8_e4m3fn, whose
        all-ones significand is NaN)."""
        ulp = 2.0 ** (math.floor(math.log2(self.max)) - self.mantissa_bits)
        return int(self.max / ulp) % 2 == 1

    def overflows(self, magnitude: Any) -> Any:
        """Whether ``magnitude`` (a number or an array) rounds past ``max``."""
        threshold = self.overflow_threshold
        return magnitude >= threshold if self.tie_overflows else magnitude > threshold

    @property
    def flush_threshold(self) -> float:
        """The largest magnitude that rounds to zero (half the smallest subnormal: the tie
        rounds to the even zero)."""
        return self.smallest_subnormal / 2

    @property
    def normal_threshold(self) -> float:
        """The smallest magnitude that rounds to a normal number (half a subnormal step below
        the smallest normal: the tie rounds up, to its even significand)."""
        return self.smallest_normal - self.smallest_subnormal / 2

    @property
    def log2_range(self) -> tuple[float, float]:
        return math.log2(self.smallest_normal), math.log2(self.max)


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("float16", 65504.0, 2.0 ** -14, 2.0 ** -24, 10),
    Format("bfloat16", 3.3895313892515355e38, 2.0 ** -126, 2.0 ** -133, 7),
    Format("float8_e4m3fn", 448.0, 2.0 ** -6, 2.0 ** -9, 3),
    Format("float8_e5m2", 57344.0, 2.0 ** -14, 2.0 ** -16, 2),
    Format("float8_e4m3fnuz", 240.0, 2.0 ** -7, 2.0 ** -10, 3),
    Format("float8_e5m2fnuz", 57344.0, 2.0 ** -15, 2.0 ** -17, 2),
)}


def get(name: Any) -> Format:
    """The format named ``name``; a ValueError lists the valid names."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(f"unknown dtype {name!r} for inspect_numerics: choose from "
                         f"{', '.join(FORMATS)}")
    return fmt


@dataclass(frozen=True)
class Fractions:
    """Of the finite values of a tensor: the fraction that would overflow in a format, the
    fraction of its non-zero values that would turn subnormal or flush to zero, and the relative
    (root-mean-square) rounding error of the values that stay in range."""

    overflow: float
    subnormal: float
    flush_to_zero: float
    relative_error: float

    @property
    def underflow(self) -> float:
        return self.subnormal + self.flush_to_zero


@dataclass(frozen=True)
class Measurement:
    """What the inspector keeps of one op's float32 output (its values are not kept)."""

    size: int
    nonfinite: int
    abs_max: float
    abs_min_nonzero: float     # inf when every value is 0
    exponents: dict[int, int]  # floor(log2 |x|) -> count, over finite non-zero values
    fractions: dict[str, Fractions]


def count_nonfinite(values: Any) -> int:
    """How many of a host array's values are Inf or NaN (without measuring the rest)."""
    import numpy as np

    x = np.asarray(values)
    return int(x.size - np.count_nonzero(np.isfinite(x)))


def measure(values: Any, formats: list[Format]) -> Measurement:
    """Measure a host array of float32 values against each of ``formats``."""
    import numpy as np

    x = np.asarray(values, dtype=np.float32).ravel()
    finite = x[np.isfinite(x)]
    magnitude = np.abs(finite)
    nonzero = magnitude[magnitude > 0]
    exps: dict[int, int] = {}
    if nonzero.size:
        # frexp's exponent is floor(log2 |x|) + 1, exactly (log2 rounds near powers of two)
        exponent = np.frexp(nonzero)[1].astype(np.int64) - 1
        low = int(exponent.min())
        counts = np.bincount(exponent - low)
        exps = {low + int(k): int(counts[k]) for k in np.flatnonzero(counts)}
    abs_max = float(magnitude.max()) if magnitude.size else 0.0
    return Measurement(
        size=int(x.size), nonfinite=int(x.size - finite.size), abs_max=abs_max,
        abs_min_nonzero=float(nonzero.min()) if nonzero.size else math.inf,
        exponents=exps,
        fractions={f.name: _fractions(finite, magnitude, nonzero, abs_max, f)
                   for f in formats})


def _fractions(finite: Any, magnitude: Any, nonzero: Any, abs_max: float,
               fmt: Format) -> Fractions:
    import ml_dtypes
    import numpy as np

    if not finite.size:
        return Fractions(0.0, 0.0, 0.0, 0.0)
    over = fmt.overflows(magnitude)
    overflowing = int(np.count_nonzero(over))
    flush = int(np.count_nonzero(nonzero <= fmt.flush_threshold))
    subnormal = int(np.count_nonzero(nonzero < fmt.normal_threshold)) - flush
    kept = finite[~over] if overflowing else finite
    dtype = np.float16 if fmt.name == "float16" else getattr(ml_dtypes, fmt.name)
    # the difference of a float32 and its rounding is exact in float32; dividing both by the
    # largest magnitude keeps the sums of squares in range
    rounded = np.clip(kept, -fmt.max, fmt.max).astype(dtype).astype(np.float32)
    unit = np.float32(min(1.0 / abs_max, 2.0 ** 100) if abs_max > 0 else 1.0)
    error, kept = (rounded - kept) * unit, kept * unit
    norm = float(np.dot(kept, kept))
    return Fractions(
        overflow=overflowing / finite.size,
        subnormal=subnormal / nonzero.size if nonzero.size else 0.0,
        flush_to_zero=flush / nonzero.size if nonzero.size else 0.0,
        relative_error=math.sqrt(float(np.dot(error, error)) / norm) if norm > 0 else 0.0)
