"""Losses (float32, against NumPy references, with gradients) and metrics."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore.losses import losses
from mpcore.metrics import metrics

RNG = np.random.default_rng(1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


LOGITS = RNG.standard_normal((6, 4)).astype(np.float32)
LABELS = np.array([0, 3, 1, 2, 3, 0])
PROBS = _softmax(LOGITS.astype(np.float64))


def test_sparse_categorical_crossentropy() -> None:
    ref = -np.log(PROBS[np.arange(6), LABELS]).mean()
    got = losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, LOGITS)
    assert got.dtype == "float32" and got.shape == ()
    np.testing.assert_allclose(float(got), ref, rtol=1e-6)
    got = losses.SparseCategoricalCrossentropy()(LABELS.reshape(6, 1), PROBS.astype(np.float32))
    np.testing.assert_allclose(float(got), ref, rtol=1e-5)
    per = losses.SparseCategoricalCrossentropy(reduction="none")(LABELS, PROBS)
    assert per.shape == (6,)


def test_categorical_crossentropy_and_its_gradient() -> None:
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    ref = -np.log(PROBS[np.arange(6), LABELS]).mean()
    np.testing.assert_allclose(float(losses.CategoricalCrossentropy(from_logits=True)(
        onehot, LOGITS)), ref, rtol=1e-6)
    np.testing.assert_allclose(float(losses.CategoricalCrossentropy()(onehot, PROBS)), ref,
                               rtol=1e-5)
    z = mp.Variable(LOGITS)
    with mp.GradientTape() as tape:
        loss = losses.CategoricalCrossentropy(from_logits=True)(onehot, z)
    np.testing.assert_allclose(np.asarray(tape.gradient(loss, z)), (PROBS - onehot) / 6,
                               rtol=1e-5, atol=1e-7)


def test_sparse_from_logits_gradient_matches_categorical() -> None:
    z = mp.Variable(LOGITS)
    with mp.GradientTape() as tape:
        loss = losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, z)
    np.testing.assert_allclose(np.asarray(tape.gradient(loss, z)),
                               (PROBS - np.eye(4)[LABELS]) / 6, rtol=1e-5, atol=1e-7)


def test_mse_and_binary_crossentropy() -> None:
    t = RNG.random((5, 3)).astype(np.float32)
    p = RNG.random((5, 3)).astype(np.float32)
    np.testing.assert_allclose(float(losses.MeanSquaredError()(t, p)), ((p - t) ** 2).mean(),
                               rtol=1e-6)
    y = (RNG.random((5, 3)) > 0.5).astype(np.float32)
    ref = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    np.testing.assert_allclose(float(losses.BinaryCrossentropy()(y, p)), ref, rtol=1e-5)
    logits = RNG.standard_normal((5, 3)).astype(np.float32) * 30  # saturating: stable path
    sig = 1 / (1 + np.exp(-logits.astype(np.float64)))
    ref = -(y * np.log(np.clip(sig, 1e-300, 1)) + (1 - y) * np.log(np.clip(1 - sig, 1e-300, 1)))
    got = float(losses.BinaryCrossentropy(from_logits=True)(y, logits))
    np.testing.assert_allclose(got, np.minimum(ref, 1e30).mean(), rtol=1e-4)


def test_losses_are_float32_for_16bit_predictions() -> None:
    for dtype in ("float16", "bfloat16"):
        pred = mp.constant(PROBS, dtype=dtype)
        assert losses.SparseCategoricalCrossentropy()(LABELS, pred).dtype == "float32"
        logits16 = mp.constant(LOGITS, dtype=dtype)
        assert losses.SparseCategoricalCrossentropy(from_logits=True)(
            LABELS, logits16).dtype == "float32"


def test_loss_errors() -> None:
    with pytest.raises(ValueError, match=r"valid names:.*sparse_categorical_crossentropy"):
        losses.get("hinge_loss")
    with pytest.raises(ValueError, match=r"labels of shape \(5,\).*\(6, 4\)"):
        losses.SparseCategoricalCrossentropy()(LABELS[:5], PROBS)
    out_of_range = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    if mp.get_backend().name == "cuda":   # NaN there, as TensorFlow on GPUs (mpcore_cuda.nn)
        values = np.asarray(out_of_range(np.array([0, 1, 2, 3, 4, 9]), LOGITS))
        assert np.isfinite(values[:5]).all() and np.isnan(values[5])
    else:
        with pytest.raises(ValueError, match="out of range"):  # (a device finds it by the read)
            np.asarray(out_of_range(np.array([0, 1, 2, 3, 4, 9]), LOGITS))
    with pytest.raises(ValueError, match="reduction"):
        losses.MeanSquaredError(reduction="avg")
    assert isinstance(losses.get("mse"), losses.MeanSquaredError)


def test_fit_with_a_loss_function_and_accuracy() -> None:
    # was a NumPy broadcast error: "accuracy" fell back to exact equality of labels and scores
    model = mp.Sequential([mp.layers.Dense(4, input_shape=(3,), activation="softmax")])
    model.compile(loss=losses.sparse_categorical_crossentropy, optimizer="sgd",
                  metrics=["accuracy"])
    x = np.eye(4, 3, dtype=np.float32)[LABELS]
    history = model.fit(x, LABELS, epochs=1, verbose=0)
    assert 0.0 <= history.history["accuracy"][0] <= 1.0


def test_accuracy_metrics() -> None:
    pred = np.eye(4, dtype=np.float32)[[0, 3, 2, 2, 3, 1]]
    m = metrics.get("accuracy", losses.SparseCategoricalCrossentropy())
    assert isinstance(m, metrics.SparseCategoricalAccuracy) and m.name == "accuracy"
    m.update_state(LABELS, pred)
    assert m.result() == pytest.approx(4 / 6)
    m.update_state(LABELS[:2], pred[:2])
    assert m.result() == pytest.approx(6 / 8)
    m.reset_state()
    assert m.result() == 0.0
    c = metrics.get("accuracy", losses.CategoricalCrossentropy())
    c.update_state(np.eye(4)[LABELS], pred)
    assert isinstance(c, metrics.CategoricalAccuracy) and c.result() == pytest.approx(4 / 6)
    # a loss that names no accuracy: the shapes decide, by Keras 3's rule
    for loss in (losses.sparse_categorical_crossentropy, "mse", None):
        shaped = metrics.get("acc", losses.get(loss) if loss else None)
        assert shaped.name == "acc"
        shaped.update_state(LABELS, pred)                          # sparse labels
        shaped.update_state(np.eye(4)[LABELS], pred)               # one-hot labels
        shaped.update_state([[1.0], [0.0], [1.0]], [[0.9], [0.2], [0.3]])   # binary
        assert shaped.result() == pytest.approx((4 + 4 + 2) / 15)
    b = metrics.BinaryAccuracy()
    b.update_state([[1.0], [0.0], [1.0]], [[0.9], [0.2], [0.3]])
    assert b.result() == pytest.approx(2 / 3)
    mean = metrics.Mean()
    mean.update_state([1.0, 2.0, 3.0])
    mean.update_state(mp.constant(10.0), sample_weight=3)
    assert mean.result() == pytest.approx((6 + 30) / 6)
    with pytest.raises(ValueError, match=r"valid names:.*accuracy"):
        metrics.get("f1_score")
