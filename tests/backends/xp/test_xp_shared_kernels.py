"""mpcore_xp, the shared base of the array-library backends: the kernels NumPy and CuPy spell
the same are written once, and both the CPU and the CUDA backend use them. Run here with NumPy
standing in for CuPy, the CUDA backend's shared kernels give the CPU backend's results bit for
bit (CUDA's own kernels need a GPU: tests/backends/cuda/test_cuda_device.py)."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import numpy as np
import pytest
from conftest import assert_same_bits
from mpcore_cpu import CpuBackend
from mpcore_cuda import CudaBackend
from mpcore_xp import DTYPES, XpBackend

from mpcore.core.dtypes import ALL

BINARY = ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "equal",
          "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
          "logical_or")
UNARY = ("logical_not", "isfinite", "negative", "abs", "sign", "exp", "log", "sqrt", "square",
         "tanh")
SHAPES = ("reshape", "transpose", "broadcast_to", "concat", "getitem", "getitem_grad")


@pytest.fixture
def numpy_cuda() -> CudaBackend:
    be = CudaBackend()
    be._cupy = np  # the backend's array module, imported on first use, is NumPy here
    return be


def test_both_backends_take_the_shared_kernels_from_the_base() -> None:
    for name in (*BINARY, *UNARY, *SHAPES):
        assert getattr(CpuBackend, name) is getattr(XpBackend, name), name
        assert getattr(CudaBackend, name) is getattr(XpBackend, name), name


class _WrappingTake:
    """NumPy with CuPy's ``take``: an index out of range wraps (CuPy's documented behaviour;
    NumPy's own raises)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def take(x: Any, indices: Any, axis: int) -> Any:
        return np.take(x, indices, axis=axis, mode="wrap")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int64"])
def test_cuda_take_marks_an_index_out_of_range(dtype: str) -> None:
    """CUDA's take: the CPU's rows where the index is in range (negative ones count from the
    end), NaN (0 for integers) where it is not, instead of CuPy's wrapped row. On a GPU:
    test_cuda_device.py."""
    be = CudaBackend()
    be._cupy = _WrappingTake()
    x = np.arange(12).reshape(3, 4).astype(DTYPES[dtype])
    cpu = CpuBackend()
    for indices, axis in (([[0, -1], [2, -3]], 0), ([1, 3, -4], 1)):
        idx = np.array(indices)
        assert_same_bits(be.take(x, idx, axis), cpu.take(x, idx, axis))
    got = be.take(x, np.array([1, 4, -5, -3]), 1)
    assert got.dtype == x.dtype and got.shape == (3, 4)
    fill = 0 if dtype == "int64" else np.nan
    np.testing.assert_array_equal(got.astype(np.float64)[:, 1:3], np.full((3, 2), fill))
    np.testing.assert_array_equal(got[:, [0, 3]], x[:, [1, 1]])


def test_one_dtype_table_names_every_dtype() -> None:
    assert set(DTYPES) == set(ALL)
    assert all(DTYPES[name].name == name for name in ALL)


def test_the_base_is_a_library_not_a_plugin() -> None:
    targets = [ep.value for ep in entry_points(group="mpcore")]
    assert "mpcore_cpu" in targets and not any(t.startswith("mpcore_xp") for t in targets)


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)  # positive and moderate: no warning, no overflow
    return rng.uniform(0.5, 2.0, shape).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_shared_elementwise_kernels_match_the_cpu_bit_for_bit(numpy_cuda: CudaBackend,
                                                              dtype: str) -> None:
    cpu = CpuBackend()
    a, b = _values(dtype, (3, 5), 1), _values(dtype, (5,), 2)
    for name in BINARY:
        for x, y in ((a, b), (a, 2.5), (3, b)):
            want: Any = getattr(cpu, name)(x, y)
            got = getattr(numpy_cuda, name)(x, y)
            assert got.dtype == want.dtype, (name, x, y)
            assert_same_bits(got, want)
    for name in UNARY:
        assert_same_bits(getattr(numpy_cuda, name)(a), getattr(cpu, name)(a))


def test_shared_shape_and_reduction_kernels_match_the_cpu(numpy_cuda: CudaBackend) -> None:
    cpu = CpuBackend()
    x = _values("float32", (2, 3, 4), 3)
    idx = np.array([2, 0, 2])
    key = (slice(None), 1, slice(0, 3))
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("reshape", (x, (6, 4))), ("transpose", (x, (2, 0, 1))),
        ("broadcast_to", (x[:, :1], (2, 3, 4))), ("concat", ([x, x], 1)),
        ("take", (x, idx, 2)), ("getitem", (x, key)), ("getitem_grad", (x[key], key, x.shape)),
        ("max", (x, (0, 2), False)), ("min", (x, (1,), True)), ("argmax", (x, 2)),
        ("sum", (x, (1,), False)), ("mean", (x, None, False)),
        ("full", ((2, 2), 1.5, "float32")), ("one_hot", (np.array([1, 0, 3]), 4, "int32")),
    ]
    for name, args in calls:
        assert_same_bits(getattr(numpy_cuda, name)(*args), getattr(cpu, name)(*args))
