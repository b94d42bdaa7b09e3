"""oneDNN kernels bound to a traced call's operands (``kernel.bind``, see mpcore.tracing.recorder):
the GEMMs and the recorded optimizer updates give the unbound kernel's bits, fall back to it where a
later call's operands differ from the ones bound (strides, shapes, hyperparameters), respect the
skip flag, and free their primitives with the traced program."""

from __future__ import annotations

import gc
from typing import Any

import ml_dtypes
import mpcore_onednn.optim as onednn_optim
import numpy as np
import pytest
from mpcore_cpu import CpuBackend
from onednn_isa import library_or_skip, onednn_backend
from test_onednn_matmul import _operands, _same_bits, _updates_or_skip

import mpcore as mp

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return onednn_backend(monkeypatch, "auto", small_gemms_on_onednn=True).kernels()  # small


def _matrix(rng: np.random.Generator, shape: tuple[int, int], transposed: bool,
            dtype: Any = np.float32) -> np.ndarray:
    """A matrix of ``shape``, or a transposed view of one (as the backward pass passes)."""
    if transposed:
        return rng.standard_normal(shape[::-1], dtype=np.float32).astype(dtype).T
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_a_bound_matmul_gives_the_kernels_bits(kernels: dict[str, Any], transpose_a: bool,
                                               transpose_b: bool) -> None:
    matmul = kernels["matmul"]
    rng = np.random.default_rng(1)

    def operands() -> tuple[np.ndarray, np.ndarray]:
        # the kernel's operands: a transposed flag multiplies the transpose of the array
        a = _matrix(rng, (33, 20) if transpose_a else (20, 33), False)
        b = _matrix(rng, (17, 33) if transpose_b else (33, 17), False)
        return a, b

    a, b = operands()
    bound = matmul.bind(a, b, transpose_a, transpose_b)
    assert bound is not None
    for _ in range(3):
        a, b = operands()
        want = matmul(a, b, transpose_a, transpose_b)
        assert np.array_equal(bound(a, b, transpose_a, transpose_b), want)
    # another layout than the bound one (a strided view of the same shape): the kernel's way
    wide = rng.standard_normal((a.shape[0], 2 * a.shape[1]), dtype=np.float32)
    strided = wide[:, ::2]
    assert np.array_equal(bound(strided, b, transpose_a, transpose_b),
                          matmul(strided, b, transpose_a, transpose_b))


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_bound_dense_gives_the_kernels_bits(kernels: dict[str, Any], activation: str | None,
                                              with_bias: bool) -> None:
    dense = kernels["dense"]
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 24), dtype=np.float32)
    b = rng.standard_normal(24, dtype=np.float32) if with_bias else None
    x = rng.standard_normal((16, 40), dtype=np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]               # NaN stays NaN through the relu
    bound = dense.bind(x, w, b, activation)
    assert bound is not None
    for _ in range(2):
        got, want = bound(x, w, b, activation), dense(x, w, b, activation)
        assert np.array_equal(got, want, equal_nan=True)
        x = rng.standard_normal((16, 40), dtype=np.float32)
    other = rng.standard_normal((16, 80), dtype=np.float32)[:, ::2]
    assert np.array_equal(bound(other, w, b, activation), dense(other, w, b, activation))


def test_only_what_runs_on_onednn_as_it_is_is_bound(kernels: dict[str, Any]) -> None:
    matmul, dense = kernels["matmul"], kernels["dense"]
    f16 = np.ones((4, 4), np.float16)                  # oneDNN's float32 GEMM on copies
    assert matmul.bind(f16, f16, False, False) is None
    batched = np.ones((2, 4, 4), np.float32)
    assert matmul.bind(batched, batched, False, False) is None
    x = np.ones((4, 4), np.float32)
    assert dense.bind(x, x, None, "gelu") is None
    strided = np.ones((4, 8), np.float32)[:, ::2]      # a call that would copy an operand
    assert matmul.bind(strided, x, False, False) is None


def test_bound_primitives_are_freed_with_the_bound_kernel(kernels: dict[str, Any]) -> None:
    matmul = kernels["matmul"]
    a = np.ones((8, 8), np.float32)
    destroyed = []
    cache = matmul.cache
    original = cache._destroy

    def destroy(entry: Any) -> None:
        destroyed.append(entry)
        original(entry)

    cache._destroy = destroy
    try:
        bound = matmul.bind(a, a, False, False)
        bound(a, a, False, False)
        del bound
        gc.collect()
        assert len(destroyed) == 1
    finally:
        del cache._destroy


# --- the recorded optimizer updates ------------------------------------------------------
# name, arrays (var, grad, slots), the arguments after them, where the rate is among those
BOUND_UPDATES: list[tuple[str, int, tuple[Any, ...], int]] = [
    ("rmsprop_update", 3, (None, 1e-3, 0.9, 0.0, 1e-7), 1),
    ("sgd_update", 2, (None, 0.05, 0.0, False), 1),
    ("sgd_update", 3, (0.01, 0.9, False), 0),
    ("sgd_update", 3, (0.01, 0.9, True), 0),
]


@pytest.mark.parametrize(("name", "count", "args", "rate"), BOUND_UPDATES,
                         ids=["rmsprop", "sgd", "momentum", "nesterov"])
@pytest.mark.parametrize("shape", [(784, 64), (20_000,)])
def test_a_bound_update_gives_the_numpy_kernels_bits(
        monkeypatch: pytest.MonkeyPatch, name: str, count: int, args: tuple[Any, ...],
        rate: int, shape: tuple[int, ...]) -> None:
    backend, kernels = _updates_or_skip(monkeypatch)
    monkeypatch.setattr(onednn_optim, "UPDATE_MIN_ELEMENTS", 1 << 14)
    kernel, reference = kernels[name], getattr(backend, name)
    rng = np.random.default_rng(5)
    ours = _operands(rng, shape, 3)[:count]
    ref = [a.copy() for a in ours]
    bound = kernel.bind(*ours, *args, None)
    assert bound is not None

    def both(arrays: list[np.ndarray], expected: list[np.ndarray], arguments: tuple[Any, ...],
             flag: Any = None) -> None:
        with np.errstate(all="ignore"):   # inf - inf and the like, on purpose
            bound(*arrays, *arguments, flag)
            if flag is None or bool(flag):
                reference(*expected, *arguments, None)
        assert all(_same_bits(got, want) for got, want in zip(arrays, expected)), name

    for _ in range(3):
        both(ours, ref, args)
    both(ours, ref, args, np.asarray(False))          # skipped: nothing written
    changed = list(args)
    changed[rate] *= 2                                  # another rate: the kernel, its bits
    both(ours, ref, tuple(changed))
    small = [o.reshape(-1)[:100].copy() for o in ours]  # another shape: the kernel too
    both(small, [a.copy() for a in small], args)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_updates_onednn_leaves_to_numpy_bind_the_numpy_kernels_block(
        monkeypatch: pytest.MonkeyPatch, momentum: float) -> None:
    """Small arrays (and RMSprop with momentum) stay on the CPU kernel, whose bound form
    (one block, hyperparameters rounded once) gives its bits; over one block it binds
    nothing."""
    backend, kernels = _updates_or_skip(monkeypatch)
    rms = kernels["rmsprop_update"]
    rng = np.random.default_rng(6)
    for shape in [(64,), (64, 10), (1000, 4)]:
        ours = _operands(rng, shape, 4)[:4]
        mom = ours[3] if momentum else None
        ref = [a.copy() for a in ours]
        args = (0.01, 0.9, momentum, 1e-7, None)
        bound = rms.bind(*ours[:3], mom, *args)
        assert bound is not None and "CpuOptim" in bound.__qualname__
        for _ in range(2):
            with np.errstate(all="ignore"):
                bound(*ours[:3], mom, *args)
                backend.rmsprop_update(*ref[:3], ref[3] if momentum else None, *args)
            assert all(_same_bits(got, want) for got, want in zip(ours, ref))
    big = [np.ones(1 << 16, np.float32) for _ in range(4)]   # more than a block
    assert rms.bind(*big[:3], big[3], 1e-3, 0.9, 0.9, 1e-7, None) is None
    sgd = kernels["sgd_update"]
    v, g = (np.ones(100, np.float32) for _ in range(2))
    bound = sgd.bind(v, g, None, 0.1, 0.0, False, None)
    assert bound is not None and "CpuOptim" in bound.__qualname__
    bound(v, g, None, 0.1, 0.0, False, None)
    assert np.all(v == np.float32(1) - np.float32(0.1))


# --- in a traced step ----------------------------------------------------------------------
def test_the_guide_models_traced_fit_runs_bound_kernels_and_equals_eager() -> None:
    """784-64-64-10 at batch 128: its first layer's GEMMs and its RMSprop update (50176
    weights) run bound in the replay; weights, metrics and the loss equal the eager fit's."""
    if "mpcore_onednn" not in [s.provider for s in mp.get_backend("cpu").kernel_sets]:
        pytest.skip("oneDNN is not in use on this CPU backend")
    from mpcore.cli.demo import build_model

    rng = np.random.default_rng(0)
    x = rng.random((128 * 4, 784), dtype=np.float32)
    y = rng.integers(0, 10, 128 * 4).astype(np.int32)
    for policy in ("float32", "mixed_bfloat16"):
        runs = []
        for jit in (False, True):
            mp.random.set_seed(0)
            with mp.policy_scope(policy):
                model = build_model(64)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=mp.optimizers.RMSprop(), metrics=["accuracy"],
                          jit_compile=jit)
            history = model.fit(x, y, batch_size=128, epochs=3, verbose=0)
            runs.append((model, {k: v for k, v in history.history.items()
                                 if k != "time_per_sample"}))
        (eager, eager_logs), (traced, logs) = runs
        assert logs == eager_logs and np.isfinite(logs["loss"]).all()
        for a, b in zip(traced.get_weights(), eager.get_weights(), strict=True):
            assert np.array_equal(a, b), policy
        names = [step.kernel.__name__ for step in _kernel_calls(traced)]
        # the update always; the GEMMs too where oneDNN multiplies the policy's dtype itself
        assert names.count("bound") >= (3 if policy == "float32" else 1), (policy, names)


def _kernel_calls(model: mp.Model) -> list[Any]:
    from mpcore.tracing.program import KernelCall

    program = model.train_function.graph
    return [step for step in program.steps if type(step) is KernelCall]


# --- casts: the converter chain decided once ----------------------------------------------
CASTS = [((300, 900), np.float32, "bfloat16"), ((300, 900), BF16, "float32"),
         ((64, 64), BF16, "float32"), ((128,), np.float32, "float16"),
         ((300, 900), np.float16, "float32"), ((), np.float32, "bfloat16")]


@pytest.mark.parametrize(("shape", "src", "dst"), CASTS,
                         ids=[f"{np.dtype(c[1]).name}-{c[2]}-{c[0]}" for c in CASTS])
def test_a_bound_cast_gives_the_cast_kernels_bits(kernels: dict[str, Any], shape: Any,
                                                  src: Any, dst: str) -> None:
    backend = kernels["cast"].__self__
    rng = np.random.default_rng(4)

    def data() -> np.ndarray:
        x = rng.standard_normal(shape, dtype=np.float32) * 1e3
        if x.ndim:
            x.reshape(-1)[:4] = [np.inf, -0.0, 1e-40, 3.4e38]
        with np.errstate(over="ignore"):        # 3.4e38 to float16: inf, on purpose
            return x.astype(src)

    bound = backend.bind_kernel("cast", kernels["cast"], (data(), dst))
    assert bound is not None
    for _ in range(2):
        x = data()
        with np.errstate(all="ignore"):
            got, want = bound(x, dst), kernels["cast"](x, dst)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    if len(shape) == 2:       # a strided operand of the bound shape: the kernel's way
        wide = np.repeat(data(), 2, axis=1)[:, ::2]
        assert np.array_equal(bound(wide, dst), kernels["cast"](wide, dst))
    other = "float16" if dst != "float16" else "bfloat16"
    assert bound(data(), other).dtype == np.dtype(ml_dtypes.bfloat16 if other == "bfloat16"
                                                  else np.float16)


def test_a_bound_reorder_runs_on_its_own_primitive(kernels: dict[str, Any]) -> None:
    from mpcore_onednn.creation import MIN_ELEMENTS_WIDENING, ReorderCast

    chain = [kernels["convert"]]
    while hasattr(chain[-1], "fallback"):
        chain.append(chain[-1].fallback)
    reorder = next(k for k in chain if isinstance(k, ReorderCast))
    x = np.ones(MIN_ELEMENTS_WIDENING, BF16)
    bound = reorder.bind(x, np.float32)
    if not reorder.trusted.get((BF16, np.dtype(np.float32))):
        pytest.skip("this oneDNN's bfloat16 -> float32 reorder is not astype's")
    calls, lookups = reorder.calls, reorder.cache.hits + reorder.cache.misses
    assert np.array_equal(bound(x, np.float32), x.astype(np.float32))
    assert reorder.calls == calls + 1                              # on oneDNN
    assert reorder.cache.hits + reorder.cache.misses == lookups    # not through the LRU
    small = np.ones(100, BF16)                                     # the wrapped converter's
    assert reorder.bind(small, np.float32) is not reorder


@pytest.mark.parametrize("onednn", ["auto", "off"])
def test_a_bound_16_bit_relu_backward_gives_the_kernels_bits(monkeypatch: pytest.MonkeyPatch,
                                                             onednn: str) -> None:
    """The CPU kernel's bfloat16 relu backward, bound (its bias GEMV resolved once), with
    the oneDNN provider (which leaves these small calls to it) and without."""
    if onednn == "auto":
        library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", onednn)
    backend = CpuBackend()
    kernel = backend.kernels()["relu_grad_bias"]
    rng = np.random.default_rng(8)

    def operands(shape: tuple[int, int] = (128, 64)) -> tuple[np.ndarray, np.ndarray]:
        return (rng.standard_normal(shape, dtype=np.float32).astype(BF16),
                rng.standard_normal(shape, dtype=np.float32).astype(BF16))

    bound = backend.bind_kernel("relu_grad_bias", kernel, operands())
    assert bound is not None
    for args in (operands(), operands(), operands((32, 64))):   # another shape: the kernel
        (dz, db), (want_dz, want_db) = bound(*args), kernel(*args)
        assert np.array_equal(dz, want_dz) and np.array_equal(db, want_db)
        assert db.dtype == BF16 and db.shape == (64,)
    # float32 of one block: the kernel's pass without its set-up; signed zeros, NaN and inf
    # gradients where y <= 0 (dropped: +0), -0 column sums (+0, as the kernel sums from 0)
    def f32() -> tuple[np.ndarray, np.ndarray]:
        g, y = (a.astype(np.float32) for a in operands())
        g[:4, 0] = [np.nan, np.inf, -0.0, -0.0]
        y[:4, 0] = [-1.0, 0.0, 1.0, np.nan]
        g[:, 1], y[:, 1] = -0.0, 1.0
        return g, y

    bound = backend.bind_kernel("relu_grad_bias", kernel, f32())
    assert bound is not None
    for args in (f32(), f32()):
        (dz, db), (want_dz, want_db) = bound(*args), kernel(*args)
        assert np.array_equal(dz.view(np.uint32), want_dz.view(np.uint32))
        assert np.array_equal(db.view(np.uint32), want_db.view(np.uint32))
    big = np.ones((512, 256), np.float32)            # more than a block: nothing to save
    assert backend.bind_kernel("relu_grad_bias", kernel, (big, big)) is None


# --- the trial's findings: the replay's bits where eager's are unusual ------------------------
def _nan(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("optimizer", ["nesterov", "rmsprop"])
def test_a_nan_weight_and_slot_update_as_eagerly(optimizer: str) -> None:
    """40960 weights (above the updates' oneDNN threshold): where a weight and its slot are
    both NaN (of opposite signs) and the gradient is finite, the replay keeps eager's NaN.
    (Bound updates once took oneDNN from a lower size than eager calls, whose NumPy kernel
    keeps the other NaN.)"""
    def train(traced: bool) -> np.ndarray:
        w0 = np.ones((256, 160), np.float32)
        w0[0, 0] = _nan(0x7FC00001)
        v = mp.Variable(w0)
        opt = (mp.optimizers.SGD(0.1, momentum=0.9, nesterov=True) if optimizer == "nesterov"
               else mp.optimizers.RMSprop(0.01))
        step = lambda g: opt.apply_gradients([(g, v)])  # noqa: E731
        if traced:
            step = mp.function(step)
        g = mp.constant(np.full((256, 160), 0.5, np.float32))
        step(g)                                                    # makes the slot
        slot = opt.get_slot(v, "momentum" if optimizer == "nesterov" else "velocity")
        s = slot.numpy()
        s[0, 0] = _nan(0xFFC00002)
        slot.assign(s)
        for _ in range(3):
            step(g)
        return v.numpy()

    assert np.array_equal(train(True).view(np.uint32), train(False).view(np.uint32))


@pytest.mark.parametrize(("low", "traced_order"), [("float16", "F"), ("bfloat16", "F"),
                                                  ("float16", "C")])
def test_a_cast_traced_on_one_layout_replays_others_as_eagerly(low: str,
                                                                traced_order: str) -> None:
    """Quiet NaNs with payloads (kept by ONNX Runtime's and oneDNN's conversions, not by
    NumPy's): a cast traced on a Fortran-ordered array and replayed on a C-ordered one (and
    the other way) gives eager's bits; the trace binds converters by dtype and size only."""
    x = np.full((600, 500), 1.0, np.float32)
    x.view(np.uint32)[::7] = 0x7FC12345
    f = mp.function(lambda t: mp.ops.cast(t, low))
    first = np.asfortranarray(x) if traced_order == "F" else x
    second = x if traced_order == "F" else np.asfortranarray(x)
    f(mp.constant(first))
    for operand in (second, first):
        replay = np.asarray(f(mp.constant(operand)))
        eager = np.asarray(mp.ops.cast(mp.constant(operand), low))
        assert np.array_equal(replay.view(np.uint16), eager.view(np.uint16))
    assert f.tracing_count == 1


def test_eager_updates_of_many_sizes_keep_their_primitives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """40 weight sizes above the threshold (a model with many large layers): the second step
    makes no primitive (the review found 32 kept, so such a model rebuilt them every step);
    ``passes.runs`` counts runs, not lookups or binds."""
    _, kernels = _updates_or_skip(monkeypatch)
    rms = kernels["rmsprop_update"]
    made = []
    bind = rms.cache.bind

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return bind(*args, **kwargs)

    monkeypatch.setattr(rms.cache, "bind", counting)
    arrays = [[np.ones(onednn_optim.UPDATE_MIN_ELEMENTS + k, np.float32) for _ in range(3)]
              for k in range(40)]
    for step in range(2):
        made.clear()
        for var, grad, ms in arrays:
            rms(var, grad, ms, None, 1e-3, 0.9, 0.0, 1e-7, None)
        assert len(made) == (4 * 40 if step == 0 else 0)
    runs = rms.passes.runs
    var, grad, ms = arrays[0]
    bound = rms.bind(var, grad, ms, None, 1e-3, 0.9, 0.0, 1e-7, None)
    assert rms.passes.runs == runs
    bound(var, grad, ms, None, 1e-3, 0.9, 0.0, 1e-7, None)
    assert rms.passes.runs == runs + 1
