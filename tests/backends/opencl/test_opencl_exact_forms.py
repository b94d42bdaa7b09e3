"""The kernels' builtin-free forms (common.cl: IN_RANGE, MP_ISNAN, MP_ISFINITE, MP_SQRT,
mod_index) give NumPy's bits: at sizes that end inside a work-group, on both sides of
mod_index's 2^20 limit, and for NaN payloads, infinities and signed zeros."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from opencl_cases import cl, host, needs_device  # noqa: F401 - cl: fixture

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -1e-45, 1.0],
                    np.float32)


def _data(n: int) -> np.ndarray:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    k = min(n, SPECIALS.size)
    x[:k] = SPECIALS[:k]
    if n > 12:
        x.view(np.uint32)[9:13] = [0x7F800001, 0xFFC00123, 0x7F7FFFFF, 0x00000001]
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@needs_device
@pytest.mark.parametrize("n", [1, 13, 255, 256, 257, 1000, 4099])
def test_casts_relu_and_checks_match_numpy_bits(cl: Any, n: int) -> None:
    x = _data(n)
    d = cl.asarray(x, "float32")
    bf = host(cl, cl.cast(d, "bfloat16"))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(_bits(bf.astype(ml_dtypes.bfloat16)),
                                      _bits(x.astype(ml_dtypes.bfloat16)))
    with np.errstate(invalid="ignore"):  # NumPy warns on casting NaN; the bits are the test
        xb = x.astype(ml_dtypes.bfloat16)
        widened = xb.astype(np.float32)
    np.testing.assert_array_equal(_bits(host(cl, cl.cast(cl.asarray(xb, "bfloat16"),
                                                          "float32"))), _bits(widened))
    np.testing.assert_array_equal(host(cl, cl.isfinite(d)), np.isfinite(x))
    relu = np.where(np.isnan(x) | (x > 0), x, np.float32(0))
    np.testing.assert_array_equal(_bits(host(cl, cl.relu(d))), _bits(relu))
    y = _data(n)[::-1].copy()
    np.testing.assert_array_equal(_bits(host(cl, cl.maximum(d, cl.asarray(y, "float32")))),
                                  _bits(np.maximum(x, y)))
    assert bool(host(cl, cl.all_finite([d]))[()]) == bool(np.isfinite(x).all())
    fin = np.where(np.isfinite(x), x, np.float32(1))
    assert bool(host(cl, cl.all_finite([cl.asarray(fin, "float32")]))[()])


@needs_device
@pytest.mark.parametrize("rows,c", [(3, 7), (257, 10), (1, 1 << 20), (1048575, 1),
                                    (349525, 3), (1, (1 << 20) + 1), (131071, 9),
                                    (7, 149797)])
def test_bias_add_indexes_exactly_across_the_division_free_limit(cl: Any, rows: int,
                                                                 c: int) -> None:
    x = np.random.default_rng(c).standard_normal((rows, c)).astype(np.float32)
    b = np.arange(c, dtype=np.float32)
    out = host(cl, cl.bias_add(cl.asarray(x, "float32"), cl.asarray(b, "float32")))
    np.testing.assert_array_equal(out, x + b)
