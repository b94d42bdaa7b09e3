"""The lean CPU path: fast float16 conversions, the bitwise relu_grad, the fused dense op (its
CPU and oneDNN kernels, its gradient, its fallback), the float32 copies reused across GEMMs, and
the cache-blocked optimizer kernels (bit for bit equal to the plain formulas)."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import mpcore_cpu.creation as cpu_creation
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from mpcore_cpu.creation import convert
from mpcore_cpu.nn import BLOCK as RELU_BLOCK
from mpcore_cpu.optim import BLOCK

import mpcore as mp
from mpcore import ops

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.itemsize == 2 else np.uint32)


# --- conversions ----------------------------------------------------------------------------
def test_float16_to_float32_is_astype_for_every_bit_pattern() -> None:
    every = np.arange(2**16, dtype=np.uint16).view(F16)
    out = convert(every, F32)
    ref = every.astype(F32)
    nan = np.isnan(ref)
    assert np.array_equal(_bits(out)[~nan], _bits(ref)[~nan])
    assert np.isnan(out[nan]).all()
    assert np.array_equal(np.signbit(out[nan]), np.signbit(ref[nan]))


def test_float32_to_float16_is_astype_including_overflow_and_subnormals() -> None:
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1e-8, -1e-8, 2.98e-8, 2.9802322e-8, 5.96e-8, 6.1e-5,
                        65504.0, 65519.99, 65520.0, -7e4, 1e38, np.inf, -np.inf, np.nan,
                        -np.nan, 1.0 + 2**-11, 1.0 + 3 * 2**-11], F32)
    patterns = rng.integers(0, 2**32, 200_000, dtype=np.uint32).view(F32)
    x = np.concatenate([special, patterns, rng.standard_normal(1001, dtype=F32)])
    with np.errstate(all="ignore"):
        ref = x.astype(F16)
    for arr, want in ((x[:-1], ref[:-1]), (x, ref)):   # an even size (fast) and an odd one
        got = convert(arr, F16)
        nan = np.isnan(want)
        assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan])
        assert np.isnan(got[nan]).all() and np.array_equal(np.signbit(got[nan]),
                                                           np.signbit(want[nan]))


@pytest.mark.parametrize("src", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("size", [7, 1 << 20])   # under and over the buffer pool's minimum
def test_widening_to_float32_sets_no_floating_point_flag(src: str, size: int) -> None:
    """convert widens small arrays with no errstate around them (it costs a microsecond a
    cast): every pattern of each narrow dtype, signalling NaNs included, converts under
    ``errstate(all="raise")`` to astype's values."""
    dtype = np.dtype(getattr(ml_dtypes, src, None) or src)
    every = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint32).astype(
        f"u{dtype.itemsize}").view(dtype)
    x = np.resize(every, size)
    with np.errstate(all="raise"):
        got = convert(x, F32)
    want = x.astype(F32)
    nan = np.isnan(want)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan]) and np.isnan(got[nan]).all()


def test_convert_keeps_shape_and_handles_views() -> None:
    x = np.arange(24, dtype=F32).reshape(2, 3, 4) / 7
    for view in (x, x.T, x[:, 1:, ::2]):
        got = convert(view, F16)
        assert got.shape == view.shape
        assert np.array_equal(got, view.astype(F16))
        assert np.array_equal(convert(got, F32), got.astype(F32))
    assert convert(np.float32(3.0), F16) == np.float16(3.0)


def test_cast_op_overflows_quietly_to_inf() -> None:
    with np.errstate(all="raise"):
        out = ops.cast(mp.constant([1e6, -1e6, 1.0, 0.1]), "float16").numpy()
    assert out.dtype == F16 and out[0] == np.inf and out[1] == -np.inf
    assert out[3] == np.float16(0.1)


# --- relu_grad -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_relu_grad_is_zero_where_y_is_not_positive_even_for_inf_gradients(dtype: str) -> None:
    native = {"float32": F32, "float16": F16, "bfloat16": BF16}[dtype]
    y = np.array([[2.0, 0.0, -0.0, -1.0, np.nan, np.inf, 1e-7, -np.inf]], F32).astype(native)
    g = np.array([[np.inf, np.inf, -np.inf, np.nan, 3.0, -2.0, np.nan, 5.0]], F32).astype(native)
    out = CpuBackend().relu_grad(g, y)
    assert out.dtype == native
    expect = np.where(y.astype(F32) > 0, g.astype(F32), 0.0)
    got = out.astype(F32)
    assert np.array_equal(np.isnan(got), np.isnan(expect))
    finite = ~np.isnan(expect)
    assert np.array_equal(got[finite], expect[finite])
    assert not np.signbit(got[expect == 0]).any()   # +0, never -0


def test_relu_grad_matches_where_on_random_data_and_broadcast_gradients() -> None:
    rng = np.random.default_rng(1)
    be = CpuBackend()
    y = np.maximum(rng.standard_normal((64, 33), dtype=F32), 0)
    g = rng.standard_normal((64, 33), dtype=F32)
    assert np.array_equal(be.relu_grad(g, y), np.where(y > 0, g, np.float32(0)))
    row = np.broadcast_to(g[:1], y.shape)   # a broadcast view, as sum's gradient makes
    assert np.array_equal(be.relu_grad(row, y), np.where(y > 0, row, np.float32(0)))
    col = g[:, :1]                           # another shape: the general path
    assert np.array_equal(be.relu_grad(col, y), np.where(y > 0, col, np.float32(0)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(300, 7), (3, RELU_BLOCK + 3), (5, 40, 33),
                                   (3 * (RELU_BLOCK // 64) + 5, 64)],
                         ids=["narrow", "rows-wider-than-a-block", "3d", "several-blocks"])
def test_relu_grad_bias_is_relu_grad_bit_for_bit_and_its_column_sums(
        dtype: str, shape: tuple[int, ...]) -> None:
    native = {"float32": F32, "float16": F16, "bfloat16": BF16}[dtype]
    rng = np.random.default_rng(7)
    g = rng.standard_normal(shape, dtype=F32).astype(native)
    y = np.maximum(rng.standard_normal(shape, dtype=F32), 0).astype(native)
    flat_y = y.reshape(-1)
    flat_y[::11] = -0.0
    flat_y[::13] = np.nan
    be = CpuBackend()
    dz, db = be.relu_grad_bias(g, y)
    assert dz.dtype == native and db.dtype == native and db.shape == (shape[-1],)
    with np.errstate(invalid="ignore"):  # ml_dtypes' NaN compare warns
        want = np.where(y > 0, g, native.type(0))
    assert np.array_equal(_bits(dz), _bits(want))
    assert np.array_equal(_bits(dz), _bits(be.relu_grad(g, y)))
    rows = dz.reshape(-1, shape[-1]).astype(np.float64)
    exact = rows.sum(axis=0)
    resolution = {"float32": 1e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    assert np.all(np.abs(db.astype(np.float64) - exact)
                  <= resolution * (np.abs(rows).sum(axis=0) + np.abs(exact)))


def test_relu_grad_bias_keeps_dropped_infs_out_of_the_bias_gradient() -> None:
    y = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]], F32)
    g = np.array([[1.0, np.inf, np.nan], [np.nan, -np.inf, 4.0]], F32)
    dz, db = CpuBackend().relu_grad_bias(g, y)
    assert np.array_equal(dz, np.array([[1.0, 0.0, np.nan], [0.0, 0.0, 4.0]], F32),
                          equal_nan=True)
    assert db[0] == 1.0 and db[1] == 0.0 and np.isnan(db[2])
    assert not np.signbit(dz[dz == 0]).any()


def test_relu_grad_bias_with_a_broadcast_gradient_takes_the_general_path() -> None:
    rng = np.random.default_rng(2)
    y = np.maximum(rng.standard_normal((8, 5), dtype=F32), 0)
    row = np.broadcast_to(rng.standard_normal((1, 5), dtype=F32), y.shape)
    dz, db = CpuBackend().relu_grad_bias(row, y)
    want = np.where(y > 0, row, np.float32(0))
    assert np.array_equal(dz, want)
    assert np.allclose(db, want.sum(axis=0), rtol=1e-6, atol=1e-6)


# --- the dense op ---------------------------------------------------------------------------
class _NoDense(CpuBackend):
    """The CPU backend without a dense kernel: ops.dense falls back to matmul/bias_add/relu."""

    dense = None  # type: ignore[assignment]


def _data(seed: int, dtype: str) -> tuple[mp.Tensor, mp.Variable, mp.Variable]:
    rng = np.random.default_rng(seed)
    x = mp.constant(rng.standard_normal((6, 5), dtype=F32), dtype=dtype)
    w = mp.Variable(rng.standard_normal((5, 4), dtype=F32))
    b = mp.Variable(rng.standard_normal(4, dtype=F32))
    return x, w, b


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_dense_of_an_empty_batch_of_sequences(dtype: np.dtype) -> None:
    """A (0, 8, 16) input: the result's last axis comes from the weights (reshape cannot infer
    it from zero elements)."""
    x = np.zeros((0, 8, 16), dtype)
    w, b = np.ones((16, 3), dtype), np.ones(3, dtype)
    out = CpuBackend().dense(x, w, b, "relu")
    assert out.shape == (0, 8, 3) and out.dtype == dtype


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dense_value_and_gradients_match_the_composite_ops(dtype: str,
                                                           activation: str | None) -> None:
    x, w, b = _data(2, dtype)
    results = []
    for fused in (True, False):
        with mp.GradientTape() as tape:
            wr, br = w.read_as(dtype), b.read_as(dtype)
            if fused:
                y = ops.dense(x, wr, br, activation)
            else:
                y = ops.bias_add(ops.matmul(x, wr), br)
                y = ops.relu(y) if activation else y
            loss = ops.sum(ops.cast(y, "float32") * ops.cast(y, "float32"))
        assert y.dtype == dtype
        gw, gb = tape.gradient(loss, [w, b])
        assert gw.dtype == gb.dtype == "float32"
        results.append((np.asarray(y, F32), np.asarray(gw), np.asarray(gb)))
    tol = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 6e-2}[dtype]
    for fused, plain in zip(*results):
        np.testing.assert_allclose(fused, plain, rtol=tol, atol=tol)


class _CountsFusedBias(CpuBackend):
    name = "cpu"
    calls = 0

    def relu_grad_bias(self, g: Any, y: Any) -> Any:
        type(self).calls += 1
        return CpuBackend.relu_grad_bias(self, g, y)


class _NoFusedBias(CpuBackend):
    relu_grad_bias = None  # type: ignore[assignment]


def test_dense_backward_sums_the_bias_gradient_in_the_relu_pass() -> None:
    rng = np.random.default_rng(8)
    values = [rng.standard_normal(s, dtype=F32) for s in ((9, 6), (6, 5), (5,))]
    grads = []
    for backend in (_CountsFusedBias(), _NoFusedBias()):
        x = mp.constant(values[0], backend=backend)
        w, b = (mp.Variable(v, backend=backend) for v in values[1:])
        with mp.GradientTape() as tape:
            loss = ops.sum(ops.square(ops.dense(x, w, b, "relu")))
        grads.append([g.numpy() for g in tape.gradient(loss, [w, b])])
    assert _CountsFusedBias.calls == 1
    for fused, plain in zip(*grads):
        np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-6)


def test_a_gradient_of_the_fused_bias_gradient_is_recorded() -> None:
    rng = np.random.default_rng(9)
    x = mp.Variable(rng.standard_normal((7, 4), dtype=F32))
    w = mp.Variable(rng.standard_normal((4, 3), dtype=F32))
    b = mp.Variable(rng.standard_normal(3, dtype=F32))
    with mp.GradientTape() as outer:
        with mp.GradientTape() as inner:
            loss = ops.sum(ops.square(ops.dense(x, w, b, "relu")))
        total = ops.sum(inner.gradient(loss, b))       # 2 * sum(relu(x @ w + b))
    got = outer.gradient(total, x).numpy()
    z = x.numpy() @ w.numpy() + b.numpy()
    np.testing.assert_allclose(got, 2 * (z > 0).astype(F32) @ w.numpy().T, rtol=1e-5)


def test_dense_16_bit_rounds_once_after_bias_and_relu() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 9), dtype=F32).astype(F16)
    w = rng.standard_normal((9, 5), dtype=F32).astype(F16)
    b = rng.standard_normal(5, dtype=F32).astype(F16)
    out = CpuBackend().dense(x, w, b, "relu")
    ref = np.maximum(x.astype(F32) @ w.astype(F32) + b.astype(F32), 0).astype(F16)
    assert out.dtype == F16 and np.array_equal(out, ref)


def test_dense_falls_back_to_the_composite_ops_without_a_kernel() -> None:
    backend = _NoDense()
    assert "dense" not in backend.kernels()
    x = mp.constant(np.ones((2, 3), F32), backend=backend)
    w = mp.Variable(np.full((3, 2), -1.0, F32), backend=backend)
    b = mp.Variable(np.array([1.0, 4.0], F32), backend=backend)
    with mp.GradientTape() as tape:
        y = ops.dense(x, w, b, "relu")
    assert [n.op for n in tape._nodes] == ["matmul", "bias_add", "relu"]
    assert np.array_equal(y.numpy(), [[0.0, 1.0], [0.0, 1.0]])


def test_dense_takes_batched_inputs_and_checks_its_arguments() -> None:
    x, w, b = _data(4, "float32")
    x3 = ops.reshape(ops.concat([x, x], 0), (2, 6, 5))
    with mp.GradientTape() as tape:
        y = ops.dense(x3, w, b, "relu")
        loss = ops.sum(y)
    assert y.shape == (2, 6, 4)
    np.testing.assert_allclose(np.asarray(y[0]), np.asarray(ops.dense(x, w, b, "relu")),
                               rtol=1e-6)
    assert tape.gradient(loss, w).shape == (5, 4)
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.dense(x, w, b, "tanh")
    with pytest.raises(ValueError, match="do not match a kernel"):
        ops.dense(x, ops.transpose(w), None)
    with pytest.raises(ValueError, match="bias of shape"):
        ops.dense(x, w, ops.ones((3,)))


def test_dense_layer_records_one_fused_op() -> None:
    layer = mp.layers.Dense(4, activation="relu")
    x, _, _ = _data(5, "float32")
    with mp.GradientTape() as tape:
        layer(x)
    assert [n.op for n in tape._nodes] == ["dense"]
    tanh = mp.layers.Dense(4, activation="tanh")
    with mp.GradientTape() as tape:
        out = tanh(x)
    assert [n.op for n in tape._nodes] == ["dense", "tanh"]
    assert np.all(np.abs(out.numpy()) <= 1)


# --- float32 copies shared between GEMMs ----------------------------------------------------
def test_a_16_bit_operand_is_converted_once_for_several_gemms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, Any]] = []
    real = cpu_creation.convert

    def counting(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        calls.append((x.dtype, dtype))
        return real(x, dtype)

    monkeypatch.setattr(cpu_creation, "convert", counting)
    be = CpuBackend()
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 8), dtype=F32).astype(F16)
    b = rng.standard_normal((8, 8), dtype=F32).astype(F16)
    first = be.matmul(a, b, False, False)
    ups = calls.count((F16, F32))
    again = be.matmul(b, a, True, False)   # both operands seen: no new conversion
    assert calls.count((F16, F32)) == ups == 2
    assert np.array_equal(first, (a.astype(F32) @ b.astype(F32)).astype(F16))
    assert np.array_equal(again, (b.astype(F32).T @ a.astype(F32)).astype(F16))
    # an equal but different array is converted anew (identity, not value, is the key)
    be.matmul(a.copy(), b, False, False)
    assert calls.count((F16, F32)) == 3


def test_upcast_entries_die_with_their_arrays() -> None:
    be = CpuBackend()
    x = np.ones((4, 4), F16)
    assert be.upcast(x) is be.upcast(x)
    entries = be._upcasts._entries
    del x
    be.upcast(np.zeros((2, 2), F16))   # an insertion drops the dead entry
    assert len(entries) == 1


# --- blocked optimizer kernels --------------------------------------------------------------
def _rmsprop_plain(var: np.ndarray, g: np.ndarray, ms: np.ndarray, mom: np.ndarray | None,
                   lr: float, rho: float, momentum: float, eps: float) -> None:
    f = np.float32
    ms *= f(rho)
    sq = g * g
    sq *= f(1.0 - rho)
    ms += sq
    denom = ms + f(eps)
    np.sqrt(denom, out=denom)
    inc = g * f(lr)
    inc /= denom
    if mom is None:
        var -= inc
        return
    mom *= f(momentum)
    mom += inc
    var -= mom


def _adam_plain(var: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, lr: float,
                b1: float, b2: float, eps: float, step: int, wd: float) -> None:
    f = np.float32
    if wd:
        var -= var * f(lr * wd)
    alpha = lr * math.sqrt(1.0 - b2**step) / (1.0 - b1**step)
    d = g - m
    d *= f(1.0 - b1)
    m += d
    d = g * g
    d -= v
    d *= f(1.0 - b2)
    v += d
    denom = np.sqrt(v)
    denom += f(eps)
    update = m * f(alpha)
    update /= denom
    var -= update


@pytest.mark.parametrize("size", [1, BLOCK - 1, 2 * BLOCK + 17])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_blocked_rmsprop_is_bit_for_bit_the_plain_formula(size: int, momentum: float) -> None:
    rng = np.random.default_rng(size)
    var, g = rng.standard_normal((2, size), dtype=F32)
    ms = rng.random(size, dtype=F32)
    mom = rng.standard_normal(size, dtype=F32) if momentum else None
    ref = [a.copy() if a is not None else None for a in (var, ms, mom)]
    _rmsprop_plain(ref[0], g, ref[1], ref[2], 1e-3, 0.9, momentum, 1e-7)
    CpuBackend().rmsprop_update(var, g, ms, mom, 1e-3, 0.9, momentum, 1e-7, None)
    for got, want in zip((var, ms, mom), ref):
        if want is not None:
            assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("weight_decay", [0.0, 0.004])
def test_blocked_adam_is_bit_for_bit_the_plain_formula(weight_decay: float) -> None:
    rng = np.random.default_rng(9)
    n = BLOCK + 5
    var, g, m = rng.standard_normal((3, n), dtype=F32)
    v = rng.random(n, dtype=F32)
    ref = [var.copy(), m.copy(), v.copy()]
    _adam_plain(ref[0], g, ref[1], ref[2], 1e-3, 0.9, 0.999, 1e-7, 3, weight_decay)
    cpu = CpuBackend()
    rates = cpu.adam_rates(np.array(2, np.int64), 1e-3, 0.9, 0.999, weight_decay)   # step 3
    cpu.adam_update(var, g, m, v, rates, 0.9, 0.999, 1e-7, weight_decay, None)
    for got, want in zip((var, m, v), ref):
        assert np.array_equal(_bits(got), _bits(want))


def test_optimizer_kernels_update_non_contiguous_weights_in_place() -> None:
    rng = np.random.default_rng(10)
    base = rng.standard_normal((6, 8), dtype=F32)
    var = base.T                       # not contiguous: the unblocked path
    g = rng.standard_normal((8, 6), dtype=F32)
    ms = np.zeros((8, 6), F32)
    want, want_ms = var.copy(), ms.copy()
    _rmsprop_plain(want, g, want_ms, None, 0.01, 0.9, 0.0, 1e-7)
    CpuBackend().rmsprop_update(var, g, ms, None, 0.01, 0.9, 0.0, 1e-7, None)
    assert np.array_equal(base.T, want) and np.array_equal(ms, want_ms)
    vel = np.zeros((8, 6), F32)
    CpuBackend().sgd_update(var, g, vel, 0.1, 0.9, True, np.asarray(False))
    assert np.array_equal(base.T, want)   # a false flag writes nothing


# --- oneDNN's fused dense --------------------------------------------------------------------
def _onednn_or_skip() -> Any:
    import mpcore_onednn

    try:
        return mpcore_onednn.library()
    except mpcore_onednn.DnnlError as exc:
        pytest.skip(f"oneDNN cannot be loaded here: {exc}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_onednn_dense_fuses_bias_and_relu(monkeypatch: pytest.MonkeyPatch, dtype: str,
                                          activation: str | None) -> None:
    _onednn_or_skip()
    import mpcore_onednn.linalg

    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setattr(mpcore_onednn.linalg, "SMALL_GEMM", 0)   # this small one on oneDNN too
    backend = CpuBackend()
    dense = backend.kernels()["dense"]
    assert dense.original == backend.dense
    native = F32 if dtype == "float32" else BF16
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 10, 33), dtype=F32).astype(native)
    w = rng.standard_normal((33, 17), dtype=F32).astype(native)
    b = rng.standard_normal(17, dtype=F32).astype(native)
    def calls() -> int:
        info = dense.cache.info()
        return int(info["hits"] + info["misses"])

    before = calls()
    out = dense(x, w, b, activation)
    assert calls() == before + 1   # it ran on oneDNN
    ref = np.einsum("bnk,km->bnm", x.astype(F32), w.astype(F32)) + b.astype(F32)
    ref = np.maximum(ref, 0) if activation else ref
    assert out.dtype == native and out.shape == (3, 10, 17)
    tol = 1e-5 if dtype == "float32" else 2**-7
    np.testing.assert_allclose(out.astype(F32), ref, rtol=tol, atol=tol * 8)
    # float16: oneDNN's float32 GEMM on float32 copies, rounded once
    x16, w16 = x.astype(F32).astype(F16), w.astype(F32).astype(F16)
    f16 = dense(x16, w16, None, activation)
    want = np.einsum("bnk,km->bnm", x16.astype(F32), w16.astype(F32))
    want = (np.maximum(want, 0) if activation else want).astype(F16)
    assert f16.dtype == F16 and calls() == before + 2
    np.testing.assert_allclose(f16.astype(F32), want.astype(F32), rtol=2**-10, atol=1e-3)
