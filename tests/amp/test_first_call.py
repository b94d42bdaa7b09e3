"""Issue 34 item 3: a step is prepared before it runs. Under the graph rewrite, the first call
of a signature records the float32 op graph in a pre-pass whose effects are put back
(``mpcore.tracing.effects``), then traces painted: it returns the painted (16-bit) result and
applies one painted update, exactly what a replay of that program computes; ``tracing_count``
counts one trace per signature."""

from __future__ import annotations

import numpy as np
import pytest
from amp_models import X, Y, rewrite_off  # noqa: F401 - rewrite_off: autouse

import mpcore as mp

enable = mp.mixed_precision.enable_mixed_precision_graph_rewrite


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_rewritten_function_returns_its_16_bit_result_the_first_time(dtype: str) -> None:
    w = mp.Variable(np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32))
    f = mp.function(lambda x: mp.ops.matmul(x, w))
    enable(mp.optimizers.SGD(), dtype=dtype)
    x = mp.constant(X)
    first = f(x)
    assert first.dtype == dtype                         # matmul is on the allowlist
    assert f.tracing_count == 1
    again = f(x)                                        # a replay of the same program
    assert f.tracing_count == 1
    np.testing.assert_array_equal(first.numpy(), again.numpy())


def _model(dropout: bool) -> mp.Model:
    mp.random.set_seed(5)
    x_in = mp.Input(shape=(20,))
    x = mp.layers.Dense(32, activation="relu")(x_in)
    if dropout:
        x = mp.layers.Dropout(0.25)(x)                 # seeds drawn in the step
    x = mp.layers.Dense(4)(x)
    out = mp.layers.Activation("softmax", dtype="float32")(x)
    return mp.Model(inputs=x_in, outputs=out)


@pytest.mark.parametrize("dtype, inner, dropout", [
    ("float16", "rmsprop", False), ("float16", "adam", True), ("bfloat16", "sgd", True)])
def test_the_first_train_step_is_painted_and_applied_once(
        dtype: str, inner: str, dropout: bool, backend: mp.Backend) -> None:
    model = _model(dropout)
    opt = enable(mp.optimizers.get(inner), dtype=dtype)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt)
    variables = model.trainable_variables
    opt.build(variables)                  # no variable is created by the first step
    weights, state, seeds = model.get_weights(), opt.get_state(variables), mp.random.get_state()

    loss = model.train_on_batch(X, Y)
    fn = model.train_function
    assert fn.tracing_count == 1
    graph = str(fn.graph)
    assert f"mixed precision graph rewrite ({dtype})" in graph
    assert f"matmul({dtype}" in graph or f"dense({dtype}" in graph
    assert opt.iterations == 1                          # the pre-pass's update was put back
    after = model.get_weights(), opt.get_state(variables), mp.random.get_state()

    # the same step again from the same state is a replay of the painted program: the first
    # call computed exactly that (not a float32 step, and not two steps)
    model.set_weights(weights)
    opt.set_state(variables, state)
    mp.random.set_state(seeds)
    assert model.train_on_batch(X, Y) == loss
    assert fn.tracing_count == 1
    for a, b in zip(after[0], model.get_weights()):
        np.testing.assert_array_equal(a, b)
    replayed = opt.get_state(variables)     # (a LossScaleOptimizer's: the inner one's too)
    assert replayed["inner"]["iterations"] == after[1]["inner"]["iterations"] == 1
    for a, b in zip(after[1]["inner"]["slots"], replayed["inner"]["slots"]):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert mp.random.get_state() == after[2]
    # the dynamic scale's counters moved once
    assert after[1]["loss_scale_state"] == replayed["loss_scale_state"]
    assert after[1]["loss_scale_state"] != state["loss_scale_state"]


def test_a_first_call_that_creates_variables_counts_two_traces() -> None:
    """As tf.function: a call that creates variables (a model built by its first call) runs
    eagerly, and the next call prepares and traces the painted step, once."""
    mp.random.set_seed(2)
    model = mp.Sequential([mp.layers.Dense(32, activation="relu"), mp.layers.Dense(4)])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=enable(
        mp.optimizers.SGD(0.1, momentum=0.9), dtype="bfloat16"))
    model.train_on_batch(X, Y)            # eager: builds the layers
    fn = model.train_function
    assert fn.tracing_count == 1 and fn.graph is None
    model.train_on_batch(X, Y)            # the pre-pass, then the painted trace: one call
    assert fn.tracing_count == 2
    assert "mixed precision graph rewrite (bfloat16)" in str(fn.graph)
    model.train_on_batch(X, Y)            # a replay
    assert fn.tracing_count == 2
    assert model.optimizer.iterations == 3


def test_a_model_whose_optimizer_makes_its_slots_in_the_first_step_is_painted_at_once() -> None:
    """The optimizer's slots, made before the step (fit and train_on_batch build the optimizer
    first): the model's first step is already painted, one trace."""
    model = _model(False)
    opt = enable(mp.optimizers.Adam(), dtype="float16")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt)
    model.train_on_batch(X, Y)
    assert model.train_function.tracing_count == 1
    assert "mixed precision graph rewrite (float16)" in str(model.train_function.graph)
    assert opt.iterations == 1


def test_a_custom_step_whose_adam_makes_its_slots_in_the_first_call_paints_that_call() -> None:
    """Adam is recorded kernel by kernel: a custom loop's step makes its slots in its first
    call, inside the pre-pass, whose Python state (the slot tables) is put back. That call must
    still be a painted step, not a float32 one: here float16 overflows where float32 does not,
    so the first call skips its update and halves the scale. The painted trace made the slots
    (a variable-creating trace, run once): the second call traces it again, then replays."""
    model = _model(False)
    opt = enable(mp.optimizers.Adam(), dtype="float16")
    loss_fn = mp.losses.SparseCategoricalCrossentropy()

    @mp.function
    def step(x: mp.Tensor, y: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = loss_fn(y, model(x))
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    weights = model.get_weights()
    step(mp.constant(X * 3e4), mp.constant(Y))        # finite in float32, Inf in float16
    for a, b in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert opt.loss_scale.skipped_steps == 1 and float(opt.loss_scale) == 2.0 ** 14
    assert opt.iterations == 0 and step.tracing_count == 1      # (Keras 3: skipped, uncounted)
    state = opt.get_state(model.trainable_variables)["inner"]
    assert all(not np.any(slot) for slots in state["slots"] for slot in slots.values())
    step(mp.constant(X), mp.constant(Y))
    assert step.tracing_count == 2
    assert "mixed precision graph rewrite (float16)" in str(step.graph)
    step(mp.constant(X), mp.constant(Y))              # a replay
    assert step.tracing_count == 2 and opt.iterations == 2     # (the first call skipped)


class _CountingSGD(mp.optimizers.SGD):
    """Counts its updates in a class attribute: state a pre-pass cannot put back."""

    updates = 0

    def _apply(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        type(self).updates += 1
        return super()._apply(*args, **kwargs)


def test_state_that_cannot_be_put_back_makes_the_pre_pass_a_float32_step() -> None:
    w = mp.Variable(np.ones((20, 3), np.float32))
    opt = enable(_CountingSGD(0.01), dtype="bfloat16")
    opt.build([w])

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = opt.get_scaled_loss(mp.ops.sum(mp.ops.tanh(mp.ops.matmul(x, w))))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [w]))
        opt.apply_gradients(zip(grads, [w]))
        return loss

    x = mp.constant(X)
    step(x)                               # the pre-pass stands: a float32 step, as before
    assert _CountingSGD.updates == 1
    assert "this float32 trace recorded the op graph" in str(step.graph)
    step(x)                               # painted
    assert "ops painted bfloat16" in str(step.graph)
    assert _CountingSGD.updates == 2 and opt.iterations == 2
