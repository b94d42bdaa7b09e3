"""Gradient accumulation (``gradient_accumulation_steps`` on every optimizer): N micro-batches of
B train as one batch of N*B; under loss scaling a non-finite micro-step makes the whole step a
skip and the loss scale moves once per real step; a checkpoint in the middle of an accumulation
resumes exactly; bad values are named."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp

RNG = np.random.default_rng(8)
X = RNG.standard_normal((32, 5)).astype(np.float32)
Y = RNG.standard_normal((32, 2)).astype(np.float32)
W0 = RNG.standard_normal((5, 2)).astype(np.float32)


def grads_of(w: mp.Variable, x: np.ndarray, y: np.ndarray, scale: float = 1.0) -> list[Any]:
    with mp.GradientTape() as tape:
        loss = mp.ops.mean(mp.ops.square(mp.ops.matmul(mp.constant(x), w) - mp.constant(y)))
        loss = loss * scale
    return tape.gradient(loss, [w])


def train_steps(optimizer: Any, w: mp.Variable, micro: int) -> None:
    """One pass over X in ``micro`` micro-batches."""
    size = len(X) // micro
    for i in range(micro):
        rows = slice(i * size, (i + 1) * size)
        optimizer.apply_gradients(zip(grads_of(w, X[rows], Y[rows]), [w]))


def train(optimizer: Any, micro: int, steps: int) -> np.ndarray:
    w = mp.Variable(W0)
    for _ in range(steps):
        train_steps(optimizer, w, micro)
    return w.numpy()


@pytest.mark.parametrize("make", [lambda **k: mp.optimizers.SGD(0.1, momentum=0.9, **k),
                                  lambda **k: mp.optimizers.Adam(0.05, **k),
                                  lambda **k: mp.optimizers.RMSprop(0.01, **k)])
def test_n_micro_batches_of_b_train_as_one_batch_of_n_times_b(make: Any) -> None:
    whole = make()
    accumulated = make(gradient_accumulation_steps=4)
    np.testing.assert_allclose(train(accumulated, 4, 3), train(whole, 1, 3), rtol=1e-5,
                               atol=1e-6)
    assert accumulated.iterations == whole.iterations == 3   # updates, not micro-steps


def test_a_non_finite_micro_step_skips_the_whole_step_and_the_scale_moves_once() -> None:
    scale = mp.DynamicLossScale(initial_loss_scale=64.0, increment_period=1)
    lso = mp.mixed_precision.LossScaleOptimizer(
        mp.optimizers.SGD(0.1, gradient_accumulation_steps=3), scale)
    w = mp.Variable(W0)
    x = X.copy()
    x[9, 0] = np.inf                                   # in the second micro-batch
    history = []
    for step in range(2):
        for i in range(3):
            rows = slice(i * 8, (i + 1) * 8)
            data = x if step == 0 else X
            lso.get_scaled_loss(mp.constant(1.0))
            grads = lso.get_unscaled_gradients(grads_of(w, data[rows], Y[rows], lso.loss_scale()))
            lso.apply_gradients(zip(grads, [w]))
            history.append((scale(), w.numpy().copy()))
    # the first real step is skipped: weights untouched, the scale halved once, at its end
    assert [s for s, _ in history[:3]] == [64.0, 64.0, 32.0]
    for _, weights in history[:3]:
        np.testing.assert_array_equal(weights, W0)
    assert lso.skipped_steps == 1
    # the second is applied, and the scale grows once
    assert [s for s, _ in history[3:]] == [32.0, 32.0, 64.0]
    assert not np.array_equal(history[-1][1], W0)


def test_a_checkpoint_in_the_middle_of_an_accumulation_resumes_exactly() -> None:
    full = mp.optimizers.Adam(0.05, gradient_accumulation_steps=4)
    expected = train(full, 4, 2)

    first = mp.optimizers.Adam(0.05, gradient_accumulation_steps=4)
    w = mp.Variable(W0)
    for i in range(6):                                 # one step and a half
        rows = slice((i % 4) * 8, (i % 4 + 1) * 8)
        first.apply_gradients(zip(grads_of(w, X[rows], Y[rows]), [w]))
    state, weights = first.get_state([w]), w.numpy()
    assert state["micro_steps"] == 2

    resumed = mp.optimizers.Adam(0.05, gradient_accumulation_steps=4)
    w2 = mp.Variable(weights)
    resumed.set_state([w2], state)
    for i in range(6, 8):
        rows = slice((i % 4) * 8, (i % 4 + 1) * 8)
        resumed.apply_gradients(zip(grads_of(w2, X[rows], Y[rows]), [w2]))
    np.testing.assert_array_equal(w2.numpy(), expected)

    # another accumulation count (or none) would average the wrong number of batches
    for other in (None, 2):
        with pytest.raises(ValueError, match=r"saved after micro-step 2 of "
                           r"gradient_accumulation_steps=4; this Adam has "
                           rf"gradient_accumulation_steps={other}: create it with "
                           r"gradient_accumulation_steps=4 to resume exactly"):
            mp.optimizers.Adam(0.05, gradient_accumulation_steps=other).set_state(
                [mp.Variable(weights)], state)
    # between steps nothing is accumulated: any optimizer of the class may take the state
    between, w3 = mp.optimizers.Adam(0.05, gradient_accumulation_steps=2), mp.Variable(W0)
    train_steps(between, w3, 2)
    assert between.get_state([w3])["micro_steps"] == 0
    mp.optimizers.Adam(0.05).set_state([mp.Variable(W0)], between.get_state([w3]))


@pytest.mark.parametrize("value", [0, -2, 2.5, True, "4"])
def test_bad_steps_are_named(value: Any) -> None:
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1"):
        mp.optimizers.SGD(gradient_accumulation_steps=value)


def test_one_step_is_no_accumulation_and_the_config_keeps_it() -> None:
    assert np.array_equal(train(mp.optimizers.SGD(0.1, gradient_accumulation_steps=1), 1, 2),
                          train(mp.optimizers.SGD(0.1), 1, 2))
    opt = mp.optimizers.RMSprop(gradient_accumulation_steps=4, clipnorm=1.0)
    again = mp.optimizers.RMSprop.from_config(opt.get_config())
    assert again.gradient_accumulation_steps == 4 and again.clipping == ("clipnorm", 1.0)


def test_a_variable_without_a_gradient_in_the_last_micro_step_is_still_updated() -> None:
    a, b, g = mp.Variable([0.0]), mp.Variable([0.0]), mp.constant([1.0])
    opt = mp.optimizers.SGD(1.0, gradient_accumulation_steps=2)
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a), (None, b)])
    assert b.numpy().tolist() == [-0.5]               # its mean over the step: (1 + 0) / 2
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a), (g, b)])
    assert b.numpy().tolist() == [-1.5]               # nothing left over from the first step


def test_a_loss_scale_optimizer_round_trips_its_config() -> None:
    lso = mp.mixed_precision.LossScaleOptimizer(
        mp.optimizers.Adam(clipnorm=1.0, gradient_accumulation_steps=2),
        mp.DynamicLossScale(hysteresis=2))
    again = mp.mixed_precision.LossScaleOptimizer.from_config(lso.get_config())
    assert again.get_config() == lso.get_config()
