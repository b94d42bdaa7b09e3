"""The inspector's formats: the table matches ml_dtypes, and what :func:`measure` says a format
does to a float32 value (overflow, subnormal, flush to zero) is what casting it does."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpcore.debugging import formats
from mpcore.debugging.formats import FORMATS, measure

NAMES = list(FORMATS)


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(np.float16) if name == "float16" else np.dtype(getattr(ml_dtypes, name))


@pytest.mark.parametrize("name", NAMES)
def test_the_table_matches_ml_dtypes(name: str) -> None:
    info = ml_dtypes.finfo(_numpy_dtype(name))
    fmt = FORMATS[name]
    assert fmt.max == float(info.max)
    assert fmt.smallest_normal == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.mantissa_bits == int(info.nmant)


def _cast(name: str, value: float) -> float:
    with np.errstate(over="ignore"):
            return float(np.array([value], np.float32).astype(_numpy_dtype(name))[0])


@pytest.mark.parametrize("name", NAMES)
def test_thresholds_are_where_the_cast_changes(name: str) -> None:
    fmt = FORMATS[name]
    below = float(np.nextafter(np.float32(fmt.overflow_threshold), np.float32(0)))
    above = float(np.nextafter(np.float32(fmt.overflow_threshold), np.float32(np.inf)))
    assert math.isfinite(_cast(name, below))
    assert not math.isfinite(_cast(name, above))            # Inf, or NaN in e4m3fn
    assert math.isfinite(_cast(name, fmt.overflow_threshold)) != fmt.tie_overflows
    assert bool(fmt.overflows(fmt.overflow_threshold)) == fmt.tie_overflows
    assert _cast(name, fmt.flush_threshold) == 0.0
    assert _cast(name, float(np.nextafter(np.float32(fmt.flush_threshold), np.float32(1)))) > 0
    assert _cast(name, fmt.normal_threshold) == fmt.smallest_normal
    just_under = float(np.nextafter(np.float32(fmt.normal_threshold), np.float32(0)))
    assert 0 < _cast(name, just_under) < fmt.smallest_normal


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(NAMES),
       value=st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_measure_agrees_with_the_cast(name: str, value: float) -> None:
    fr = measure(np.array([value], np.float32), [FORMATS[name]]).fractions[name]
    cast = _cast(name, value)
    assert fr.overflow == (0.0 if math.isfinite(cast) else 1.0)
    if value != 0 and math.isfinite(cast):
        assert fr.flush_to_zero == (1.0 if cast == 0 else 0.0)
        assert fr.subnormal == (1.0 if 0 < abs(cast) < FORMATS[name].smallest_normal else 0.0)


def test_measure_by_hand() -> None:
    values = np.array([70000.0, 1e-8, 1e-5, 1.0, 0.0, np.inf, -np.nan], np.float32)
    m = measure(values, [FORMATS["float16"], FORMATS["bfloat16"]])
    assert (m.size, m.nonfinite, m.abs_max, m.abs_min_nonzero) == (7, 2, 70000.0,
                                                                   np.float32(1e-8))
    assert m.exponents == {16: 1, -27: 1, -17: 1, 0: 1}
    half = m.fractions["float16"]
    # of 5 finite values one overflows; of 4 non-zero ones 1e-8 flushes and 1e-5 is subnormal
    assert (half.overflow, half.flush_to_zero, half.subnormal) == (0.2, 0.25, 0.25)
    assert half.underflow == 0.5
    assert m.fractions["bfloat16"].overflow == m.fractions["bfloat16"].underflow == 0.0


def test_relative_error_is_the_rounding_error() -> None:
    exact = np.array([1.0, 0.5, -2.0, 448.0], np.float32)
    assert measure(exact, [FORMATS["float8_e4m3fn"]]).fractions["float8_e4m3fn"] \
        .relative_error == 0.0
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096).astype(np.float32)
    for name, bits in (("float16", 10), ("bfloat16", 7)):
        err = measure(x, [FORMATS[name]]).fractions[name].relative_error
        assert 0 < err <= 2.0 ** -(bits + 1)


def test_float8_is_clipped_before_the_cast() -> None:
    # ml_dtypes turns 500 into NaN in e4m3fn: counted as overflow, not as a NaN error
    fr = measure(np.array([500.0, 1.0], np.float32), [FORMATS["float8_e4m3fn"]])
    assert fr.fractions["float8_e4m3fn"].overflow == 0.5
    assert math.isfinite(fr.fractions["float8_e4m3fn"].relative_error)


@pytest.mark.parametrize("bad", ["float8", "fp16", "float32", 16, None])
def test_an_unknown_name_lists_the_valid_ones(bad: object) -> None:
    with pytest.raises(ValueError, match="float16, bfloat16, float8_e4m3fn, float8_e5m2"):
        formats.get(bad)


def test_an_all_zero_tensor() -> None:
    m = measure(np.zeros(4, np.float32), [FORMATS["float16"]])
    assert m.abs_min_nonzero == math.inf and m.exponents == {}
    assert m.fractions["float16"].underflow == 0.0
