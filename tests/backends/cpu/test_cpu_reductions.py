"""The CPU backend's reductions (backends/cpu/reduce.py: sum, mean, argmax without NumPy's
Python wrappers) give the shared kernels' bits and warnings: the references below are the
formulas the CPU backend ran before it had its own versions."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_cpu.elementwise import quiet

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, -1e-45, 1.0, 1.0,
                    88.0, -104.0], np.float32)


# --- the previous formulas ------------------------------------------------------------------
def ref_sum(x: Any, axis: Any, keepdims: bool) -> Any:
    with quiet():
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype))


def ref_mean(x: Any, axis: Any, keepdims: bool) -> Any:
    with quiet():
        return np.asarray(np.mean(x, axis=axis, keepdims=keepdims, dtype=x.dtype))


def ref_argmax(x: Any, axis: Any) -> Any:
    return np.asarray(np.argmax(x, axis=axis), dtype=np.int64)


# --- helpers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu() -> CpuBackend:
    return CpuBackend()


def _same(a: Any, b: Any) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.kind == "f" or a.dtype == BF16:
        uint = np.dtype(f"u{a.dtype.itemsize}")
        assert np.array_equal(a.view(uint), b.view(uint))
    else:
        assert np.array_equal(a, b)




@pytest.fixture(autouse=True)
def _no_cast_warnings() -> Any:
    with np.errstate(over="ignore"):   # (the inputs' own casts to 16 bits)
        yield


def _recorded(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, sorted(str(w.message) for w in caught)



# --- reductions -----------------------------------------------------------------------------
def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = [np.asarray(np.float32(2.5)), np.float32(-0.0), np.zeros(0, F32),
           np.array([-0.0], F32), np.array([3e38, 3e38], F32), np.array([np.inf, -np.inf], F32)]
    for shape in ((1,), (128,), (128, 10), (1024, 1000), (3, 0, 4)):
        for dtype in (F32, np.float64, F16, BF16, np.int32):
            x = (rng.standard_normal(shape) * 1e3).astype(dtype)
            if dtype in (F32, np.float64) and x.size:
                x.reshape(-1)[::17] = rng.choice(SPECIAL, size=x.reshape(-1)[::17].size)
            out.append(x)
    out.append(np.asfortranarray(out[-7]))
    out.append((rng.standard_normal((64, 20)).astype(F32))[:, ::3])
    return out


AXES = [None, 0, 1, -1, (0, 1), (1,), (-1, 0), (0,), (1, 1), 2, (2,)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("kernel", ["sum", "mean"])
def test_sum_and_mean_bits_and_warnings(cpu: CpuBackend, kernel: str, keepdims: bool) -> None:
    ref_fn = {"sum": ref_sum, "mean": ref_mean}[kernel]
    for x in _arrays():
        for axis in AXES:
            try:
                ref, ref_said = _recorded(ref_fn, x, axis, keepdims)
            except Exception as error:    # a bad axis: the same error
                with pytest.raises(type(error)), warnings.catch_warnings():
                    warnings.simplefilter("ignore")       # (an empty mean's, before it)
                    getattr(cpu, kernel)(x, axis, keepdims)
                continue
            out, said = _recorded(getattr(cpu, kernel), x, axis, keepdims)
            assert type(out) is type(ref)
            _same(out, ref)
            assert said == ref_said


def test_argmax(cpu: CpuBackend) -> None:
    for x in _arrays():
        for axis in (None, 0, 1, -1):
            try:
                ref = ref_argmax(x, axis)
            except Exception as error:
                with pytest.raises(type(error)):
                    cpu.argmax(x, axis)
                continue
            out = cpu.argmax(x, axis)
            assert type(out) is type(ref)
            _same(out, ref)
