"""Regressions found by the QA pass: a user's code (the Keras guide word for word, bad input)
that failed, or worse, silently did the wrong thing."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import mpcore as mp


def _classifier(inputs: int = 4, classes: int = 3) -> mp.Model:
    inp = mp.Input(shape=(inputs,))
    out = mp.layers.Dense(classes, activation="softmax")(mp.layers.Dense(8, activation="relu")(inp))
    model = mp.Model(inp, out)
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd", metrics=["accuracy"])
    return model


# --- the Keras guide, word for word -------------------------------------------------------------
def test_dtype_has_a_name_as_in_the_guide() -> None:
    """The guide prints ``x.dtype.name`` and ``dense1.kernel.dtype.name``."""
    mp.set_global_policy("mixed_float16")
    inputs = mp.Input(shape=(784,), name="digits")
    dense1 = mp.layers.Dense(16, activation="relu", name="dense_1")
    x = dense1(inputs)
    assert x.dtype.name == "float16"
    assert dense1.kernel.dtype.name == "float32"
    t = mp.constant([1.0], dtype="bfloat16")
    assert t.dtype.name == "bfloat16" and t.dtype == "bfloat16"
    # still a plain name everywhere a string is expected
    assert f"{t.dtype}" == "bfloat16" and {t.dtype: 1}["bfloat16"] == 1
    assert type(str(t.dtype)) is str


def test_metrics_are_callable_as_in_the_guide() -> None:
    """The guide's loop does ``epoch_loss_avg(loss)``: update, then the running result."""
    avg = mp.metrics.Mean()
    assert avg(mp.constant([1.0, 3.0])) == pytest.approx(2.0)
    assert avg(mp.constant(5.0)) == pytest.approx(3.0)
    acc = mp.metrics.SparseCategoricalAccuracy()
    assert acc(np.array([0, 1]), np.array([[0.9, 0.1], [0.8, 0.2]], np.float32)) == 0.5


# --- ops ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [2, 3, -3])
def test_softmax_rejects_an_axis_out_of_range(op: str, axis: int) -> None:
    """axis=3 on a rank-2 tensor used to wrap around (3 % 2 == 1) and return a result."""
    x = mp.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match=f"{op}: axis {axis} is out of range"):
        getattr(mp.ops, op)(x, axis=axis)


def test_softmax_negative_axis_still_works() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = np.exp(x) / np.exp(x).sum(0, keepdims=True)
    np.testing.assert_allclose(mp.ops.softmax(mp.constant(x), axis=-2).numpy(), want, rtol=1e-6)


# --- layers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [np.float32(1.0), np.ones((3,), np.float32)])
def test_dense_rejects_low_rank_input_without_building(value: np.ndarray) -> None:
    layer = mp.layers.Dense(2)
    with pytest.raises(ValueError, match=r"expects inputs of rank >= 2, got shape"):
        layer(value)
    assert not layer.built and layer.weights == []
    assert layer(np.ones((4, 5), np.float32)).shape == (4, 2)  # still usable


# --- Model ----------------------------------------------------------------------------------------
def test_evaluate_on_no_samples_raises() -> None:
    """evaluate on empty arrays used to return [0.0, 0.0]: a perfect-looking, made-up score."""
    model = _classifier()
    with pytest.raises(ValueError, match="evaluate got no samples"):
        model.evaluate(np.ones((0, 4), np.float32), np.zeros((0,), np.int64), verbose=0)


def test_fit_and_evaluate_take_nested_python_lists() -> None:
    """A list of rows used to be read as one input per row: 'fit got no training samples'."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    mp.random.set_seed(1)
    model = _classifier()
    history = model.fit(x.tolist(), y.tolist(), batch_size=8, epochs=1, verbose=0,
                        shuffle=False)
    mp.random.set_seed(1)
    reference = _classifier()
    expected = reference.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert history.history["loss"] == pytest.approx(expected.history["loss"], rel=1e-6)
    assert model.evaluate(x.tolist(), y.tolist(), verbose=0) == pytest.approx(
        reference.evaluate(x, y, verbose=0), rel=1e-6)


def test_compile_takes_a_single_metric_name() -> None:
    """metrics="accuracy" used to be iterated letter by letter: "unknown metric 'a'"."""
    model = _classifier()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd", metrics="accuracy")
    assert model.metrics_names == ["loss", "accuracy"]


def test_loading_a_file_that_is_not_a_checkpoint_says_so(tmp_path: Path) -> None:
    model = _classifier()
    garbage = tmp_path / "w.bin"
    garbage.write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"is not an mpcore\.weights file"):
        model.load_weights(garbage)
    other = tmp_path / "other.pkl"
    other.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match=r"is not an mpcore\.checkpoint file"):
        model.load_checkpoint(other)


# --- losses ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", [7, -1])
def test_sparse_crossentropy_on_probabilities_rejects_labels_out_of_range(
        backend: mp.Backend, label: int) -> None:
    """The guide's custom loop (softmax outputs, from_logits=False) used to score a label out of
    range as a loss of 0 for that example: one_hot of it is all zeros."""
    loss = mp.losses.SparseCategoricalCrossentropy()
    probs = mp.constant(np.full((2, 3), 1 / 3, np.float32))
    if backend.name == "cuda":
        # CUDA's documented answer (mpcore_cuda.nn), TensorFlow's on GPUs: NaN for that example,
        # since raising would read the device every step; the other example is scored
        each = mp.losses.SparseCategoricalCrossentropy(reduction="none")
        values = each(np.array([0, label]), probs).numpy()
        assert np.isfinite(values[0]) and np.isnan(values[1])
        return
    with pytest.raises(ValueError, match=f"label {label} is out of range"):
        float(loss(np.array([0, label]), probs))


def test_sparse_crossentropy_on_probabilities_matches_keras(backend: mp.Backend) -> None:
    """Keras' formula: -log of the clipped probability of the label, normalised over the
    classes (the sum is 1 for a softmax output); gradients through it stay finite."""
    p = np.array([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]], np.float32)
    y = np.array([0, 2, 2])
    clipped = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    want = -np.log(clipped[np.arange(3), y] / clipped.sum(1))
    pt = mp.constant(p)
    loss_fn = mp.losses.SparseCategoricalCrossentropy(reduction="none")
    with mp.GradientTape() as tape:
        tape.watch(pt)
        values = loss_fn(y, pt)
        total = mp.ops.sum(values)
    np.testing.assert_allclose(values.numpy(), want, rtol=1e-5)
    grad = tape.gradient(total, pt).numpy()
    assert np.isfinite(grad).all()


@pytest.mark.parametrize("kwargs", [{"epochs": 2.5}, {"epochs": -1}, {"initial_epoch": -2},
                                    {"validation_split": "0.2"}, {"validation_split": 1.0}])
def test_fit_rejects_bad_epochs_and_split_with_a_clear_error(kwargs: dict) -> None:
    model = mp.Sequential([mp.Input(shape=(3,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd")
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        model.fit(np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32), verbose=0, **kwargs)


def test_sparse_crossentropy_none_keeps_the_labels_shape() -> None:
    """(N, T, C) predictions give (N, T) losses with reduction="none", as Keras' (a sequence
    model's per-token losses); they were flattened to (N * T,)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, (4, 3))
    p = rng.random((4, 3, 5)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    want = -np.log(np.take_along_axis(p, y[..., None], -1)[..., 0])
    for labels in (y, y[..., None]):
        got = mp.losses.SparseCategoricalCrossentropy(reduction="none")(labels, mp.constant(p))
        assert got.shape == (4, 3)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    logits = mp.constant(np.log(p))
    got = mp.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(y, logits)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    mean = mp.losses.SparseCategoricalCrossentropy()(y, mp.constant(p))
    np.testing.assert_allclose(float(mean), want.mean(), rtol=1e-5)


@pytest.mark.parametrize(("sa", "sb", "ta"), [((2, 3, 4), (3, 5), True),
                                               ((2, 1, 3, 4), (5, 4, 6), False),
                                               ((3, 4), (2, 4, 5), False)])
def test_matmul_broadcasts_batch_axes_like_numpy(backend: mp.Backend, sa: tuple, sb: tuple,
                                                 ta: bool) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.random(sa, dtype=np.float32), rng.random(sb, dtype=np.float32)
    got = mp.ops.matmul(mp.constant(a), mp.constant(b), transpose_a=ta).numpy()
    want = np.matmul(np.swapaxes(a, -1, -2) if ta else a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_matmul_names_batch_axes_that_do_not_broadcast() -> None:
    with pytest.raises(ValueError, match=r"batch dimensions of \(2, 3, 4\) and \(3, 4, 5\)"):
        mp.ops.matmul(mp.constant(np.ones((2, 3, 4), np.float32)),
                      mp.constant(np.ones((3, 4, 5), np.float32)))


@pytest.mark.parametrize(("sa", "sb"), [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)),
                                         ((5, 2, 3), (3,)), ((3,), (5, 3, 4))])
def test_matmul_of_a_vector_is_numpys_with_its_gradient(backend: mp.Backend, sa: tuple,
                                                        sb: tuple) -> None:
    """Keras' and NumPy's matmul take 1-D operands (a row on the left, a column on the right,
    the added axis removed); mpcore refused them ("rank >= 2"). The gradients are those of
    the matrices (float64, against NumPy's closed forms)."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    ta, tb = mp.Variable(a, dtype="float64"), mp.Variable(b, dtype="float64")
    with mp.GradientTape() as tape:
        out = mp.ops.matmul(ta, tb)
        total = mp.ops.sum(out)
    want = np.matmul(a, b)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12)
    ga, gb = tape.gradient(total, [ta, tb])
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = np.ones(np.matmul(a2, b2).shape)
    want_ga = np.matmul(g2, np.swapaxes(b2, -1, -2))
    want_gb = np.matmul(np.swapaxes(a2, -1, -2), g2)
    want_ga = want_ga.reshape(-1, *a.shape).sum(axis=0) if want_ga.size != a.size else want_ga
    want_gb = want_gb.reshape(-1, *b.shape).sum(axis=0) if want_gb.size != b.size else want_gb
    np.testing.assert_allclose(ga.numpy(), want_ga.reshape(a.shape), rtol=1e-12)
    np.testing.assert_allclose(gb.numpy(), want_gb.reshape(b.shape), rtol=1e-12)


def test_matmul_refuses_scalars_and_a_vector_transposed() -> None:
    with pytest.raises(ValueError, match=r"rank >= 1 \(a scalar's product is multiply\)"):
        mp.ops.matmul(mp.constant(2.0), mp.constant(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="a 1-D operand has no axes to transpose"):
        mp.ops.matmul(mp.constant(np.ones(3, np.float32)), mp.constant(np.ones((3, 2), np.float32)),
                      transpose_a=True)
