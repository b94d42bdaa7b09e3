"""Keras 3's customisation points (issue 33, item 3), written as the Keras guide "Customizing
what happens in fit()" writes them: ``train_step(self, data)``, ``test_step``,
``predict_step``, with ``compute_loss``, ``self.metrics`` and the returned dict going to the
progress bar, callbacks and History; traced (``jit_compile=True``) bit for bit as eagerly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(21)
X = RNG.random((96, 6)).astype(np.float32)
Y = (X.sum(1) > 3).astype(np.int32)


class GuideModel(mp.Model):
    """The guide's first example, with Keras 3's optimizer.apply."""

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        with mp.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def _model(cls: type = GuideModel, policy: str = "float32") -> mp.Model:
    mp.set_global_policy(policy)
    mp.random.set_seed(4)
    inp = mp.Input((6,))
    h = layers.Dense(12, activation="relu")(inp)
    out = layers.Activation("linear", dtype="float32")(layers.Dense(2)(h))
    return cls(inp, out)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_custom_train_step_traced_equals_eager(policy: str) -> None:
    runs = []
    for jit in (False, True):
        model = _model(policy=policy)
        model.compile(optimizer=mp.optimizers.Adam(0.01),
                      loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=jit)
        history = model.fit(X, Y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                            validation_data=(X[:32], Y[:32]))
        logs = {k: v for k, v in history.history.items() if k != "time_per_sample"}
        runs.append((logs, model.get_weights(), model.evaluate(X, Y, verbose=0)))
        if jit:
            assert model._traced["custom_train"].tracing_count <= 2
    assert runs[0][0] == runs[1][0]
    assert set(runs[0][0]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert runs[0][2] == runs[1][2]


def test_returned_logs_reach_callbacks_and_history() -> None:
    seen: list[dict[str, Any]] = []

    class Keep(mp.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append(dict(logs or {}))

    class Extra(GuideModel):
        def train_step(self, data: Any) -> dict[str, Any]:
            logs = super().train_step(data)
            return {**logs, "twice_loss": logs["loss"] * 2.0}

    model = _model(Extra)
    model.compile(optimizer="sgd", loss=mp.losses.SparseCategoricalCrossentropy(True),
                  jit_compile=True)
    history = model.fit(X, Y, batch_size=32, epochs=2, verbose=0, callbacks=[Keep()])
    assert np.allclose(history.history["twice_loss"], 2 * np.array(history.history["loss"]))
    assert len(seen) == 6 and all(isinstance(s["loss"], float) for s in seen)
    assert np.isclose(seen[-1]["twice_loss"], 2 * seen[-1]["loss"])


def test_a_train_step_that_computes_its_own_loss_needs_no_compiled_loss() -> None:
    class OwnLoss(mp.Model):
        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with mp.GradientTape() as tape:
                pred = self(x, training=True)
                loss = mp.ops.mean(mp.ops.square(pred - mp.ops.cast(y, "float32")[:, None]))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"mse": loss}

    inp = mp.Input((6,))
    model = OwnLoss(inp, layers.Dense(1)(inp))
    model.compile(optimizer=mp.optimizers.SGD(0.1))
    history = model.fit(X, Y, batch_size=32, epochs=3, verbose=0)
    assert history.history["mse"][-1] < history.history["mse"][0]
    with pytest.raises(RuntimeError, match="compute_loss needs a loss"):
        model.compute_loss(y=Y, y_pred=X)


def test_predict_step_override_and_x_only_data() -> None:
    class Probabilities(mp.Model):
        def predict_step(self, data: Any) -> Any:
            (x,) = data          # predict gives (x,), as Keras' data adapters do
            return mp.ops.softmax(self(x, training=False))

    inp = mp.Input((6,))
    model = Probabilities(inp, layers.Dense(3)(inp))
    out = model.predict(X, batch_size=40)
    np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-5)
    x, y, sw = mp.models.steps.unpack_x_y_sample_weight((X, Y, None))
    assert x is X and y is Y and sw is None
    assert mp.models.steps.unpack_x_y_sample_weight(X)[0] is X


def test_default_steps_take_data_and_return_logs() -> None:
    model = _model(mp.Model)
    model.compile(optimizer="sgd", loss=mp.losses.SparseCategoricalCrossentropy(True),
                  metrics=["accuracy"])
    logs = model.train_step((mp.constant(X[:16]), mp.constant(Y[:16])))
    assert set(logs) == {"loss", "accuracy"} and isinstance(logs["loss"], float)
    assert set(model.test_step((mp.constant(X[:16]), mp.constant(Y[:16])))) == {"loss",
                                                                                "accuracy"}
    assert [m.name for m in model.metrics] == ["loss", "accuracy"]
    # (x, y, sample_weight): the built-in step weights the loss (all-zero weights: 0)
    model.reset_metrics()
    zeros = mp.constant(np.zeros(4, "float32"))
    assert model.test_step((mp.constant(X[:4]), mp.constant(Y[:4]), zeros))["loss"] == 0.0


def test_a_step_that_returns_no_dict_is_an_error() -> None:
    class Bad(GuideModel):
        def train_step(self, data: Any) -> Any:
            super().train_step(data)
            return 1.0

    model = _model(Bad)
    model.compile(optimizer="sgd", loss=mp.losses.SparseCategoricalCrossentropy(True),
                  jit_compile=False)
    with pytest.raises(TypeError, match="must return a dict of metric names"):
        model.fit(X, Y, batch_size=32, epochs=1, verbose=0)


def test_keras_optimizer_apply_unscales_under_loss_scaling() -> None:
    var = mp.Variable([1.0, 2.0])
    opt = mp.LossScaleOptimizer(mp.optimizers.SGD(0.5), loss_scale=1024)
    with mp.GradientTape() as tape:
        loss = opt.scale_loss(mp.ops.sum(var * var))
    grads = tape.gradient(loss, [var])
    opt.apply(grads, [var])
    np.testing.assert_allclose(var.numpy(), [0.0, 0.0])   # 1 - 0.5 * 2, 2 - 0.5 * 4
    with pytest.raises(ValueError, match="gradients for"):
        mp.optimizers.SGD().apply([None, None], [var])


class ComputeMetricsModel(mp.Model):
    """Keras 3's shorter step: compute_loss, the loss tracker, then compute_metrics (the
    compiled metrics and get_metrics_result)."""

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = mp.utils.unpack_x_y_sample_weight(data)
        with mp.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        self.metrics[0].update_state(loss)   # the loss tracker: the step's own, as in Keras 3
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def test_compute_metrics_and_get_metrics_result_as_keras_3() -> None:
    # both were AttributeErrors: Keras 3's Trainer has them
    runs = []
    for cls, jit in ((GuideModel, False), (ComputeMetricsModel, False),
                     (ComputeMetricsModel, True)):
        model = _model(cls)
        model.compile(optimizer=mp.optimizers.Adam(0.01),
                      loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=jit)
        history = model.fit(X, Y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        runs.append({k: v for k, v in history.history.items() if k != "time_per_sample"})
        results = model.get_metrics_result()
        assert set(results) == {"loss", "accuracy"}
        assert float(results["accuracy"]) == history.history["accuracy"][-1]
    assert runs[0] == runs[1] == runs[2]
