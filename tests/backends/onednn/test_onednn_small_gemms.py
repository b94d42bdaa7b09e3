"""Small float32 GEMMs stay on the CPU kernel (``mpcore_onednn.linalg.SMALL_GEMM``): at most
``SMALL_GEMM`` multiply-adds go to NumPy, eager and bound alike, so a traced step gives the
eager step's bits; larger ones and native bfloat16 GEMMs run on oneDNN."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import mpcore_onednn
import numpy as np
import pytest
from mpcore_onednn.linalg import SMALL_GEMM, _small
from onednn_isa import onednn_backend

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return onednn_backend(monkeypatch, "force").kernels()


def _lookups(kernel: Any) -> int:
    return int(kernel.cache.hits + kernel.cache.misses)


@pytest.fixture
def onednn_calls(kernels: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every oneDNN GEMM the kernels make or bind, counted at the cache they share (a bound
    GEMM goes around the cache's lookups)."""
    cache, calls = kernels["matmul"].cache, []

    def counting(name: str) -> Any:
        run = getattr(cache, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return run(*args, **kwargs)

        return counted

    for name in ("matmul", "bind"):
        monkeypatch.setattr(cache, name, counting(name))
    return calls


def _gemm(rng: np.random.Generator, m: int, k: int, n: int, transpose_a: bool,
          transpose_b: bool, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's operands for an (m x k) @ (k x n) product; a transposed flag passes the
    transpose of a contiguous array, as the backward pass does."""
    a = rng.standard_normal((k, m) if transpose_a else (m, k), dtype=np.float32).astype(dtype)
    b = rng.standard_normal((n, k) if transpose_b else (k, n), dtype=np.float32).astype(dtype)
    return a, b


def test_the_limit_counts_multiply_adds_over_the_product_and_its_batch() -> None:
    f32 = np.empty((64, 64), np.float32)
    assert SMALL_GEMM == 64 * 64 * 64
    assert _small("float32", f32, f32, False, False)
    assert not _small("float32", f32, np.empty((64, 65), np.float32), False, False)
    # the transposed flags choose which axes are m, k and n: (10 x 128) @ (128 x 300)
    tall, wide = np.empty((128, 10), np.float32), np.empty((300, 128), np.float32)
    assert not _small("float32", tall, wide, True, True)          # 384000 multiply-adds
    assert _small("float32", tall, np.empty((128, 200), np.float32), True, False)  # 256000
    batched = np.empty((2, 64, 64), np.float32)
    assert not _small("float32", batched, f32, False, False)      # twice 64^3
    assert _small("float32", np.empty((2, 32, 64), np.float32), f32, False, False)
    assert not _small("bfloat16", f32, f32, False, False)          # oneDNN's own bf16 GEMM


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("mkn", [(128, 10, 64), (64, 200, 20)])   # a step's; the engines'
def test_a_small_float32_matmul_runs_on_the_cpu_kernel_eager_and_bound(  # bits differ here
        kernels: dict[str, Any], onednn_calls: list[str], transpose_a: bool, transpose_b: bool,
        mkn: tuple[int, int, int]) -> None:
    matmul = kernels["matmul"]
    rng = np.random.default_rng(0)
    a, b = _gemm(rng, *mkn, transpose_a, transpose_b)
    before = _lookups(matmul)
    got = matmul(a, b, transpose_a, transpose_b)
    bound = matmul.bind(a, b, transpose_a, transpose_b)
    assert bound is not None
    for _ in range(2):
        a, b = _gemm(rng, *mkn, transpose_a, transpose_b)
        want = matmul.original(a, b, transpose_a, transpose_b)
        assert np.array_equal(matmul(a, b, transpose_a, transpose_b).view(np.uint32),
                              want.view(np.uint32))
        assert np.array_equal(bound(a, b, transpose_a, transpose_b).view(np.uint32),
                              want.view(np.uint32))
    assert got.shape == (mkn[0], mkn[2])
    assert _lookups(matmul) == before and onednn_calls == []      # oneDNN never ran


@pytest.mark.parametrize("transpose_a", [False, True])
def test_one_multiply_add_past_the_limit_runs_on_onednn(kernels: dict[str, Any],
                                                        onednn_calls: list[str],
                                                        transpose_a: bool) -> None:
    matmul = kernels["matmul"]
    rng = np.random.default_rng(1)
    at_limit = _gemm(rng, 64, 64, 64, transpose_a, False)
    past = _gemm(rng, 64, 64, 65, transpose_a, False)
    before = _lookups(matmul)
    matmul(*at_limit, transpose_a, False)
    assert _lookups(matmul) == before
    out = matmul(*past, transpose_a, False)
    assert _lookups(matmul) == before + 1
    a, b = past
    ref = (a.T if transpose_a else a).astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    matmul.bind(*at_limit, transpose_a, False)
    assert onednn_calls == ["matmul"]
    matmul.bind(*past, transpose_a, False)
    assert onednn_calls == ["matmul", "bind"]


@pytest.mark.parametrize("activation", [None, "relu"])
def test_a_small_dense_runs_on_the_cpu_kernel_eager_and_bound(kernels: dict[str, Any],
                                                              onednn_calls: list[str],
                                                              activation: str | None) -> None:
    dense = kernels["dense"]
    rng = np.random.default_rng(2)
    x, w = _gemm(rng, 128, 64, 10, False, False)                   # the guide's output layer
    bias = rng.standard_normal(10, dtype=np.float32)
    x[0, :] = np.nan                                               # NaN rows stay NaN
    before = _lookups(dense)
    bound = dense.bind(x, w, bias, activation)
    assert bound is not None
    want = dense.original(x, w, bias, activation)
    for got in (dense(x, w, bias, activation), bound(x, w, bias, activation)):
        assert np.array_equal(got, want, equal_nan=True)
        assert np.isnan(got[0]).all()
    assert _lookups(dense) == before and onednn_calls == []
    big_x, big_w = _gemm(rng, 128, 784, 64, False, False)         # the first layer: oneDNN
    dense(big_x, big_w, None, activation)
    assert _lookups(dense) == before + 1
    dense.bind(big_x, big_w, None, activation)
    assert onednn_calls == ["matmul", "bind"]


def test_small_16_bit_gemms(kernels: dict[str, Any]) -> None:
    """float16 has no oneDNN GEMM: a small one is the CPU kernel's (float32 copies, rounded
    once). bfloat16 stays on oneDNN where oneDNN multiplies it natively (its own rounding,
    not a float32 GEMM's), and is the CPU kernel's where it takes the float32 route."""
    matmul = kernels["matmul"]
    rng = np.random.default_rng(3)
    a, b = _gemm(rng, 32, 16, 8, False, False, np.float16)
    before = _lookups(matmul)
    assert np.array_equal(matmul(a, b, False, False), matmul.original(a, b, False, False))
    assert _lookups(matmul) == before
    a, b = _gemm(rng, 32, 16, 8, False, False, BF16)
    out = matmul(a, b, False, False)
    assert out.dtype == BF16 and out.shape == (32, 8)
    native = "no bfloat16 matmul" not in mpcore_onednn.status()
    assert _lookups(matmul) == before + (1 if native else 0)
