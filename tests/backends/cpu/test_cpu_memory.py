"""The CPU step's memory reuse: recycled output buffers, gradients freed without the cyclic
GC, and oneDNN's scratchpad kept between calls (issue 6, third round)."""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from mpcore_cpu import backend as cpu_backend
from mpcore_cpu.pool import ALIGNMENT, BufferPool, aligned_empty

import mpcore as mp
from mpcore.plugins.settings import SettingError

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F32 = np.dtype(np.float32)
MB = 1 << 20


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_buffer_is_reused_only_when_no_array_views_it() -> None:
    pool = BufferPool(limit=64 * MB)
    a = pool.empty((512, 512), F32)
    b = pool.empty((512, 512), F32)
    assert not np.shares_memory(a, b)
    view = a.T[::2]                      # a view keeps the buffer busy after a is gone
    del a
    c = pool.empty((512, 512), F32)
    assert not np.shares_memory(c, view) and not np.shares_memory(c, b)
    assert pool.info()["buffers"] == 3
    base = view.base
    del view, base
    d = pool.empty((1024, 256), np.dtype(np.int32))   # same bytes, another dtype and shape
    assert pool.info()["buffers"] == 3 and pool.hits == 1
    assert d.shape == (1024, 256) and d.dtype == np.int32 and d.flags.c_contiguous
    d[:] = 7
    assert not np.shares_memory(d, b) and not np.shares_memory(d, c)


def test_pooled_buffers_and_variable_copies_start_on_a_cache_line() -> None:
    pool = BufferPool(limit=64 * MB)
    held = [pool.empty(shape, dtype) for shape, dtype in
            [((1024, 1024), F32), ((1000, 600), np.dtype(np.float16)), ((MB + 1,), np.uint8)]]
    held.append(pool.empty((1024, 1024), F32))        # a reused buffer is aligned too
    for a in held:
        assert a.ctypes.data % ALIGNMENT == 0 and a.flags.c_contiguous and a.flags.writeable
    odd = aligned_empty((3, 5), np.dtype(np.float64))
    assert odd.shape == (3, 5) and odd.ctypes.data % ALIGNMENT == 0
    weights = np.random.default_rng(0).random((784, 1024), dtype=np.float32)[:, ::1]
    copied = cpu_backend.CpuBackend().copy(weights.T)
    assert copied.ctypes.data % ALIGNMENT == 0 and np.array_equal(copied, weights.T)
    assert not np.shares_memory(copied, weights)
    variable = mp.Variable(weights, backend=cpu_backend.CpuBackend())
    assert variable.numpy().ctypes.data % ALIGNMENT == 0


def test_small_requests_and_an_exhausted_limit_are_plain_arrays() -> None:
    pool = BufferPool(limit=3 * MB)
    assert pool.empty((16,), F32).base is None and pool.info()["buffers"] == 0
    keep = [pool.empty((MB // 4,), F32) for _ in range(4)]   # 1 MB each, 3 MB pooled
    assert pool.info()["buffers"] == 3 and pool.nbytes == 3 * MB
    assert keep[3].base is None                                # past the limit
    del keep
    assert pool.empty((2 * MB // 4,), F32) is not None         # idle ones are dropped for it
    assert pool.nbytes == 2 * MB
    off = BufferPool(limit=0)
    assert off.empty((MB,), F32).base is None


def test_the_pool_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_CPU_POOL_MB", "5")
    assert BufferPool().limit == 5 * MB
    for bad in ("lots", "-1", "1.5"):
        monkeypatch.setenv("MPCORE_CPU_POOL_MB", bad)
        pool = BufferPool()                     # read at first use, not at construction
        with pytest.raises(SettingError) as info:
            pool.limit  # noqa: B018
        assert str(info.value) == (f"MPCORE_CPU_POOL_MB={bad!r} is not valid; valid values: a "
                                   "whole number of MB >= 0 (default 1024; 0 turns the pool "
                                   "off)")


def test_gradients_die_with_their_last_reference(no_cyclic_gc: None) -> None:
    be = mp.get_backend("cpu")
    w = mp.Variable(np.ones((4, 3), np.float32), backend=be)
    x = mp.constant(np.ones((2, 4), np.float32), backend=be)
    with mp.GradientTape() as tape:
        loss = mp.ops.sum(mp.ops.matmul(x, w))
    grads = tape.gradient(loss, {"w": [w]})
    ref = weakref.ref(grads["w"][0])
    del grads, tape
    assert ref() is None   # not held by a reference cycle until the GC runs


def _mlp_step(be: mp.Backend, params: list[mp.Variable], x: mp.Tensor, y: mp.Tensor,
              policy: str) -> None:
    compute = mp.Policy(policy).compute_dtype
    with mp.GradientTape() as tape:
        h = mp.ops.cast(x, compute)
        for i in range(0, len(params), 2):
            last = i == len(params) - 2
            h = mp.ops.dense(h, params[i].read_as(compute), params[i + 1].read_as(compute),
                             None if last else "relu")
        loss = mp.ops.mean(mp.ops.sparse_softmax_cross_entropy(y, mp.ops.cast(h, "float32")))
    grads = tape.gradient(loss, params)
    for p, g in zip(params, grads):
        p.assign(p - g * 1e-3)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_a_training_step_reuses_the_previous_steps_buffers(policy: str,
                                                           no_cyclic_gc: None) -> None:
    be = mp.get_backend("cpu")
    rng = np.random.default_rng(0)
    sizes = [256, 512, 512, 10]   # 512 x 512 float32 activations: 1 MB, pooled
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params.append(mp.Variable(rng.uniform(-0.05, 0.05, (fan_in, fan_out))
                                  .astype(np.float32), backend=be))
        params.append(mp.Variable(np.zeros(fan_out, np.float32), backend=be))
    x = mp.constant(rng.random((1024, 256), dtype=np.float32), backend=be)
    y = mp.constant(rng.integers(0, 10, 1024).astype(np.int32), backend=be)
    for _ in range(2):
        _mlp_step(be, params, x, y, policy)
    pooled, misses = cpu_backend.POOL.nbytes, cpu_backend.POOL.misses
    for _ in range(3):
        _mlp_step(be, params, x, y, policy)
    assert cpu_backend.POOL.misses == misses and cpu_backend.POOL.nbytes == pooled
    assert cpu_backend.POOL.hits > 0


def test_onednn_primitives_keep_their_scratchpad() -> None:
    onednn = pytest.importorskip("mpcore_onednn")
    try:
        lib = onednn.library()
    except onednn.DnnlError as exc:
        pytest.skip(f"oneDNN is not usable here: {exc}")
    cache = onednn.MatmulCache(lib)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 192), dtype=np.float32)
    b = rng.standard_normal((256, 192), dtype=np.float32)
    want = a @ b.T
    for _ in range(3):   # the same primitive and scratchpad, called again
        got = cache.matmul(a, b.T, "float32", alloc=cpu_backend.POOL.empty)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    info = cache.info()
    assert info["misses"] == 1 and info["hits"] == 2
    with pytest.raises(ValueError, match="alloc returned"):
        cache.matmul(a, b.T, "float32", alloc=lambda shape, dtype: np.empty(shape, np.float64))
