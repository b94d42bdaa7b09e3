"""The oneDNN bfloat16 matmul provider for the CPU backend (mpcore_onednn).

Correctness runs with ``MPCORE_ONEDNN=force`` so it is checked on any x86 CPU (oneDNN emulates
bfloat16 where the CPU lacks avx512_bf16/amx_bf16); it is skipped, with the reason, where the
library cannot be loaded. The dense layer's relu is tested in test_onednn_relu.py, the
bfloat16 conversions in test_onednn_reorder.py, every kernel's NaN and infinities in
tests/backends/cpu/test_cpu_providers_nonfinite.py.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import mpcore_onednn
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_onednn.matmul import MatmulCache
from onednn_isa import library_or_skip, onednn_backend, run_under

import mpcore as mp
from mpcore.core.backend import Device

BF16 = np.dtype(ml_dtypes.bfloat16)

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh CPU backend with oneDNN forced on (its small GEMMs too), and its matmul."""
    backend = onednn_backend(monkeypatch, "force", small_gemms_on_onednn=True)
    return backend, backend.kernels()["matmul"]


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
    lib = library_or_skip()
    cache = MatmulCache(lib, max_entries=2)
    rng = np.random.default_rng(4)
    for n in (3, 4, 5, 3):
        a = rng.standard_normal((2, 6), dtype=np.float32)
        b = rng.standard_normal((6, n), dtype=np.float32)
        np.testing.assert_allclose(cache.matmul(a, b, "float32"), a @ b, rtol=1e-5, atol=1e-6)
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
    lib = library_or_skip()
    missing = mpcore_onednn._missing_gemm(lib, "bfloat16")
    if missing is not None:    # see the test below
        pytest.skip(f"described as {flag}, but {missing}")
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


_NO_BFLOAT16_GEMM = """
import json
import ml_dtypes, numpy as np
import mpcore_onednn
from mpcore_cpu import CpuBackend


backend = CpuBackend()
kernels = backend.kernels()
a = np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10).astype(ml_dtypes.bfloat16)
out = kernels["matmul"](a, a, False, True)
want = (a.astype(np.float32) @ a.astype(np.float32).T).astype(ml_dtypes.bfloat16)
print(json.dumps({"isa": mpcore_onednn.library().isa, "status": mpcore_onednn.status(),
                  "fast": sorted(backend.fast_dtypes_from_plugins()),
                  "exact": bool(np.array_equal(out.view(np.uint16), want.view(np.uint16)))}))
"""


@pytest.mark.parametrize("float32", ["on", "off"])
def test_forced_where_onednn_has_no_bfloat16_matmul_bfloat16_takes_the_float32_gemm(
        float32: str) -> None:
    """oneDNN 3.2 has no bfloat16 matmul below AVX-512, not even emulated (an AVX2-only
    CPU: for real, in a process whose oneDNN is capped at avx2): forced, bfloat16 takes the
    float32 route (oneDNN's float32 GEMM, or NumPy's with float32 off) instead of failing."""
    library_or_skip()
    found = run_under("AVX2", _NO_BFLOAT16_GEMM, MPCORE_ONEDNN_FLOAT32=float32)
    if found["isa"] != "avx2":
        pytest.skip(f"this CPU runs oneDNN at {found['isa']}, not avx2")
    assert found["exact"] and found["fast"] == []
    assert "no bfloat16 matmul at ISA avx2 (dnnl_unimplemented)" in found["status"]
    assert found["status"].startswith("used: " if float32 == "on" else "not used: ")


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
    library_or_skip()
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


def _rates(step: int, weight_decay: float) -> np.ndarray:
    """Adam's (alpha, lr*wd) at ``step`` (lr 1e-3), as the optimizer hands them over."""
    return CpuBackend().adam_rates(np.array(step - 1, np.int64), 1e-3, 0.9, 0.999,
                                   weight_decay)


# name -> (arrays: var, grad, slots..., a function of (arrays, step) giving the call's
# arguments after the arrays, as the optimizers pass them)
UPDATES: dict[str, tuple[int, Any]] = {
    "sgd_update": (3, lambda step: (0.01, 0.9, False, None)),
    "rmsprop_update": (3, lambda step: (None, 1e-3 * step, 0.9, 0.0, 1e-7, None)),
    "adam_update": (4, lambda step: (_rates(step, 0.0), 0.9, 0.999, 1e-7, 0.0, None)),
}
VARIANTS: list[tuple[str, int, Any]] = [
    ("sgd_update", 2, lambda step: (None, 0.05, 0.0, False, None)),           # plain SGD
    ("sgd_update", 3, lambda step: (0.01, 0.9, True, None)),                  # Nesterov
    ("adam_update", 4, lambda step: (_rates(step, 0.004), 0.9, 0.999, 1e-7, 0.004, None)),
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
    runs = _onednn_runs(kernel)
    for step in (1, 2, 3):
        with np.errstate(all="ignore"):  # inf / inf and inf - inf in the reference, on purpose
            kernel(*ours, *args(step))
            reference(*ref, *args(step))
        for got, want in zip(ours, ref):
            assert _same_bits(got, want), f"{name} step {step}"
    assert _onednn_runs(kernel) > runs        # it ran on oneDNN, not on the fallback


def _onednn_runs(kernel: Any) -> int:
    """How many calls ``kernel`` made on oneDNN: SGD's and RMSprop's count their runs (their
    primitives are their own), the others' go through the primitive cache."""
    passes = getattr(kernel, "passes", None)
    return passes.runs if passes is not None else kernel.cache.hits + kernel.cache.misses


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
    runs = _onednn_runs(kernel)
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
    assert _onednn_runs(kernel) == runs


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
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")
    kernel_set = mpcore_onednn.mpcore_kernels(CpuBackend())
    # None where this oneDNN has no bfloat16 matmul either (see above)
    assert kernel_set is None or not set(UPDATES) & set(kernel_set.kernels)
