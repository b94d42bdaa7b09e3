"""The shared (NumPy/CuPy) gelu and gelu_grad kernels, which CUDA and the CPU run (the CPU's
oneDNN provider takes float32 and bfloat16): checked here with NumPy against the CPU's kernel
table and math.erf in float64."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from mpcore_xp.nn import NnKernels

import mpcore as mp


@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16])
def test_shared_gelu_matches_the_cpu_kernels(on_cpu: mp.Backend, approximate: bool,
                                             dtype: type) -> None:
    x = np.linspace(-5, 5, 301).astype(dtype)
    g = np.cos(np.arange(301)).astype(dtype)
    y, saved = NnKernels.gelu(on_cpu, x, approximate)  # type: ignore[arg-type]
    dx = NnKernels.gelu_grad(on_cpu, g, x, saved, approximate)  # type: ignore[arg-type]
    cy, csaved = on_cpu.kernels()["gelu"](x, approximate)
    cdx = on_cpu.kernels()["gelu_grad"](g, x, csaved, approximate)
    assert y.dtype == dx.dtype == np.dtype(dtype)
    tol = {np.float32: 1e-6, np.float64: 1e-12}.get(dtype, 1e-2)
    np.testing.assert_allclose(y.astype(np.float64), cy.astype(np.float64), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx.astype(np.float64), cdx.astype(np.float64), rtol=tol,
                               atol=tol)
    if dtype == np.float64 and not approximate:
        want = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-14)
