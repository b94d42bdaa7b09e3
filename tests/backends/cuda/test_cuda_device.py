"""The CUDA backend's kernels against the CPU backend, on a GPU (skipped elsewhere with the
reason): batched 16-bit GEMMs, bit-exact casts, the device flag, the fused optimizer kernels,
image kernels and random numbers (the rules and messages that run anywhere: test_cuda.py;
the NVRTC checks: test_cuda_sources.py)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from conftest import NUMPY_DTYPES
from mpcore_cuda import CudaBackend

import mpcore as mp
from mpcore.plugins import registry

_REASON = CudaBackend().unavailable_reason()

# --- on a GPU: kernels against the CPU backend ---------------------------------------------
gpu = pytest.mark.skipif(_REASON is not None, reason=f"cuda: {_REASON}")
FLOATS = ("float16", "bfloat16", "float32")
NP = NUMPY_DTYPES
TOL = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-10}


@pytest.fixture(scope="module")
def cuda() -> CudaBackend:
    if _REASON is not None:
        pytest.skip(f"cuda: {_REASON}")
    be = mp.get_backend("cuda")
    be.kernels()
    return be  # type: ignore[return-value]


@pytest.fixture(scope="module")
def cpu() -> mp.Backend:
    be = mp.get_backend("cpu")
    be.kernels()
    return be


def _rand(shape: tuple[int, ...], dtype: str, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(NP[dtype])


def _host(be: mp.Backend, x: Any) -> np.ndarray:
    return np.asarray(be.to_host(x)).astype(np.float64)


def _same(cuda: Any, cpu: Any, got: Any, want: Any, dtype: str, scale: float = 1.0) -> None:
    np.testing.assert_allclose(_host(cuda, got), _host(cpu, want), rtol=TOL[dtype] * scale,
                               atol=TOL[dtype] * scale)


@gpu
def test_devices_describe_the_gpu(cuda: CudaBackend) -> None:
    dev = cuda.device()
    assert dev.vendor == "NVIDIA" and dev.kind == "gpu" and re.fullmatch(r"\d+\.\d+",
                                                                        dev.capability)
    d = dev.describe()
    assert d["sm_count"] > 0 and d["memory_total"] >= d["memory_free"] > 0
    assert d["compute_capability"] == dev.capability
    message = mp.verdict.compatibility_message("mixed_float16", cuda)
    assert message.startswith("Mixed precision compatibility check (mixed_float16): ")
    assert f"{dev.name}, compute capability {dev.capability}" in message


@gpu
@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
def test_casts_round_to_nearest_even_bit_exactly(cuda: CudaBackend, src: str, dst: str) -> None:
    values = np.concatenate([_rand((4096,), "float32", 1, 3.0),
                             np.array([0.0, -0.0, np.inf, -np.inf, 1e-8, 70000.0, 1 + 2**-8,
                                       1 + 3 * 2**-8, 65519.0, 65520.0], np.float32)])
    x = values.astype(NP[src])
    got = cuda.to_host(cuda.cast(cuda.asarray(x, src), dst))
    want = x.astype(NP[dst])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    nan = cuda.to_host(cuda.cast(cuda.asarray(np.array([np.nan], NP[src]), src), dst))
    assert np.isnan(nan.astype(np.float32)).all()


@gpu
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True),
                                        (True, True)])
@pytest.mark.parametrize("route", ["cupy", "cublas"])
def test_matmul_2d_and_batched(cuda: CudaBackend, cpu: mp.Backend, dtype: str, ta: bool,
                               tb: bool, route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # MPCORE_CUDA_GEMM16 is read with the first GEMM's tensor-core check: read it again
    monkeypatch.setenv("MPCORE_CUDA_GEMM16", route)
    monkeypatch.setattr(cuda, "_gemm16_direct", False)
    monkeypatch.setattr(cuda, "_native_gemm", None)
    for batch in ((), (3,), (2, 2)):
        a = _rand((*batch, 40, 24) if ta else (*batch, 24, 40), dtype, 2)
        b = _rand((*batch, 16, 40) if tb else (*batch, 40, 16), dtype, 3)
        got = cuda.matmul(cuda.asarray(a, dtype), cuda.asarray(b, dtype), ta, tb)
        assert got.dtype == NP[dtype] and got.shape == (*batch, 24, 16)
        want = cpu.matmul(cpu.asarray(a, dtype), cpu.asarray(b, dtype), ta, tb)
        _same(cuda, cpu, got, want, dtype, scale=4.0)


@gpu
def test_matmul_16_bit_accumulates_in_float32(cuda: CudaBackend) -> None:
    # 4096 products of 1 * 2**-11 sum to 2; float16 accumulation would stall at 0.5 + ...
    a = np.ones((2, 4096), np.float16)
    b = np.full((4096, 2), 2.0**-11, np.float16)
    for dtype in ("float16", "bfloat16"):
        out = cuda.matmul(cuda.asarray(a, dtype), cuda.asarray(b, dtype), False, False)
        np.testing.assert_allclose(_host(cuda, out), 2.0, rtol=1e-3)
        batched = cuda.matmul(cuda.asarray(a[None], dtype), cuda.asarray(b[None], dtype),
                              False, False)
        np.testing.assert_allclose(_host(cuda, batched), 2.0, rtol=1e-3)
        # a 1x1 product (CuPy would reduce it in 16 bits) and a one-column bias gradient
        dot = cuda.matmul(cuda.asarray(a[:1], dtype), cuda.asarray(b[:, :1], dtype),
                          False, False)
        assert dot.shape == (1, 1) and dot.dtype == NP[dtype]
        np.testing.assert_allclose(_host(cuda, dot), 2.0, rtol=1e-3)
        column = cuda.sum(cuda.asarray(b[:, :1], dtype), (0,), False)
        assert column.shape == (1,)
        np.testing.assert_allclose(_host(cuda, column), 2.0, rtol=1e-3)


@gpu
@pytest.mark.parametrize("dtype", [*FLOATS, "float64"])
def test_fused_elementwise_kernels(cuda: CudaBackend, cpu: mp.Backend, dtype: str) -> None:
    x = _rand((33, 70), dtype, 4, 3.0)
    bias = _rand((70,), dtype, 5)
    g = _rand((33, 70), dtype, 6)
    cx, cb, cg = (cuda.asarray(v, dtype) for v in (x, bias, g))
    px, pb, pg = (cpu.asarray(v, dtype) for v in (x, bias, g))
    for name in ("relu", "sigmoid", "erf", "tanh", "exp"):
        _same(cuda, cpu, getattr(cuda, name)(cx), getattr(cpu, name)(px), dtype, 2.0)
    _same(cuda, cpu, cuda.bias_add(cx, cb), cpu.bias_add(px, pb), dtype)
    y = cuda.relu(cx)
    _same(cuda, cpu, cuda.relu_grad(cg, y), cpu.relu_grad(pg, cpu.relu(px)), dtype)
    (dz, db), (pdz, pdb) = cuda.relu_grad_bias(cg, y), cpu.relu_grad_bias(pg, cpu.relu(px))
    _same(cuda, cpu, dz, pdz, dtype)
    _same(cuda, cpu, db, pdb, dtype, 8.0)   # a sum of 33 rows, in another order
    _same(cuda, cpu, cuda.add(cx, 2.0), cpu.add(px, 2.0), dtype)
    assert cuda.add(cx, 2.0).dtype == NP[dtype]
    _same(cuda, cpu, cuda.subtract(1.0, cx), cpu.subtract(1.0, px), dtype)
    for scalar in (2.5, 3):
        assert cuda.multiply(cx, scalar).dtype == NP[dtype]
        assert cuda.subtract(scalar, cx).dtype == NP[dtype]
    picked = cuda.where(cuda.greater(cx, 0.0), cx, cg)
    assert picked.dtype == NP[dtype]
    np.testing.assert_array_equal(_host(cuda, picked), np.where(x > 0, x, g).astype(np.float64))
    # an index out of range reads NaN (CuPy's take would wrap it): no host read to raise
    taken = _host(cuda, cuda.take(cx, cuda.asarray([1, -1, 33, -34], "int64"), 0))
    assert np.isfinite(taken[:2]).all() and np.isnan(taken[2:]).all()
    ones = cuda.asarray(np.ones((4, 70)), dtype)   # and its gradient drops them
    grad = _host(cuda, cuda.take_grad(ones, cuda.asarray([1, -1, 33, -34], "int64"), 0, (33, 70)))
    np.testing.assert_array_equal(grad, np.eye(33)[[1, 32]].sum(0)[:, None] * np.ones((1, 70)))
    oh = cuda.one_hot(cuda.asarray([0, 3, 9], "int64"), 10, dtype)
    np.testing.assert_array_equal(_host(cuda, oh), np.eye(10)[[0, 3, 9]])


@gpu
@pytest.mark.parametrize("dtype", [*FLOATS, "float64"])
@pytest.mark.parametrize("axis", [None, (0,), (1,), (0, 1)])
def test_reductions(cuda: CudaBackend, cpu: mp.Backend, dtype: str, axis: Any) -> None:
    x = _rand((257, 65), dtype, 7)
    cx, px = cuda.asarray(x, dtype), cpu.asarray(x, dtype)
    for name in ("sum", "mean", "max", "min"):
        got = getattr(cuda, name)(cx, axis, False)
        want = getattr(cpu, name)(px, axis, False)
        assert got.dtype == NP[dtype] and got.shape == want.shape   # a 0-d result stays 0-d
        if dtype in ("float16", "bfloat16") and name in ("sum", "mean"):
            # CUDA accumulates 16-bit sums in float32; NumPy's (the CPU's) add a column row by
            # row in 16 bits, off by more than the tolerance: the exact sum, rounded, instead
            exact = getattr(np, name)(x.astype(np.float64), axis=axis).astype(NP[dtype])
            np.testing.assert_allclose(_host(cuda, got), exact.astype(np.float64),
                                       rtol=TOL[dtype], atol=TOL[dtype])
        else:
            _same(cuda, cpu, got, want, dtype, 4.0)
    np.testing.assert_array_equal(_host(cuda, cuda.argmax(cx, 1)), _host(cpu, cpu.argmax(px, 1)))


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_and_cross_entropy(cuda: CudaBackend, cpu: mp.Backend, dtype: str) -> None:
    x = _rand((300, 1000), dtype, 8, 10.0)
    labels = np.random.default_rng(9).integers(0, 1000, 300)
    cx, px = cuda.asarray(x, dtype), cpu.asarray(x, dtype)
    for axis in (0, 1):
        _same(cuda, cpu, cuda.softmax(cx, axis), cpu.softmax(px, axis), dtype, 10.0)
        _same(cuda, cpu, cuda.log_softmax(cx, axis), cpu.log_softmax(px, axis), dtype, 10.0)
    for low in ("float16", "bfloat16"):  # computed in float32, returned in the input's dtype
        x16 = cuda.asarray(x[:4, :50], low)
        for op in (cuda.softmax, cuda.log_softmax):
            assert op(x16, 1).dtype == NP[low]
    cl = cuda.asarray(labels, "int64")
    loss, probs = cuda.sparse_softmax_cross_entropy(cx, cl)
    want_loss, want_probs = cpu.sparse_softmax_cross_entropy(px, labels)
    _same(cuda, cpu, loss, want_loss, dtype, 10.0)
    _same(cuda, cpu, probs, want_probs, dtype, 10.0)
    g = _rand((300,), dtype, 10)
    dx = cuda.sparse_softmax_cross_entropy_grad(probs, cl, cuda.asarray(g, dtype))
    want = (want_probs - np.eye(1000)[labels]) * g[:, None]
    np.testing.assert_allclose(_host(cuda, dx), want, rtol=1e-4, atol=1e-6)
    bad_loss, _ = cuda.sparse_softmax_cross_entropy(cx[:2], cuda.asarray([0, 1000], "int64"))
    assert np.isnan(_host(cuda, bad_loss)[1]) and np.isfinite(_host(cuda, bad_loss)[0])


@gpu
def test_training_through_ops_uses_the_fused_backward(cuda: CudaBackend) -> None:
    previous, note = registry._current, registry._detection_note
    mp.set_backend("cuda")
    try:
        logits = mp.Variable(_rand((64, 10), "float32", 11))
        labels = mp.constant(np.arange(64) % 10, dtype="int64")
        with mp.GradientTape() as tape:
            loss = mp.ops.mean(mp.ops.sparse_softmax_cross_entropy(labels, logits))
        (grad,) = tape.gradient(loss, [logits])
        z = np.asarray(logits.numpy(), np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(grad.numpy(), (p - np.eye(10)[np.arange(64) % 10]) / 64,
                                   rtol=1e-4, atol=1e-7)
    finally:  # the backend the suite runs on (MPCORE_BACKEND) for the tests after this one
        registry._current, registry._detection_note = previous, note


@gpu
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_a_training_step_reads_the_device_once_at_most(cuda: CudaBackend, policy: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's budget: one small device-to-host read per step, the loss-scale decision
    (``mpcore.mixed_precision.loss_scale._finite_flag``), and none without loss scaling. CuPy
    raises on any other synchronising call inside ``cupyx.allow_synchronize(False)``."""
    import cupyx

    import mpcore.mixed_precision.loss_scale as loss_scale_module

    if not mp.check_policy(policy, cuda).supported:
        pytest.skip(f"{policy} is not supported on this GPU")
    reads: list[bool] = []
    real = loss_scale_module._finite_flag

    def counted(flag: Any) -> bool:
        with cupyx.allow_synchronize(True):
            reads.append(real(flag))
        return reads[-1]

    monkeypatch.setattr(loss_scale_module, "_finite_flag", counted)
    compute = mp.Policy(policy).compute_dtype
    rng = np.random.default_rng(0)
    sizes = [(32, 64), (64, 10)]
    variables = [mp.Variable(rng.standard_normal(s).astype(np.float32) * 0.1, backend=cuda)
                 for s in sizes]
    biases = [mp.Variable(np.zeros(s[1], np.float32), backend=cuda) for s in sizes]
    x = mp.ops.cast(mp.constant(rng.random((16, 32), dtype=np.float32), backend=cuda), compute)
    y = mp.constant(rng.integers(0, 10, 16).astype(np.int32), backend=cuda)
    optimizer = mp.optimizers.RMSprop()
    if mp.Policy(policy).loss_scale is not None:
        optimizer = mp.LossScaleOptimizer(optimizer)
    params = [*variables, *biases]

    def step() -> None:
        with mp.GradientTape() as tape:
            h = x
            for i, (w, b) in enumerate(zip(variables, biases)):
                h = mp.ops.dense(h, w.read_as(compute), b.read_as(compute),
                                 "relu" if i == 0 else None)
            loss = mp.ops.mean(mp.ops.sparse_softmax_cross_entropy(y, mp.ops.cast(h, "float32")))
            target = (optimizer.get_scaled_loss(loss)
                      if isinstance(optimizer, mp.LossScaleOptimizer) else loss)
        grads = tape.gradient(target, params)
        if isinstance(optimizer, mp.LossScaleOptimizer):
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, params))

    step()   # compiles kernels and allocates slots (those may synchronise)
    cuda.synchronize()
    reads.clear()
    with cupyx.allow_synchronize(False):
        for _ in range(3):
            step()
    cuda.synchronize()
    assert len(reads) == (3 if isinstance(optimizer, mp.LossScaleOptimizer) else 0)


@gpu
@pytest.mark.parametrize("dtype", FLOATS)
def test_unscale_and_check_sets_the_device_flag(cuda: CudaBackend, dtype: str) -> None:
    grads = [_rand((n,), dtype, n, 100.0) for n in (1, 1000, 70000, 3, 5, 6, 7, 8, 9, 10)]
    dev = [cuda.asarray(g, dtype) for g in grads]
    outs, flag = cuda.unscale_and_check(dev, 0.25)
    assert isinstance(flag, cuda.cp.ndarray) and flag.shape == () and bool(flag)
    for g, o in zip(grads, outs):
        assert o.dtype == np.float32
        np.testing.assert_array_equal(cuda.to_host(o), g.astype(np.float32) * np.float32(0.25))
    for bad in (np.inf, -np.inf, np.nan):
        g = grads[2].copy()
        g[69999] = bad
        _, flag = cuda.unscale_and_check([*dev[:9], cuda.asarray(g, dtype)], 1.0)
        assert not bool(flag)
        assert not bool(cuda.all_finite([dev[0], cuda.asarray(g, dtype)]))
    assert bool(cuda.all_finite(dev))
    # finite float32 values that overflow float32 once scaled are not finite
    big = cuda.asarray(np.array([3e38], np.float32), "float32")
    assert not bool(cuda.unscale_and_check([big], 2.0)[1])


@gpu
@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "nesterov", "rmsprop",
                                  "rmsprop_momentum", "adam", "adamw"])
def test_fused_optimizer_updates_match_the_cpu(cuda: CudaBackend, cpu: mp.Backend,
                                               kind: str) -> None:
    n = 5000
    w, g, s1, s2 = (_rand((n,), "float32", i) for i in range(4))
    s1 = np.abs(s1)
    s2 = np.abs(s2)

    def run(be: Any, flag: Any) -> list[np.ndarray]:
        arrs = [be.copy(be.asarray(v, "float32")) for v in (w, g, s1, s2)]
        var, grad, a, b = arrs
        if kind.startswith("sgd") or kind == "nesterov":
            be.sgd_update(var, grad, None if kind == "sgd" else a, 0.1, 0.9,
                          kind == "nesterov", flag)
        elif kind.startswith("rmsprop"):
            be.rmsprop_update(var, grad, a, b if kind.endswith("momentum") else None, 0.01,
                              0.9, 0.5, 1e-7, flag)
        else:
            wd = 0.004 if kind == "adamw" else 0.0
            rates = be.adam_rates(be.asarray(np.array(2, np.int64), "int64"), 0.001, 0.9,
                                  0.999, wd)      # step 3
            be.adam_update(var, grad, a, b, rates, 0.9, 0.999, 1e-7, wd, flag)
        return [np.asarray(be.to_host(x)) for x in (var, a, b)]

    for flag_value in (None, True):
        got = run(cuda, None if flag_value is None else cuda.cp.asarray(flag_value))
        want = run(cpu, None if flag_value is None else np.asarray(flag_value))
        for x, y in zip(got, want):
            # atol: 1 ulp of the inputs (|w| < 4): the GPU contracts w - lr * v into an FMA,
            # whose single rounding differs from NumPy's two where the terms nearly cancel
            np.testing.assert_allclose(x, y, rtol=2e-6, atol=5e-7)
    skipped = run(cuda, cuda.cp.asarray(False))
    for x, start in zip(skipped, (w, s1, s2)):
        np.testing.assert_array_equal(x, start)


@gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("k", "s", "pads"), [(3, 1, (1, 1, 1, 1)), (2, 2, (0, 0, 0, 0)),
                                              (3, 2, (0, 1, 0, 1))])
def test_image_kernels(cuda: CudaBackend, cpu: mp.Backend, dtype: str, k: int, s: int,
                       pads: tuple[int, int, int, int]) -> None:
    x = _rand((2, 9, 8, 3), dtype, 12)
    cx, px = cuda.asarray(x, dtype), cpu.asarray(x, dtype)
    patches = cuda.extract_patches(cx, k, k, s, s, pads)
    want = cpu.extract_patches(px, k, k, s, s, pads)
    np.testing.assert_array_equal(_host(cuda, patches), _host(cpu, want))
    g = _rand(want.shape, dtype, 13)
    _same(cuda, cpu, cuda.extract_patches_grad(cuda.asarray(g, dtype), x.shape, k, k, s, s,
                                                pads),
          cpu.extract_patches_grad(cpu.asarray(g, dtype), x.shape, k, k, s, s, pads), dtype, 4.0)
    y = cuda.max_pool2d(cx, k, k, s, s, pads)
    py = cpu.max_pool2d(px, k, k, s, s, pads)
    np.testing.assert_array_equal(_host(cuda, y), _host(cpu, py))
    gy = _rand(py.shape, dtype, 14)
    _same(cuda, cpu, cuda.max_pool2d_grad(cuda.asarray(gy, dtype), cx, y, k, k, s, s, pads),
          cpu.max_pool2d_grad(cpu.asarray(gy, dtype), px, py, k, k, s, s, pads), dtype, 4.0)


@gpu
@pytest.mark.parametrize("dtype", [*FLOATS, "float64"])
def test_random_numbers(cuda: CudaBackend, dtype: str) -> None:
    u = _host(cuda, cuda.random_uniform((200_000,), dtype, 7, -2.0, 3.0))
    assert u.min() >= -2.0 and u.max() <= 3.0 and abs(u.mean() - 0.5) < 0.03
    assert abs(u.std() - 5 / 12**0.5) < 0.03
    again = _host(cuda, cuda.random_uniform((200_000,), dtype, 7, -2.0, 3.0))
    np.testing.assert_array_equal(u, again)
    other = _host(cuda, cuda.random_uniform((200_000,), dtype, 8, -2.0, 3.0))
    assert not np.array_equal(u, other)
    z = _host(cuda, cuda.random_normal((200_000,), dtype, 9, 1.0, 2.0))
    assert abs(z.mean() - 1.0) < 0.03 and abs(z.std() - 2.0) < 0.05
    m = _host(cuda, cuda.dropout_mask((200_000,), 0.25, dtype, 10))
    assert set(np.unique(m)) <= {0.0, float(np.asarray(1 / 0.75, NP[dtype]))}
    assert abs((m == 0).mean() - 0.25) < 0.01


@gpu
def test_indexing_kernels(cuda: CudaBackend, cpu: mp.Backend) -> None:
    for dtype in FLOATS:
        g = _rand((4, 6), dtype, 15)
        idx = np.array([1, 3, 1, 0])
        got = cuda.take_grad(cuda.asarray(g, dtype), cuda.asarray(idx, "int64"), 0, (5, 6))
        _same(cuda, cpu, got, cpu.take_grad(cpu.asarray(g, dtype), idx, 0, (5, 6)), dtype)
        assert got.dtype == NP[dtype]
