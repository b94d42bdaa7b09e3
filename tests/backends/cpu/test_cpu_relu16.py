"""The CPU backend's 16-bit relu on the bits (mpcore_cpu.elementwise): every bfloat16 and
float16 bit pattern gives ``np.maximum(x, 0)``'s bits (negative NaNs stay NaN, -0 and -inf
become +0), for contiguous and strided inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mpcore_cpu import CpuBackend


@pytest.mark.parametrize("dtype", [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)],
                         ids=["bfloat16", "float16"])
def test_every_bit_pattern_matches_maximum(monkeypatch: pytest.MonkeyPatch,
                                           dtype: np.dtype) -> None:
    monkeypatch.setenv("MPCORE_ONEDNN", "off")
    backend = CpuBackend()
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    want = np.maximum(x, np.zeros((), dtype))
    for operand, expect in ((x, want), (x[:, ::3], want[:, ::3]), (x.T, want.T)):
        got = backend.relu(operand)
        assert got.dtype == dtype and got.shape == expect.shape
        np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))
    assert backend.relu(x[0, 0]) == want[0, 0]
