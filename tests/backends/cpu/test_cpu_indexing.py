"""The CPU backend's ``take_grad`` along axis 0 (a segmented sum of the rows sorted by index):
the scatter-add's result to float rounding, repeated and absent indices, shapes of any rank,
and the shared kernel's behaviour where it hands over (16 bits, another axis, bad indices)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mpcore as mp

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ids_shape,rows", [((64,), 5), ((8, 16), 98), ((3, 4, 5), 7)])
def test_take_grad_sums_repeated_rows(on_cpu: mp.Backend, dtype: type, ids_shape: tuple,
                                      rows: int) -> None:
    ids = RNG.integers(0, rows, ids_shape)
    g = RNG.standard_normal((*ids_shape, 6)).astype(dtype)
    want = np.zeros((rows, 6), np.float64)
    np.add.at(want, ids, g.astype(np.float64))
    got = on_cpu.kernels()["take_grad"](g, ids, 0, (rows, 6))
    assert got.dtype == dtype and got.shape == (rows, 6)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    absent = np.setdiff1d(np.arange(rows), ids)
    assert not got[absent].any()


def test_take_grad_hands_over_to_the_shared_kernel(on_cpu: mp.Backend) -> None:
    k = on_cpu.kernels()["take_grad"]
    g16 = np.ones((4, 2), ml_dtypes.bfloat16)
    out = k(g16, np.array([0, 0, 1, 1]), 0, (3, 2))
    assert out.dtype == g16.dtype and np.asarray(out, np.float32)[0, 0] == 2.0
    g = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(k(g, np.array([1, 1, 0, 1]), 1, (2, 3)),
                                  [[1, 3, 0], [1, 3, 0]])
    with pytest.raises(IndexError):
        k(np.ones((2, 2), np.float32), np.array([0, 5]), 0, (3, 2))
