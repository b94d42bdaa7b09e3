"""The oneDNN bfloat16 matmul provider for the CPU backend (mpcore_onednn).

Correctness runs with ``MPCORE_ONEDNN=force`` so it is checked on any x86 CPU (oneDNN emulates
bfloat16 where the CPU lacks avx512_bf16/amx_bf16); it is skipped, with the reason, where the
library cannot be loaded.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import mpcore_onednn
import numpy as np
import pytest
from conftest import assert_same_bits
from mpcore_cpu import CpuBackend
from mpcore_onednn import dnnl

import mpcore as mp
from mpcore.backend import Device

BF16 = np.dtype(ml_dtypes.bfloat16)


def _library_or_skip() -> dnnl.Library:
    try:
        return mpcore_onednn.library()
    except dnnl.DnnlError as exc:
        pytest.skip(f"oneDNN cannot be loaded here: {exc}")


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CPU backend's kernel table with oneDNN forced on (a fresh backend instance)."""
    _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    backend = CpuBackend()
    kernels = backend.kernels()
    assert "mpcore_onednn" in [s.provider for s in backend.kernel_sets]
    return backend, kernels["matmul"]


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(BF16)


def _check(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out`` is bf16(a @ b) with float32 accumulation: off by one bfloat16 rounding of the
    result, plus float32 summation-order noise relative to sum |a||b|."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ref = a32 @ b32
    bound = 2.0**-8 * np.abs(ref) + 1e-5 * (np.abs(a32) @ np.abs(b32)) + 1e-30
    assert out.dtype == BF16
    assert out.shape == ref.shape
    err = np.abs(out.astype(np.float32) - ref)
    assert (err <= bound).all(), f"max error {err.max()} exceeds the bfloat16 rounding bound"


SHAPES = [(1, 1, 1), (3, 17, 5), (33, 1, 65), (64, 64, 64), (130, 257, 63), (7, 300, 2)]


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("mkn", SHAPES)
def test_matmul_transposes_and_odd_shapes(forced: Any, mkn: tuple[int, int, int],
                                          transpose_a: bool, transpose_b: bool) -> None:
    _, matmul = forced
    m, k, n = mkn
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    # stored the way the backward pass hands them over: transposed operands are contiguous
    # arrays of the transposed shape, read in place
    a = _bf16(rng, (k, m) if transpose_a else (m, k))
    b = _bf16(rng, (n, k) if transpose_b else (k, n))
    out = matmul(a, b, transpose_a, transpose_b)
    _check(out, a.T if transpose_a else a, b.T if transpose_b else b)


@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False),
                                                     (False, True), (True, True)])
def test_batched_matmul(forced: Any, transpose_a: bool, transpose_b: bool) -> None:
    _, matmul = forced
    rng = np.random.default_rng(7)
    a = _bf16(rng, (4, 9, 6) if transpose_a else (4, 6, 9))
    b = _bf16(rng, (4, 5, 9) if transpose_b else (4, 9, 5))
    out = matmul(a, b, transpose_a, transpose_b)
    _check(out, np.swapaxes(a, -1, -2) if transpose_a else a,
           np.swapaxes(b, -1, -2) if transpose_b else b)


def test_non_contiguous_operand_is_still_correct(forced: Any) -> None:
    _, matmul = forced
    rng = np.random.default_rng(3)
    a = _bf16(rng, (20, 30))[::2, 1::3]   # neither row- nor column-major
    b = _bf16(rng, (10, 8))
    _check(matmul(a, b, False, False), a, b)


def test_float32_and_float16_run_on_the_float32_gemm(forced: Any) -> None:
    _, matmul = forced
    cache = matmul.cache
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 5), dtype=np.float32)
    b = rng.standard_normal((5, 4), dtype=np.float32)
    # float32 goes to oneDNN too (MPCORE_ONEDNN_FLOAT32, on by default)
    np.testing.assert_allclose(matmul(a, b, False, False), np.matmul(a, b), rtol=1e-5,
                               atol=1e-5)
    before = cache.info()
    # float16: no oneDNN float16 GEMM here, so float32 copies, rounded once at the end
    a16, bt16 = a.astype(np.float16), b.T.astype(np.float16)
    h = matmul(a16, bt16, False, True)
    assert h.dtype == np.float16
    ref = (a16.astype(np.float32) @ bt16.astype(np.float32).T).astype(np.float16)
    np.testing.assert_allclose(h.astype(np.float32), ref.astype(np.float32), rtol=2**-10,
                               atol=1e-3)
    after = cache.info()
    assert after["hits"] + after["misses"] == before["hits"] + before["misses"] + 1   # oneDNN


def test_primitives_are_cached_by_shape_and_layout(forced: Any) -> None:
    _, matmul = forced
    cache = matmul.cache
    rng = np.random.default_rng(2)
    a, b = _bf16(rng, (16, 24)), _bf16(rng, (24, 8))
    start = cache.info()
    for _ in range(3):
        matmul(a, b, False, False)
    info = cache.info()
    assert info["misses"] == start["misses"] + 1
    assert info["hits"] == start["hits"] + 2
    matmul(a.T.copy(), b, True, False)   # another layout: another primitive
    matmul(_bf16(rng, (16, 24)), b, False, False)   # new data, same problem: reused
    info2 = cache.info()
    assert info2["misses"] == info["misses"] + 1
    assert info2["hits"] == info["hits"] + 1
    assert info2["size"] == start["size"] + 2


def test_cache_evicts_least_recently_used() -> None:
    lib = _library_or_skip()
    cache = dnnl.MatmulCache(lib, max_entries=2)
    rng = np.random.default_rng(4)
    for n in (3, 4, 5, 3):
        a, b = _bf16(rng, (2, 6)), _bf16(rng, (6, n))
        _check(cache.matmul(a, b, "bfloat16"), a, b)
    assert len(cache) == 2
    assert cache.info()["misses"] == 4  # n=3 was evicted by n=5 before it came back
    cache.clear()
    assert len(cache) == 0


def test_training_gradients_through_the_ops(forced: Any) -> None:
    """The backward pass's transposed matmuls, end to end through mp.ops and GradientTape."""
    backend, _ = forced
    rng = np.random.default_rng(5)
    x32 = rng.standard_normal((12, 20), dtype=np.float32)
    w32 = rng.standard_normal((20, 7), dtype=np.float32)
    x = mp.constant(x32.astype(BF16), backend=backend)
    w = mp.Variable(w32, backend=backend)
    with mp.GradientTape() as tape:
        y = mp.ops.matmul(x, w.read_as("bfloat16"))
        loss = mp.ops.sum(mp.ops.cast(y, "float32"))
    assert y.dtype == "bfloat16"
    (gw,) = tape.gradient(loss, [w])
    ref = x32.astype(BF16).astype(np.float32).T @ np.ones((12, 7), np.float32)
    np.testing.assert_allclose(np.asarray(gw), ref, rtol=2**-7, atol=1e-2)


def test_off_leaves_the_backend_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_ONEDNN", "off")
    backend = CpuBackend()
    assert mpcore_onednn.mpcore_kernels(backend) is None
    assert "mpcore_onednn" not in [s.provider for s in backend.kernel_sets]
    assert backend.kernels()["matmul"] == backend.matmul
    assert "off" in mpcore_onednn.status()


def test_auto_skips_a_cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_ONEDNN", "auto")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")
    backend = _CpuWith(frozenset({"avx512f"}))
    assert mpcore_onednn.mpcore_kernels(backend) is None
    assert "lacks avx512_bf16" in mpcore_onednn.status()
    verdict = backend.policy_support("mixed_bfloat16", backend.device())
    assert verdict.supported and not verdict.fast


class _CpuWith(CpuBackend):
    """The real CPU backend, judged as a CPU with other flags: the verdict and the plugin's
    choice are functions of the device description."""

    def __init__(self, features: frozenset[str]) -> None:
        self._features = features

    def devices(self) -> list[Device]:
        return [Device(name="described CPU", vendor="test", features=self._features)]


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_auto_uses_it_on_a_bf16_cpu_and_the_verdict_turns_fast(
        monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    lib = _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "auto")
    backend = _CpuWith(frozenset({"avx512f", flag}))
    kernel_set = mpcore_onednn.mpcore_kernels(backend)
    assert kernel_set is not None
    assert kernel_set.fast_dtypes == {"bfloat16"}
    assert lib.version in kernel_set.reason and lib.isa in kernel_set.reason
    support = backend.policy_support("mixed_bfloat16", backend.device())
    assert support.fast, support.reason
    assert flag in support.reason and "oneDNN" in support.reason
    assert not backend.policy_support("mixed_float16", backend.device()).fast


def test_invalid_mode_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_ONEDNN", "sometimes")
    with pytest.raises(ValueError, match="auto, force, off"):
        mpcore_onednn.mpcore_kernels(CpuBackend())


@pytest.mark.parametrize("path", ["/nonexistent/libdnnl.so.3", "libm.so.6"])
def test_a_library_that_fails_to_load_never_breaks_the_cpu_backend(
        monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setattr(mpcore_onednn, "_library", None)
    monkeypatch.setattr(mpcore_onednn, "_load_error", None)
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_LIBRARY", path)
    backend = CpuBackend()
    assert mpcore_onednn.mpcore_kernels(backend) is None
    assert mpcore_onednn.status().startswith("not used: ")
    kernels = backend.kernels()   # through the plugin manager, as at first use
    assert "mpcore_onednn" not in [s.provider for s in backend.kernel_sets]
    a = np.ones((3, 4), BF16)
    out = kernels["matmul"](a, a, False, True)
    assert out.dtype == BF16 and float(out[0, 0]) == 4.0
    assert not backend.policy_support("mixed_bfloat16", backend.device()).fast


# --- the fused optimizer updates on oneDNN's threads ----------------------------------------
def _updates_or_skip(monkeypatch: pytest.MonkeyPatch) -> tuple[CpuBackend, dict[str, Any]]:
    _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "auto")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "on")
    backend = CpuBackend()
    kernels = backend.kernels()
    for name in UPDATES:
        assert getattr(kernels[name], "original", None) is not None, f"{name}: not installed"
    return backend, kernels


def _operands(rng: np.random.Generator, shape: tuple[int, ...], count: int) -> list[np.ndarray]:
    """Weights, gradients and slots over many magnitudes, with signed zeros, tiny and huge
    gradients, infinities and NaN (the updates are not gated here, so they flow through)."""
    n = int(np.prod(shape))
    var = (rng.standard_normal(n) * 0.05).astype(np.float32)
    grad = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 4, n)).astype(np.float32)
    grad[:8] = [0.0, -0.0, 1e-30, -1e-30, 3e38, np.inf, -np.inf, np.nan]
    var[:8] = [-0.0, 0.0, -0.0, 1.0, 0.5, -0.0, 0.25, 1.0]
    slots = []
    for i in range(count - 2):
        slot = (rng.standard_normal(n) * 10.0 ** rng.integers(-14, 3, n)).astype(np.float32)
        slot[:8] = [0.0, -0.0, 0.0, 1e-38, -0.0, 1.0, 2.0, 3.0]
        slots.append(np.abs(slot) if i == count - 3 else slot)  # second moments are >= 0
    return [a.reshape(shape) for a in (var, grad, *slots)]


# name -> (arrays: var, grad, slots..., a function of (arrays, step) giving the call's
# arguments after the arrays, as the optimizers pass them)
UPDATES: dict[str, tuple[int, Any]] = {
    "sgd_update": (3, lambda step: (0.01, 0.9, False, None)),
    "rmsprop_update": (3, lambda step: (None, 1e-3 * step, 0.9, 0.0, 1e-7, None)),
    "adam_update": (4, lambda step: (1e-3, 0.9, 0.999, 1e-7, step, 0.0, None)),
}
VARIANTS: list[tuple[str, int, Any]] = [
    ("sgd_update", 2, lambda step: (None, 0.05, 0.0, False, None)),           # plain SGD
    ("sgd_update", 3, lambda step: (0.01, 0.9, True, None)),                  # Nesterov
    ("adam_update", 4, lambda step: (1e-3, 0.9, 0.999, 1e-7, step, 0.004, None)),  # AdamW
]


def _cases() -> list[tuple[str, int, Any]]:
    return [(name, count, args) for name, (count, args) in UPDATES.items()] + VARIANTS


@pytest.mark.parametrize(("name", "count", "args"), _cases(),
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(_cases())])
@pytest.mark.parametrize("shape", [(784, 1024), (300_001,)])
def test_updates_match_the_numpy_kernels_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch, name: str, count: int, args: Any,
        shape: tuple[int, ...]) -> None:
    backend, kernels = _updates_or_skip(monkeypatch)
    kernel, reference = kernels[name], getattr(backend, name)
    rng = np.random.default_rng(7)
    ours = _operands(rng, shape, max(count, 3))[:count]
    ref = [a.copy() for a in ours]
    misses = kernel.cache.misses
    for step in (1, 2, 3):
        with np.errstate(all="ignore"):  # inf / inf and inf - inf in the reference, on purpose
            kernel(*ours, *args(step))
            reference(*ref, *args(step))
        for got, want in zip(ours, ref):
            assert _same_bits(got, want), f"{name} step {step}"
    assert kernel.cache.misses > misses        # it ran on oneDNN, not on the fallback


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))
                and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def test_updates_respect_the_flag_and_fall_back_where_they_must(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend, kernels = _updates_or_skip(monkeypatch)
    rng = np.random.default_rng(3)
    for name, (count, args) in UPDATES.items():
        kernel = kernels[name]
        arrays = _operands(rng, (512, 512), max(count, 3))[:count]
        before = [a.copy() for a in arrays]
        kernel(*arrays, *args(1)[:-1], np.asarray(False))
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(arrays, before)), name
        kernel(*arrays, *args(1)[:-1], np.asarray(True))
        assert not np.array_equal(arrays[0], before[0], equal_nan=True), name
    # RMSprop with momentum, small arrays and strided arrays take the NumPy kernels
    kernel = kernels["rmsprop_update"]
    misses = kernel.cache.misses
    for shape, momentum, view in [((512, 512), 0.9, lambda a: a), ((64, 64), 0.0, lambda a: a),
                                  ((512, 1024), 0.0, lambda a: a[:, ::2])]:
        ours = [view(a) for a in _operands(rng, shape, 3)]
        ref = [a.copy() for a in ours]
        mom = None if not momentum else np.zeros(ours[0].shape, np.float32)
        mom_ref = None if mom is None else mom.copy()
        with np.errstate(all="ignore"):
            kernel(*ours, mom, 1e-3, 0.9, momentum, 1e-7, None)
            backend.rmsprop_update(*ref, mom_ref, 1e-3, 0.9, momentum, 1e-7, None)
        assert all(_same_bits(g, w) for g, w in zip(ours, ref))
    assert kernel.cache.misses == misses


@pytest.mark.parametrize("inv_scale", [2.0**-15, 0.75, 4.0])
@pytest.mark.parametrize("bad", [None, np.inf, np.nan, 3e38])
@pytest.mark.parametrize("where", [0, 3])
def test_unscale_and_check_matches_the_cpu_kernel(
        monkeypatch: pytest.MonkeyPatch, inv_scale: float, bad: float | None,
        where: int) -> None:
    """Large float32 gradients are scaled on oneDNN's threads: the same bits and the same
    flag as the CPU kernel's, for a non-finite (or, scaled by 4, overflowing) value in the
    first or a later gradient; small, strided and 16-bit gradients take the CPU kernel."""
    backend, kernels = _updates_or_skip(monkeypatch)
    kernel = kernels["unscale_and_check"]
    rng = np.random.default_rng(9)
    big = rng.standard_normal((512, 1024), dtype=np.float32)
    grads = [(rng.standard_normal((784, 1024)) * 1e3).astype(np.float32),
             rng.standard_normal(300_001).astype(np.float32),
             rng.standard_normal(10).astype(np.float32),            # small
             big[:, ::2],                                            # strided
             rng.standard_normal((512, 512)).astype(np.float16)]     # 16-bit
    grads[0].reshape(-1)[:4] = [0.0, -0.0, 1e-45, -3e37]
    if bad is not None:
        if where == 0:
            grads[0].reshape(-1)[12346] = bad
        else:
            big[5, 346] = bad               # an even column: in the strided view
    before = [g.copy() for g in grads]
    calls = kernel.cache.hits + kernel.cache.misses
    with np.errstate(all="ignore"):
        outs, flag = kernel(grads, inv_scale)
        want, want_flag = backend.unscale_and_check(grads, inv_scale)
    assert kernel.cache.hits + kernel.cache.misses == calls + 2   # the two large ones
    assert bool(flag) == bool(want_flag)
    assert bool(flag) == (bad is None or (bad == 3e38 and inv_scale < 1.0))
    for got, expected in zip(outs, want):
        assert got.dtype == np.float32 and _same_bits(got, expected)
    assert all(_same_bits(g, b) if g.dtype == np.float32 else np.array_equal(g, b)
               for g, b in zip(grads, before))                   # inputs untouched


def test_float32_off_keeps_the_numpy_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")
    kernel_set = mpcore_onednn.mpcore_kernels(CpuBackend())
    assert kernel_set is not None and not set(UPDATES) & set(kernel_set.kernels)


# --- a dense layer's relu backward on oneDNN's threads ---------------------------------------
def _relu_or_skip(monkeypatch: pytest.MonkeyPatch) -> tuple[CpuBackend, Any]:
    backend, kernels = _updates_or_skip(monkeypatch)
    kernel = kernels["relu_grad_bias"]
    assert kernel.__module__ == "mpcore_onednn.relu", "not installed"
    return backend, kernel


def _relu_operands(rng: np.random.Generator, shape: tuple[int, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Upstream gradients with signed zeros and subnormals; relu outputs (and arbitrary y)
    with every special value, NaN of both signs included, sprinkled over the array."""
    g = rng.standard_normal(shape, dtype=np.float32)
    y = np.maximum(rng.standard_normal(shape, dtype=np.float32), 0)
    flat_g, flat_y = g.reshape(-1), y.reshape(-1)
    where = rng.choice(flat_y.size, 4000, replace=False)
    flat_g[where[:1000]] = rng.choice(np.array([0.0, -0.0, 1e-45, -1e-45], np.float32), 1000)
    flat_y[where[1000:]] = rng.choice(np.array([np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45,
                                                np.inf, -np.inf, -1.0, 3e38], np.float32), 3000)
    return g, y


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(512, 1024), (4, 128, 300)])
def test_relu_grad_bias_gives_the_cpu_kernels_bits_on_two_threads(
        monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], dtype: np.dtype) -> None:
    import mpcore_onednn.relu as relu

    backend, kernel = _relu_or_skip(monkeypatch)
    ran = []
    select = relu._select
    monkeypatch.setattr(relu, "_select", lambda *a: ran.append(1) or select(*a))
    g, y = (a.astype(dtype) for a in _relu_operands(np.random.default_rng(11), shape))
    dz, db = kernel(g, y)
    want_dz, want_db = backend.relu_grad_bias(g, y)
    assert ran, "it did not run on oneDNN"
    assert dz.dtype == dtype and dz.shape == shape and db.shape == (shape[-1],)
    bits = np.uint32 if dtype.itemsize == 4 else np.uint16
    assert np.array_equal(dz.view(bits), want_dz.view(bits))  # signed zeros too
    if dtype != np.float32:  # the same GEMV as the CPU kernel's 16-bit path
        assert np.array_equal(db.view(bits), want_db.view(bits))
        return
    rows = want_dz.reshape(-1, shape[-1]).astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.abs(rows).sum(axis=0) + 1e-30
    assert (np.abs(db - rows.sum(axis=0)) <= bound).all()


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("alive", [False, True])
def test_relu_grad_bias_redoes_a_non_finite_gradient_on_the_cpu_kernel(
        monkeypatch: pytest.MonkeyPatch, bad: float, alive: bool, dtype: np.dtype) -> None:
    """inf * 0 and inf - inf would put NaN where relu's gradient is +0 (a dead unit) or inf
    (a live one): the non-finite bias gradient sends the call to the exact kernel."""
    backend, kernel = _relu_or_skip(monkeypatch)
    g, y = _relu_operands(np.random.default_rng(5), (256, 1024))
    y[7, 9] = 2.0 if alive else 0.0
    g[7, 9] = bad
    g, y = g.astype(dtype), y.astype(dtype)
    with np.errstate(all="ignore"):
        dz, db = kernel(g, y)
        want_dz, want_db = backend.relu_grad_bias(g, y)
    for got, want in ((dz, want_dz), (db, want_db)):
        assert_same_bits(got, want)
    assert np.isfinite(db.astype(np.float32)).all() != alive


def test_relu_grad_bias_leaves_other_calls_to_the_cpu_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mpcore_onednn.relu as relu

    backend, kernel = _relu_or_skip(monkeypatch)
    ran = []
    monkeypatch.setattr(relu, "_select", lambda *a: ran.append(1))
    rng = np.random.default_rng(2)
    big = rng.standard_normal((512, 512), dtype=np.float32)
    for g, y in [(big[:64, :64], big[:64, :64]),                     # small
                 (big[:, ::2], np.ascontiguousarray(big[:, ::2])),     # strided
                 (big, big[:, :1]),                                    # broadcast
                 (big.astype(np.float16), big.astype(np.float16)),    # another dtype
                 (big, big.astype(BF16))]:                             # two dtypes
        got = kernel(g, y)
        want = backend.relu_grad_bias(g, y)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert not ran


def test_relu_grad_bias_trusts_onednn_only_after_the_probe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The NaN rule rests on how oneDNN computes max: a library that disagreed would leave
    the job to the CPU kernel for the whole process."""
    import mpcore_onednn.relu as relu

    backend, kernel = _relu_or_skip(monkeypatch)
    for dtype in (np.dtype(np.float32), BF16):                   # this library passes
        assert relu._probe(kernel.cache, backend.relu_grad_bias, dtype)
    monkeypatch.setattr(relu, "_probe", lambda cache, original, dtype: False)
    backend, kernel = _relu_or_skip(monkeypatch)
    ran = []
    monkeypatch.setattr(relu, "_select", lambda *a: ran.append(1))
    g, y = _relu_operands(np.random.default_rng(4), (512, 512))
    dz, _ = kernel(g, y)
    assert not ran and kernel.trusted == {np.dtype(np.float32): False}
    assert np.array_equal(dz.view(np.uint32), backend.relu_grad(g, y).view(np.uint32))


def test_relu_grad_bias_without_the_primitive_stays_on_the_cpu_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A oneDNN build or CPU without the bfloat16 binary primitive: reported as
    dnnl_unimplemented, never raised to the training step."""
    backend, kernel = _relu_or_skip(monkeypatch)

    def unimplemented(*args: Any, **kwargs: Any) -> None:
        raise dnnl.DnnlError("dnnl_binary_primitive_desc_create failed: dnnl_unimplemented")

    monkeypatch.setattr(kernel.cache, "run", unimplemented)
    g, y = _relu_operands(np.random.default_rng(6), (512, 512))
    for dtype in (np.dtype(np.float32), BF16):
        dz, db = kernel(g.astype(dtype), y.astype(dtype))
        want_dz, want_db = backend.relu_grad_bias(g.astype(dtype), y.astype(dtype))
        assert_same_bits(dz, want_dz)
        assert_same_bits(db, want_db)
    assert kernel.trusted == {np.dtype(np.float32): False, BF16: False}
    kernel.trusted[BF16] = True      # past the probe, the call itself fails: the same answer
    dz, _ = kernel(g.astype(BF16), y.astype(BF16))
    assert_same_bits(dz, backend.relu_grad(g.astype(BF16), y.astype(BF16)))
    assert kernel.trusted[BF16] is False


def test_float32_off_keeps_the_numpy_relu_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")
    kernel_set = mpcore_onednn.mpcore_kernels(CpuBackend())
    assert kernel_set is not None and "relu_grad_bias" not in kernel_set.kernels


# --- float32 <-> bfloat16 conversions as reorders -------------------------------------------
def _reorder_cast(fallback: Any = None) -> Any:
    from mpcore_onednn.reorder import ReorderCache, ReorderCast

    return ReorderCast(fallback or (lambda x, dtype: x.astype(dtype)),
                       ReorderCache(_library_or_skip()))


def test_reorders_convert_bfloat16_as_astype_bit_for_bit() -> None:
    cast = _reorder_cast()
    every = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    assert_same_bits(cast(every, np.float32), every.astype(np.float32))
    # float32 -> bfloat16 over a sweep of bit patterns (every 4093rd of the 2^32, so every
    # exponent and sign), round-to-even ties and their neighbours, and the overflow edge;
    # all 2^32 patterns were checked once when this kernel was written (0 mismatches)
    sweep = np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32)
    high = np.random.default_rng(0).integers(0, 1 << 16, 1 << 15, dtype=np.uint32) << 16
    ties = np.concatenate([high | 0x8000, high | 0x7FFF, high | 0x8001, high | 0x18000 >> 1])
    edges = np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF, 0x00000001, 0x80008000,
                      0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF], np.uint32)
    patterns = np.concatenate([sweep, ties, edges]).view(np.float32)
    with np.errstate(invalid="ignore"):
        want = patterns.astype(BF16)
    assert_same_bits(cast(patterns, BF16), want)
    assert cast.calls == 2


def test_reorders_hand_what_they_do_not_convert_to_the_kernel_they_wrap() -> None:
    handed: list[tuple[np.dtype, np.dtype]] = []

    def fallback(x: np.ndarray, dtype: Any) -> np.ndarray:
        handed.append((x.dtype, np.dtype(dtype)))
        return x.astype(dtype)

    cast = _reorder_cast(fallback)
    big = np.ones((256, 256), np.float32)
    assert cast(big, BF16).dtype == BF16 and cast.calls == 1
    cast(big[:8, :8], BF16)                           # small
    cast(big[:, ::2], BF16)                           # not contiguous
    cast(big, np.float16)                             # a pair it does not make
    cast(big.astype(BF16), np.float16)
    assert cast.calls == 1
    assert handed == [(np.dtype(np.float32), BF16)] * 2 + [
        (np.dtype(np.float32), np.dtype(np.float16)), (BF16, np.dtype(np.float16))]


def test_the_cpu_backend_converts_bfloat16_through_onednn_and_float16_through_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mpcore_onednn.reorder import ReorderCast

    _library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    backend = CpuBackend()
    kernel = backend.kernels()["convert"]
    chain = [kernel]
    while hasattr(chain[-1], "fallback"):
        chain.append(chain[-1].fallback)
    reorder = next(k for k in chain if isinstance(k, ReorderCast))
    x = np.random.default_rng(3).standard_normal((300, 200), dtype=np.float32)
    y = mp.ops.cast(mp.constant(x, backend=backend), "bfloat16")
    assert reorder.calls == 1 and np.array_equal(y.numpy(), x.astype(BF16))
    half = mp.ops.cast(mp.constant(x, backend=backend), "float16")
    assert reorder.calls == 1 and np.array_equal(half.numpy(), x.astype(np.float16))
