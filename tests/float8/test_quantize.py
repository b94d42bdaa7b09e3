"""The FP8 numerics on every backend here: codes bit for bit ml_dtypes' round-to-nearest-even
of the clipped product, saturation, exact power-of-two scaling, amax, dequantisation, the
emulated GEMM, and Transformer Engine's scale rule (its ``test_scale_update_numeric_scenarios``,
tests/pytorch/test_recipe.py, ported)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpcore as mp
from mpcore.mixed_precision import float8

TYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAXES = {"e4m3": 448.0, "e5m2": 57344.0}
FIXTURES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
formats = st.sampled_from(["e4m3", "e5m2"])


def _reference(x: np.ndarray, scale: float, fmt: str) -> np.ndarray:
    """ml_dtypes' codes of clip(x * scale) (float32 product): what every backend must give."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.clip(x.astype(np.float32) * np.float32(scale), -MAXES[fmt], MAXES[fmt])
    return y.astype(TYPES[fmt]).view(np.uint8)


@FIXTURES
@given(values=st.lists(floats32, min_size=1, max_size=40), fmt=formats,
       k=st.integers(-20, 20))
def test_codes_are_ml_dtypes_round_to_nearest_even(backend: mp.Backend, values: list[float],
                                                   fmt: str, k: int) -> None:
    x = np.array(values, np.float32)
    codes, amax = float8.quantize(mp.constant(x), 2.0 ** k, fmt)
    assert codes.dtype == "uint8"
    np.testing.assert_array_equal(codes.numpy(), _reference(x, 2.0 ** k, fmt))
    want = np.max(np.abs(x))
    assert float(amax) == want or (np.isnan(want) and np.isnan(float(amax)))


@FIXTURES
@given(values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=40),
       fmt=formats, scale=st.floats(0.0009765625, 1024.0, width=32))
def test_any_scale_matches_the_reference_bit_for_bit(backend: mp.Backend, values: list[float],
                                                      fmt: str, scale: float) -> None:
    x = np.array(values, np.float32)
    codes, _ = float8.quantize(mp.constant(x), scale, fmt)
    np.testing.assert_array_equal(codes.numpy(), _reference(x, scale, fmt))


@FIXTURES
@given(code=st.integers(0, 255), fmt=formats, k=st.integers(-8, 8))
def test_power_of_two_scaling_is_exact(backend: mp.Backend, code: int, fmt: str,
                                       k: int) -> None:
    """A representable value times 2**k quantises back to itself when it stays in the normal
    range: a power-of-two scale adds no rounding of its own."""
    value = np.array([code], np.uint8).view(TYPES[fmt]).astype(np.float32)
    tiny = float(ml_dtypes.finfo(TYPES[fmt]).smallest_normal)
    scaled = abs(float(value[0])) * 2.0 ** k
    if not np.isfinite(value[0]) or not (scaled == 0 or tiny <= scaled <= MAXES[fmt]):
        return
    x = mp.constant(value * np.float32(2.0 ** -k))
    codes, _ = float8.quantize(x, 2.0 ** k, fmt)
    back = float8.dequantize(codes, 2.0 ** k, format=fmt)
    np.testing.assert_array_equal(back.numpy(), value * np.float32(2.0 ** -k))
    np.testing.assert_array_equal(codes.numpy(), np.array([code], np.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_saturation_clips_to_the_largest_finite_code(backend: mp.Backend, fmt: str) -> None:
    big = MAXES[fmt]
    x = mp.constant(np.array([big * 1.01, -big * 4, np.inf, -np.inf, 1e38, np.nan], np.float32))
    codes = float8.quantize(x, 1.0, fmt)[0].numpy()
    top = 0x7E if fmt == "e4m3" else 0x7B
    assert codes[:5].tolist() == [top, top | 0x80, top, top | 0x80, top]
    assert np.isnan(codes[5:].view(TYPES[fmt]).astype(np.float32)).all()
    assert float8.dequantize(float8.quantize(x, 1.0, fmt)[0], 1.0,
                             format=fmt).numpy()[0] == big


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_16_bit_inputs_and_outputs(backend: mp.Backend, dtype: str) -> None:
    x = np.linspace(-3, 3, 50, dtype=np.float32)
    t = mp.constant(x, dtype=dtype)
    codes, amax = float8.quantize(t, 4.0, "e4m3")
    held = t.numpy().astype(np.float32)
    np.testing.assert_array_equal(codes.numpy(), _reference(held, 4.0, "e4m3"))
    assert float(amax) == np.max(np.abs(held))
    back = float8.dequantize(codes, 4.0, dtype, format="e4m3")
    assert back.dtype == dtype
    want = codes.numpy().view(TYPES["e4m3"]).astype(np.float32) * np.float32(0.25)
    np.testing.assert_array_equal(back.numpy().astype(np.float32), want.astype(
        back.numpy().dtype).astype(np.float32))


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_the_emulated_gemm_multiplies_the_exact_values(backend: mp.Backend, out: str) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 40)), rng.standard_normal((40, 5))
    qa = mp.ops.quantize_fp8(mp.constant(a, dtype="float32"), mp.constant(8.0), "e4m3")[0]
    qb = mp.ops.quantize_fp8(mp.constant(b, dtype="float32"), mp.constant(2.0), "e5m2")[0]
    from mpcore.ops.float8 import FORMATS, Quantized

    y = mp.ops.fp8_matmul(Quantized(qa, mp.constant(8.0), FORMATS["e4m3"]),
                          Quantized(qb, mp.constant(2.0), FORMATS["e5m2"]), dtype=out)
    da = qa.numpy().view(TYPES["e4m3"]).astype(np.float64) / 8
    db = qb.numpy().view(TYPES["e5m2"]).astype(np.float64) / 2
    assert y.dtype == out
    np.testing.assert_allclose(y.numpy().astype(np.float64), da @ db,
                               rtol=1e-5 if out == "float32" else 1e-2, atol=1e-5)


# Transformer Engine's test_scale_update_numeric_scenarios: zero, tiny, normal, inf and NaN amax
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", ["zero", "tiny", "normal", "inf", "nan"])
def test_scale_update_numeric_scenarios(backend: mp.Backend, fmt: str, case: str) -> None:
    fp8_max = np.float32(MAXES[fmt])
    f32_max = np.finfo(np.float32).max
    amax, want = {
        "zero": (0.0, 1.0),
        "tiny": (fp8_max / f32_max / 2, f32_max),    # the quotient overflows: float32's max
        "normal": (0.7316, fp8_max / np.float32(0.7316)),
        "inf": (np.inf, 1.0),
        "nan": (np.nan, 1.0),
    }[case]
    got = mp.ops.fp8_scale(mp.constant(np.float32(amax)), mp.constant(1.0), fmt)
    assert float(got) == float(np.float32(want))


def test_power_of_two_scales_never_overflow_the_format() -> None:
    for amax in (448.0, 449.0, 447.9, 1.0, 3.0, 1e-3, 2.0 ** -20):
        s = float(mp.ops.fp8_scale(mp.constant(amax), mp.constant(1.0), "e4m3",
                                   power_of_two=True))
        assert s == 2.0 ** np.floor(np.log2(s)) and amax * s <= 448.0 < amax * s * 2


def test_bad_arguments_name_the_valid_choices() -> None:
    x = mp.constant([1.0])
    with pytest.raises(ValueError, match="e4m3, e5m2, float8_e4m3fn, float8_e5m2"):
        float8.quantize(x, 1.0, "e3m4")
    with pytest.raises(TypeError, match="uint8"):
        float8.dequantize(x, 1.0, format="e4m3")
    with pytest.raises(ValueError, match="float32, bfloat16"):
        mp.ops.fp8_matmul(*[float8.Quantized(float8.quantize(mp.constant([[1.0]]), 1.0)[0],
                                             mp.constant(1.0),
                                             mp.ops.float8.float8_format("e4m3"))] * 2,
                          dtype="float16")
    with pytest.raises(ValueError, match="float32 tensor of shape"):
        mp.ops.quantize_fp8(x, mp.constant([1.0, 2.0]), "e4m3")
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'format'"):
        float8.dequantize(float8.quantize(x, 1.0)[0], 1.0)  # type: ignore[call-arg]


SIXTEEN_BIT = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_16_bit_pattern_times_power_of_two_scales(backend: mp.Backend, dtype: str,
                                                         fmt: str) -> None:
    """The issue's bar: all 65,536 bit patterns of the 16-bit input (ties, subnormals, the
    448/57344 boundaries, Inf, NaN of either sign), at scales that push values into both
    ends of the format's range, give ml_dtypes' codes of the clipped product bit for bit."""
    x = np.arange(1 << 16, dtype=np.uint16).view(SIXTEEN_BIT[dtype])
    held = x.astype(np.float32)
    t = mp.constant(x, dtype=dtype)
    assert np.array_equal(t.numpy().view(np.uint16), x.view(np.uint16))  # nothing lost on load
    for k in (-16, -7, 0, 1, 9, 24):
        codes, amax = float8.quantize(t, 2.0 ** k, fmt)
        got, want = codes.numpy(), _reference(held, 2.0 ** k, fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"scale 2**{k}: {bad.size} codes differ, first input bits "
                               f"{x.view(np.uint16)[bad[:4]].tolist()}: got "
                               f"{got[bad[:4]].tolist()}, want {want[bad[:4]].tolist()}")
        assert np.isnan(float(amax))   # the NaN patterns are in x: its amax is NaN


@pytest.mark.parametrize("scale", [0.0, -2.0, float("nan"), float("inf")])
def test_a_scale_that_is_no_positive_finite_multiplier_is_refused(scale: float) -> None:
    # it gave codes of zeros (0), flipped signs (-2) or all NaN codes, with no error
    with pytest.raises(ValueError, match=r"float8\.quantize: scale must be a finite number > 0"):
        float8.quantize(np.ones(3, np.float32), scale, "e4m3")
    with pytest.raises(ValueError, match=r"float8\.dequantize: scale must be a finite number"):
        float8.dequantize(np.zeros(3, np.uint8), scale, format="e4m3")
    with pytest.raises(ValueError, match=r"quantize_fp8: scale must be a finite number > 0"):
        mp.ops.quantize_fp8(mp.constant([1.0]), scale, "e4m3")


def test_dequantize_takes_codes_as_a_numpy_array_as_quantize_takes_x() -> None:
    # a NumPy array of codes was "'numpy.ndarray' object has no attribute 'backend'", before
    # the format, the dtype or the codes' own dtype were checked
    codes, _ = float8.quantize(np.array([1.5, -3.0], np.float32), 4.0, "e4m3")
    back = float8.dequantize(codes.numpy(), 4.0, format="e4m3")
    assert back.numpy().tolist() == [1.5, -3.0]
    with pytest.raises(ValueError, match="valid formats: e4m3, e5m2"):
        float8.dequantize(codes.numpy(), 4.0, format="fp8")
    with pytest.raises(TypeError, match="codes must be a uint8 tensor"):
        float8.dequantize(np.zeros(2, np.float32), 4.0, format="e4m3")
