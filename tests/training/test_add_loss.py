"""Keras 3's ``Layer.add_loss``: losses a layer adds in ``call`` reach ``model.losses``, are
cleared by the next outermost call, and are added to the loss by the built-in steps (eager and
traced alike, bit for bit) and by ``compute_loss`` in an overridden ``train_step``. The first
case is ported from Keras 3's keras/src/layers/layer_test.py (test_add_loss)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers


class LossLayer(layers.Layer):
    def call(self, x: Any) -> Any:
        self.add_loss(mp.ops.sum(x))
        return x


class OuterLayer(layers.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.inner = LossLayer()

    def call(self, x: Any) -> Any:
        return self.inner(self.inner(x))     # called twice in one pass: adds twice


def test_add_loss_keras() -> None:
    # keras/src/layers/layer_test.py::test_add_loss
    layer = LossLayer()
    layer(np.ones((1,), np.float32))
    assert len(layer.losses) == 1 and float(layer.losses[0]) == 1.0
    layer(np.ones((1,), np.float32))          # cleared by the next call
    assert len(layer.losses) == 1 and float(layer.losses[0]) == 1.0
    outer = OuterLayer()
    outer(np.ones((1,), np.float32))
    assert len(outer.losses) == 2 and len(outer.inner.losses) == 2
    outer(np.ones((1,), np.float32))
    assert len(outer.losses) == 2


def test_add_loss_takes_tensors_only() -> None:
    class Bad(layers.Layer):
        def call(self, x: Any) -> Any:
            self.add_loss(0.5)
            return x

    with pytest.raises(TypeError, match="add_loss takes tensors"):
        Bad()(np.ones((2,), np.float32))


class ActivityRegularization(layers.Layer):
    def __init__(self, rate: float = 1e-2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x: Any) -> Any:
        self.add_loss(self.rate * mp.ops.sum(mp.ops.square(x)))
        return x


X = np.random.default_rng(0).random((32, 4)).astype(np.float32)
Y = np.ones((32, 1), np.float32)


def _model(jit_compile: bool, policy: str = "float32") -> mp.Model:
    mp.random.set_seed(1)
    with mp.policy_scope(policy):
        inputs = mp.Input((4,))
        h = ActivityRegularization()(layers.Dense(8)(inputs))
        model = mp.Model(inputs, layers.Dense(1, dtype="float32")(h))
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model


def test_the_added_loss_is_part_of_the_training_loss() -> None:
    model = _model(False)
    loss = model.train_on_batch(X[:8], Y[:8])
    # the same forward pass by hand: mse + 0.01 * sum(h^2), before the update
    fresh = _model(False)
    pred = fresh.predict(X[:8])
    h = fresh.layers[1](mp.constant(X[:8])).numpy()
    want = np.mean((pred - Y[:8]) ** 2) + 0.01 * np.sum(h.astype(np.float64) ** 2)
    assert loss == pytest.approx(want, rel=1e-5)
    # evaluate adds it too, as Keras 3's compute_loss does
    logs = fresh.evaluate(X[:8], Y[:8], verbose=0)
    assert logs == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_traced_fit_equals_eager_bit_for_bit(policy: str) -> None:
    eager, traced = _model(False, policy), _model(True, policy)
    h1 = eager.fit(X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    h2 = traced.fit(X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    assert h1.history["loss"] == h2.history["loss"]
    for a, b in zip(eager.get_weights(), traced.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_compute_loss_in_an_overridden_train_step_adds_them() -> None:
    class Custom(mp.Model):
        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with mp.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    mp.random.set_seed(1)
    inputs = mp.Input((4,))
    h = ActivityRegularization()(layers.Dense(8)(inputs))
    custom = Custom(inputs, layers.Dense(1)(h))
    custom.compile(optimizer="sgd", loss="mse", jit_compile=True)
    built_in = _model(True)
    custom.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    built_in.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(custom.get_weights(), built_in.get_weights()):
        np.testing.assert_array_equal(a, b)
