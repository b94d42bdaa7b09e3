"""The OpenCL backend on the real device here: invalid indices (never followed, reported at the
next host read), random numbers, loss scaling, the fused optimizer updates and training steps
(the kernels, devices and verdicts: test_opencl.py)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import SHARED_MNIST, train_guide_on_mnist
from opencl_cases import cl, cpu, host, needs_device  # noqa: F401 - cl, cpu: fixtures

import mpcore as mp

BF16 = ml_dtypes.bfloat16


# --- invalid indices: never followed, reported at the next host read --------------------
def _copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts host<->device copies (every blocking read goes through enqueue_copy)."""
    import pyopencl

    calls: list[int] = []
    real = pyopencl.enqueue_copy

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pyopencl, "enqueue_copy", counting)
    return calls


@needs_device
def test_bad_labels_raise_at_the_next_read_not_in_the_loss(cl: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    z = cl.asarray(np.zeros((6, 10), np.float32), "float32")
    bad = cl.asarray(np.array([0, 1, 10, 0, -3, 0]), "int32")
    good = cl.asarray(np.array([0, 1, 2, 3, 4, 5]), "int32")
    copies = _copies(monkeypatch)
    loss, probs = cl.sparse_softmax_cross_entropy(z, bad)
    grad = cl.sparse_softmax_cross_entropy_grad(probs, bad, cl.full((6,), 1.0, "float32"))
    assert copies == []  # no host round trip in the loss or its gradient
    with pytest.raises(ValueError, match=r"label 10 is out of range.*\[0, 10\).*host read"):
        host(cl, loss)
    # reported once; the bad rows are NaN, the others exact
    got = host(cl, loss)
    assert np.isnan(got[[2, 4]]).all() and np.allclose(got[[0, 1, 3, 5]], np.log(10))
    g = host(cl, grad)
    assert np.isnan(g[[2, 4]]).all() and np.isfinite(g[[0, 1, 3, 5]]).all()
    loss, _ = cl.sparse_softmax_cross_entropy(z, good)
    np.testing.assert_allclose(host(cl, loss), np.log(10), rtol=1e-6)
    cl.sparse_softmax_cross_entropy(z, bad)
    with pytest.raises(ValueError, match="label 10"):
        cl.synchronize()  # a sync point too


@needs_device
@pytest.mark.parametrize("idx_dtype", ["int32", "int64", "uint8", "uint64"])
def test_take_out_of_range_reads_nothing_and_raises(cl: Any, idx_dtype: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    unsigned = idx_dtype.startswith("u")
    bad_value = (2**64 - 1 if idx_dtype == "uint64" else 255) if unsigned else -5
    idx = np.array([1, 4 if unsigned else -1, 0, bad_value], dtype=idx_dtype)
    out = cl.take(cl.asarray(x, "float32"), cl.asarray(idx, idx_dtype), 0)
    named = f"(4|{bad_value})" if unsigned else str(bad_value)  # the first one met is named
    with pytest.raises(IndexError, match=rf"index {named} is out of bounds for an axis of "
                                         r"size 4 \(valid indices: -4 to 3\)"):
        host(cl, out)
    got = host(cl, out)  # the error is reported once; the bad rows hold zeros
    want = np.zeros((4, 3), np.float32)
    want[0], want[2] = x[1], x[0]
    if not unsigned:
        want[1] = x[-1]
    np.testing.assert_array_equal(got, want)
    # along an inner axis, with a valid gather afterwards unaffected
    inner = cl.take(cl.asarray(x, "float32"), cl.asarray(np.array([2, 3]), "int64"), 1)
    with pytest.raises(IndexError, match="size 3"):
        host(cl, inner)
    ok = host(cl, cl.take(cl.asarray(x, "float32"), cl.asarray(np.array([-3, 2]), "int64"), 1))
    np.testing.assert_array_equal(ok, x[:, [-3, 2]])


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("idx_dtype", ["int64", "int32", "uint16"])
def test_take_of_whole_rows_equals_numpy_and_reports_bad_rows(cl: Any, dtype: str,
                                                             idx_dtype: str) -> None:
    """Rows of 32 elements or more are gathered one work-item per row (fit's batch gather):
    along axis 0 of a matrix and along a middle axis, repeated and negative indices, and an
    index out of range read as zeros and raised at the next read, as the element-wise kernel."""
    rng = np.random.default_rng(3)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = (rng.random((50, 40)) * 100).astype(np_dtype)
    idx = np.array([49, 0, 7, 7, 31], dtype=idx_dtype)
    if not idx_dtype.startswith("u"):
        idx[2] = -3
    got = host(cl, cl.take(cl.asarray(x, dtype), cl.asarray(idx, idx_dtype), 0))
    np.testing.assert_array_equal(got, np.take(x, idx.astype(np.int64), axis=0))
    x3 = (rng.random((3, 6, 33)) * 100).astype(np_dtype)
    got = host(cl, cl.take(cl.asarray(x3, dtype), cl.asarray(idx[:3] % 6, idx_dtype), 1))
    np.testing.assert_array_equal(got, np.take(x3, idx[:3].astype(np.int64) % 6, axis=1))
    bad = np.array([1, 50, 2], dtype=idx_dtype)
    out = cl.take(cl.asarray(x, dtype), cl.asarray(bad, idx_dtype), 0)
    with pytest.raises(IndexError, match=r"index 50 is out of bounds for an axis of size 50"):
        host(cl, out)
    want = np.zeros((3, 40), np_dtype)
    want[0], want[2] = x[1], x[2]
    np.testing.assert_array_equal(host(cl, out), want)


@needs_device
def test_take_grad_drops_out_of_range_indices_and_raises(cl: Any) -> None:
    g = np.ones((3, 2), dtype=np.float32)
    idx = np.array([0, 7, -1])
    out = cl.take_grad(cl.asarray(g, "float32"), cl.asarray(idx, "int64"), 0, (4, 2))
    with pytest.raises(IndexError, match=r"take gradient: index 7 .*size 4"):
        host(cl, out)
    np.testing.assert_array_equal(host(cl, out), [[1, 1], [0, 0], [0, 0], [1, 1]])


@needs_device
def test_one_hot_out_of_range_gives_zero_rows_as_on_cpu(cl: Any, cpu: Any) -> None:
    idx = np.array([0, 3, -1, 9, 2])
    got = host(cl, cl.one_hot(cl.asarray(idx, "int64"), 4, "float16"))
    np.testing.assert_array_equal(got, cpu["one_hot"](idx, 4, "float16"))


@needs_device
def test_bad_label_step_is_skipped_and_raises_at_the_flag_read(cl: Any) -> None:
    """The guide's custom loop with a loss-scaled optimizer: a bad label raises no later than
    the loss-scale flag read that ends the step, and the step never touches the weights."""
    prev = mp.get_backend()
    mp.set_backend("opencl")
    try:
        mp.set_global_policy("mixed_float16")
        layer = mp.layers.Dense(4)
        x = mp.constant(np.ones((3, 5), np.float32))
        layer(x)
        before = [v.numpy().copy() for v in layer.trainable_variables]
        opt = mp.LossScaleOptimizer(mp.optimizers.SGD(0.1))
        loss_fn = mp.losses.SparseCategoricalCrossentropy(from_logits=True)
        with mp.GradientTape() as tape:
            loss = loss_fn(mp.constant(np.array([0, 4, 1])), layer(x))
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, layer.trainable_variables))
        with pytest.raises(ValueError, match=r"label 4 is out of range.*\[0, 4\)"):
            opt.apply_gradients(zip(grads, layer.trainable_variables))
        for v, b in zip(layer.trainable_variables, before):
            np.testing.assert_array_equal(v.numpy(), b)
    finally:
        mp.set_backend(prev.name)


@needs_device
def test_random_is_seeded_and_distributed(cl: Any) -> None:
    u1 = host(cl, cl.random_uniform((100_000,), "float32", 7, -2.0, 2.0))
    u2 = host(cl, cl.random_uniform((100_000,), "float32", 7, -2.0, 2.0))
    assert np.array_equal(u1, u2) and u1.min() >= -2.0 and u1.max() < 2.0
    assert abs(u1.mean()) < 0.03
    z = host(cl, cl.random_normal((100_000,), "float32", 8, 1.0, 2.0))
    assert abs(z.mean() - 1.0) < 0.03 and abs(z.std() - 2.0) < 0.03
    m = host(cl, cl.dropout_mask((100_000,), 0.25, "float16", 9))
    assert set(np.unique(m)) == {0.0, np.float16(1 / 0.75)}
    assert abs((m == 0).mean() - 0.25) < 0.01


@needs_device
def test_unscale_flag_and_skipped_update(cl: Any) -> None:
    g1 = cl.asarray(np.array([2.0, 4.0], np.float16), "float16")
    g2 = cl.asarray(np.array([np.inf], np.float32), "float32")
    outs, flag = cl.unscale_and_check([g1], 0.5)
    assert outs[0].dtype == np.float32 and host(cl, flag)[()]
    np.testing.assert_array_equal(host(cl, outs[0]), [1.0, 2.0])
    outs, flag = cl.unscale_and_check([g1, g2], 0.5)
    assert not host(cl, flag)[()]
    var = cl.asarray(np.ones(2, np.float32), "float32")
    m, v = cl.full((2,), 0, "float32"), cl.full((2,), 0, "float32")
    rates = cl.adam_rates(cl.full((), 0, "int64"), 0.1, 0.9, 0.999, 0.0)
    cl.adam_update(var, outs[0], m, v, rates, 0.9, 0.999, 1e-7, 0.0, flag)
    np.testing.assert_array_equal(host(cl, var), [1.0, 1.0])  # skipped on the device
    assert not host(cl, cl.all_finite([g1, g2]))[()] and host(cl, cl.all_finite([g1]))[()]


@needs_device
@pytest.mark.parametrize("name", ["sgd", "rmsprop", "adam", "adamw"])
def test_fused_updates_match_the_composite_path(cl: Any, name: str) -> None:
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    grads = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]

    def make() -> Any:
        return {"sgd": lambda: mp.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
                "rmsprop": lambda: mp.optimizers.RMSprop(0.01, momentum=0.5),
                "adam": lambda: mp.optimizers.Adam(0.01),
                "adamw": lambda: mp.optimizers.AdamW(0.01, weight_decay=0.1)}[name]()

    results = []
    for fused in (True, False):
        opt = make()
        opt.use_fused_kernels = fused
        var = mp.Variable(w0, backend=cl)
        for g in grads:
            opt.apply_gradients([(mp.constant(g, backend=cl), var)])
        results.append(var.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


@needs_device
def test_training_step_mixed_float16_on_opencl(cl: Any) -> None:
    """A few loss-scaled steps of a small dense model, the guide's way, on the device."""
    mp.set_global_policy("mixed_float16")
    prev = mp.get_backend()
    mp.set_backend("opencl")
    try:
        rng = np.random.default_rng(6)
        x = rng.standard_normal((64, 20)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int32)
        inputs = mp.Input(shape=(20,))
        h = mp.layers.Dense(16, activation="relu")(inputs)
        h = mp.layers.Dense(2)(h)
        outputs = mp.layers.Activation("softmax", dtype="float32")(h)
        model = mp.Model(inputs=inputs, outputs=outputs)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=mp.optimizers.Adam(0.01), metrics=["accuracy"])
        history = model.fit(x, y, batch_size=16, epochs=8, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        assert model.evaluate(x, y, verbose=0)[1] > 0.8
        assert model.layers[1].kernel.backend.name == "opencl"
    finally:
        mp.set_backend(prev.name)




@needs_device
@pytest.mark.skipif(not SHARED_MNIST.is_dir(), reason="the shared MNIST files are not here")
def test_guide_mnist_accuracy_bar_on_opencl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Done-when: the guide's model (64 units) reaches >= 0.88 test accuracy in 5 epochs (batch
    128, offline split) with MPCORE_BACKEND=opencl and mixed_float16, as on the cpu backend."""
    monkeypatch.setenv("MPCORE_DATA_DIR", str(SHARED_MNIST))
    data = mp.datasets.mnist.load()
    assert data.split == "offline"
    prev = mp.get_backend()
    mp.set_backend("opencl")
    try:
        model, accuracy = train_guide_on_mnist("mixed_float16", data)
        dense = model.get_layer("dense_1")
        assert dense.kernel.dtype == "float32" and dense.kernel.backend.name == "opencl"
    finally:
        mp.set_backend(prev.name)
    print(f"opencl mixed_float16 test accuracy after 5 epochs: {accuracy:.4f}")
    assert accuracy >= 0.88
