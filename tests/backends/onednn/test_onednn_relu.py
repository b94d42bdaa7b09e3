"""A dense layer's relu on the oneDNN provider: the forward relu after the GEMM and the backward
pass (``relu_grad_bias``) on oneDNN's threads, each with the CPU kernel's bits.

Which dtypes the backward pass trusts oneDNN with depends on the CPU: bfloat16 is rounded by
``vcvtneps2bf16`` where oneDNN uses avx512_bf16 (subnormals flushed to zero: the probe rejects
it) and in software elsewhere; the probes under every ISA this CPU runs are checked in
test_onednn_reorder.py.
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
from onednn_isa import NATIVE_BF16_ISAS, library_or_skip

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)


# --- the forward relu, after the GEMM ---------------------------------------------------------
def test_relu_in_place_is_the_cpu_kernels_relu_nan_included() -> None:
    """Every bfloat16 (the CPU kernel: max in float32, rounded once) and float32's special
    values: NaN stays NaN with its sign, where oneDNN's relu post-op would give 0."""
    from mpcore_onednn.nn import relu_in_place

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    z = every.copy()
    relu_in_place(z.reshape(256, 256))
    with np.errstate(invalid="ignore"):   # signalling NaNs among them
        want = np.maximum(every.astype(F32), np.float32(0)).astype(BF16)
        assert_same_bits(z, want)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38,
                         -3e38, 1.5, -1.5] * 700, F32)
    z32 = specials.copy()
    relu_in_place(z32)
    assert_same_bits(z32, np.maximum(specials, np.float32(0)))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        relu_in_place(np.ones(4, np.float16))


# --- the backward pass on oneDNN's threads ----------------------------------------------------
def _relu_or_skip(monkeypatch: pytest.MonkeyPatch) -> tuple[CpuBackend, Any]:
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "auto")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "on")
    backend = CpuBackend()
    kernel = backend.kernels()["relu_grad_bias"]
    assert kernel.__module__ == "mpcore_onednn.nn", "not installed"
    return backend, kernel


def _runs(kernel: Any) -> int:
    return int(kernel.cache.hits + kernel.cache.misses)


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


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(512, 1024), (4, 128, 300)])
def test_relu_grad_bias_gives_the_cpu_kernels_bits_on_two_threads(
        monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], dtype: np.dtype) -> None:
    backend, kernel = _relu_or_skip(monkeypatch)
    g, y = (a.astype(dtype) for a in _relu_operands(np.random.default_rng(11), shape))
    kernel(g, y)                        # first use: the probe
    before = _runs(kernel)
    dz, db = kernel(g, y)
    want_dz, want_db = backend.relu_grad_bias(g, y)
    # float32 on oneDNN everywhere; bfloat16 where the probe trusts it (see the test below)
    assert (_runs(kernel) > before) == kernel.trusted[dtype]
    assert kernel.trusted[dtype] or dtype != F32
    assert dz.dtype == dtype and dz.shape == shape and db.shape == (shape[-1],)
    bits = np.uint32 if dtype.itemsize == 4 else np.uint16
    assert np.array_equal(dz.view(bits), want_dz.view(bits))  # signed zeros too
    if dtype != np.float32:  # the same GEMV as the CPU kernel's 16-bit path
        assert np.array_equal(db.view(bits), want_db.view(bits))
        return
    rows = want_dz.reshape(-1, shape[-1]).astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.abs(rows).sum(axis=0) + 1e-30
    assert (np.abs(db - rows.sum(axis=0)) <= bound).all()


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
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
    import mpcore_onednn.nn as relu

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
    """The NaN rule rests on how oneDNN computes max, and bfloat16 on how it rounds: a dtype
    the probe rejects stays with the CPU kernel for the whole process. float32 passes on
    every x86 CPU; bfloat16 fails where oneDNN rounds with vcvtneps2bf16 (a subnormal
    gradient would become 0) and passes where it rounds in software (under other ISAs:
    test_onednn_reorder.py)."""
    import mpcore_onednn.nn as relu

    backend, kernel = _relu_or_skip(monkeypatch)
    isa = kernel.cache.library.isa
    assert relu._probe(kernel.cache, backend.relu_grad_bias, F32)
    trusts_bf16 = relu._probe(kernel.cache, backend.relu_grad_bias, BF16)
    if isa in NATIVE_BF16_ISAS:
        assert not trusts_bf16, isa
    elif isa == "avx512_core":
        assert trusts_bf16, isa
    g, y = _relu_operands(np.random.default_rng(4), (512, 512))
    for dtype in (F32, BF16):           # whatever the verdict: the CPU kernel's bits
        kernel(g.astype(dtype), y.astype(dtype))
        before = _runs(kernel)
        dz, _ = kernel(g.astype(dtype), y.astype(dtype))
        assert (_runs(kernel) > before) == kernel.trusted[dtype]
        assert_same_bits(dz, backend.relu_grad(g.astype(dtype), y.astype(dtype)))
    assert kernel.trusted == {F32: True, BF16: trusts_bf16}
    # a library that disagreed even on float32
    monkeypatch.setattr(relu, "_probe", lambda cache, original, dtype: False)
    backend, kernel = _relu_or_skip(monkeypatch)
    before = _runs(kernel)
    dz, _ = kernel(g, y)
    assert _runs(kernel) == before and kernel.trusted == {F32: False}
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
    for dtype in (F32, BF16):
        dz, db = kernel(g.astype(dtype), y.astype(dtype))
        want_dz, want_db = backend.relu_grad_bias(g.astype(dtype), y.astype(dtype))
        assert_same_bits(dz, want_dz)
        assert_same_bits(db, want_db)
    assert kernel.trusted == {F32: False, BF16: False}
    kernel.trusted[BF16] = True      # past the probe, the call itself fails: the same answer
    dz, _ = kernel(g.astype(BF16), y.astype(BF16))
    assert_same_bits(dz, backend.relu_grad(g.astype(BF16), y.astype(BF16)))
    assert kernel.trusted[BF16] is False


def test_float32_off_keeps_the_numpy_relu_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")
    kernel_set = mpcore_onednn.mpcore_kernels(CpuBackend())
    # None where this oneDNN has no bfloat16 matmul either
    assert kernel_set is None or "relu_grad_bias" not in kernel_set.kernels

