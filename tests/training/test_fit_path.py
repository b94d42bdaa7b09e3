"""The lean Model.fit path: cross-entropies of softmax outputs computed from the logits (same loss
and gradients as the probability path), the CPU's one-pass finiteness check, and non-finite
steps that never touch any weight or slot."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import mpcore as mp
from mpcore import ops, optimizers
from mpcore.layers import activations
from mpcore.layers.activations import softmax_logits
from mpcore.losses import losses

RNG = np.random.default_rng(6)


def _model(policy: str = "float32") -> mp.Model:
    mp.set_global_policy(policy)
    try:
        inputs = mp.Input(shape=(12,))
        x = mp.layers.Dense(16, activation="relu")(inputs)
        x = mp.layers.Dense(5)(x)
        outputs = mp.layers.Activation("softmax", dtype="float32")(x)
        return mp.Model(inputs=inputs, outputs=outputs)
    finally:
        mp.set_global_policy(None)


def _loss_and_grads(model: mp.Model, loss: losses.Loss, x: np.ndarray, y: np.ndarray,
                    shortcut: bool) -> tuple[float, list[np.ndarray]]:
    with mp.GradientTape() as tape:
        probs = model(mp.constant(x), training=True)
        if not shortcut:
            # a new tensor holding the same probabilities: no logits on record for it
            probs = ops.multiply(probs, 1.0)
            assert softmax_logits(probs) is None
        value = loss(y, probs)
    grads = tape.gradient(value, model.trainable_variables)
    return float(value), [g.numpy() for g in grads]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", ["sparse", "categorical"])
def test_logits_shortcut_gives_the_probability_paths_loss_and_gradients(
        policy: str, kind: str) -> None:
    model = _model(policy)
    x = RNG.random((32, 12), dtype=np.float32)
    labels = RNG.integers(0, 5, 32).astype(np.int32)
    if kind == "sparse":
        loss: losses.Loss = losses.SparseCategoricalCrossentropy()
        y: np.ndarray = labels
    else:
        loss = losses.CategoricalCrossentropy()
        y = np.eye(5, dtype=np.float32)[labels]
    fast, fast_grads = _loss_and_grads(model, loss, x, y, shortcut=True)
    slow, slow_grads = _loss_and_grads(model, loss, x, y, shortcut=False)
    np.testing.assert_allclose(fast, slow, rtol=1e-5)
    for got, want in zip(fast_grads, slow_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_shortcut_is_taken_only_for_float32_softmax_outputs_of_the_last_axis() -> None:
    z = mp.constant(RNG.standard_normal((4, 3)).astype(np.float32))
    probs = activations.softmax(z)
    assert softmax_logits(probs) is z
    assert softmax_logits(z) is None
    assert softmax_logits(activations.softmax(z, axis=0)) is None
    assert softmax_logits(activations.softmax(ops.cast(z, "float16"))) is None
    key = id(probs)
    del probs
    gc.collect()
    assert key not in activations._SOFTMAX_LOGITS  # the record goes with its probabilities


def test_shortcut_scores_saturated_predictions_exactly_as_from_logits() -> None:
    # p[label] = e^-30: the clipped probability path caps the loss at -log(1e-7) = 16.1
    z = mp.constant(np.array([[0.0, 30.0], [1.0, -1.0]], np.float32))
    labels = np.array([0, 0], np.int32)
    got = losses.SparseCategoricalCrossentropy(reduction="none")(labels, activations.softmax(z))
    want = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(labels, z)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    assert got.numpy()[0] == pytest.approx(30.0, rel=1e-6)


def test_sparse_shortcut_with_a_time_axis() -> None:
    z = mp.constant(RNG.standard_normal((3, 4, 6)).astype(np.float32))
    labels = RNG.integers(0, 6, (3, 4)).astype(np.int32)
    loss = losses.SparseCategoricalCrossentropy(reduction="none")
    got = loss(labels, activations.softmax(z))
    want = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(labels, z)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_bad_last_gradient_leaves_every_variable_and_slot_untouched(fused: bool,
                                                                      bad: float) -> None:
    variables = [mp.Variable(RNG.standard_normal(s).astype(np.float32)) for s in
                 [(40, 33), (33,), (33, 7)]]
    opt = optimizers.RMSprop(0.01, momentum=0.5)
    opt.use_fused_kernels = fused
    good = [mp.constant(RNG.standard_normal(v.shape).astype(np.float32)) for v in variables]
    opt.apply_gradients(zip(good, variables))  # non-zero slots
    before = [v.numpy().copy() for v in variables + opt.variables()]
    last = RNG.standard_normal(variables[-1].shape).astype(np.float32)
    last[-1, -1] = bad  # the very last element: the check must see the tail of the last array
    grads = [*good[:-1], mp.constant(last)]
    assert not bool(opt.apply_gradients(zip(grads, variables)))
    for want, got in zip(before, variables + opt.variables()):
        np.testing.assert_array_equal(got.numpy(), want)


def test_fit_with_a_non_finite_batch_keeps_the_weights() -> None:
    model = _model()
    model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy")
    x = RNG.random((8, 12), dtype=np.float32)
    x[5, 3] = np.nan
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, np.zeros(8, np.int32), batch_size=8, epochs=1, verbose=0)
    for want, got in zip(before, model.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_cpu_all_finite_on_large_finite_values_and_non_contiguous_arrays() -> None:
    cpu = mp.get_backend("cpu")
    k = cpu.kernels()["all_finite"]
    # squares (and sums) that overflow float32 are still finite values
    assert bool(k([np.full(1000, 3.0e38, np.float32), np.full(5, 1e20, np.float32)]))
    col = np.ones((9, 4), np.float32)
    col[7, 2] = np.inf
    assert not bool(k([col.T]))  # a transposed view
    assert not bool(k([np.ones(17, np.float64), np.array([np.nan])]))
    assert bool(k([np.arange(10, dtype=np.int32)]))
