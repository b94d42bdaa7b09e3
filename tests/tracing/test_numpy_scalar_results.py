"""A kernel's result that is a NumPy scalar (the CPU's 0-d float64 reductions give
``np.float64``, a subclass of ``float``) is a value of the step, computed afresh at each
replay: it was recorded as a Python constant, so a traced ``sum`` of a float64 tensor gave the
first call's result at every call (found while recording Adam's float64 step size)."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_reduction_to_a_numpy_scalar_replays_afresh(dtype: str) -> None:
    total = mp.function(lambda x: mp.ops.sum(x) * 2.0)
    root = mp.function(lambda x: mp.ops.sqrt(mp.ops.sum(x)))
    for value in (1.0, 2.0, 3.0):
        x = mp.constant(np.full(3, value, dtype))
        assert float(total(x).numpy()) == 6.0 * value
        np.testing.assert_allclose(float(root(x).numpy()), np.sqrt(3.0 * value), rtol=1e-6)
    assert total.tracing_count == root.tracing_count == 1


def test_a_python_float_argument_is_still_a_constant() -> None:
    f = mp.function(lambda x, k: x * k)
    x = mp.constant(np.ones(2, np.float32))
    assert f(x, 2.0).numpy().tolist() == [2.0, 2.0]
    assert f(x, 3.0).numpy().tolist() == [3.0, 3.0]      # another value: another signature
    assert f.tracing_count == 2


def test_two_0d_boolean_results_stay_two_values() -> None:
    """NumPy gives a 0-d comparison as the shared np.True_/np.False_: two flags of a step were
    one object, so the replay read the first flag for both (-1 > 0 and not -1 > 0 gave True)."""
    f = mp.function(lambda x, y: mp.ops.logical_and(
        mp.ops.greater(x, 0.0), mp.ops.logical_not(mp.ops.greater(y, 0.0))))
    for a, b in [(1.0, -1.0), (1.0, 1.0), (-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0)]:
        got = bool(f(mp.constant(np.float32(a)), mp.constant(np.float32(b))).numpy())
        assert got == (a > 0 and not b > 0), (a, b)
    assert f.tracing_count == 1
