"""Models: the functional graph, Sequential, compile/fit/evaluate/predict, summary, errors, and
mixed_float16 overflow handling (skipped steps never touch the weights; training recovers)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

RNG = np.random.default_rng(3)
X = RNG.standard_normal((96, 8)).astype(np.float32)
Y = (X[:, :3].sum(axis=1) > 0).astype(np.int64) + 2 * (X[:, 3] > 0.5)


def guide_model(units: int = 16, dropout: float = 0.0) -> mp.Model:
    inputs = mp.Input(shape=(8,), name="digits")
    x = layers.Dense(units, activation="relu", name="dense_1")(inputs)
    if dropout:
        x = layers.Dropout(dropout)(x)
    x = layers.Dense(units, activation="relu", name="dense_2")(x)
    x = layers.Dense(4, name="dense_logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
    return mp.Model(inputs=inputs, outputs=outputs)


def test_functional_model_fit_evaluate_predict() -> None:
    mp.random.set_seed(0)
    model = guide_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.Adam(0.02),
                  metrics=["accuracy"])
    history = model.fit(X, Y, batch_size=16, epochs=10, validation_split=0.25, verbose=0)
    assert set(history.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(history.history["loss"]) == 10
    assert history.history["loss"][-1] < history.history["loss"][0]
    loss, acc = model.evaluate(X, Y, batch_size=32, verbose=0)
    assert acc > 0.6
    pred = model.predict(X, batch_size=40)
    assert pred.shape == (96, 4) and pred.dtype == np.float32
    np.testing.assert_allclose(pred.sum(axis=1), 1.0, rtol=1e-5)
    assert model.evaluate(X, Y, verbose=0, return_dict=True)["loss"] == pytest.approx(loss)


def test_sequential_variants_share_the_graph_machinery() -> None:
    mp.random.set_seed(1)
    a = mp.Sequential([mp.Input((8,)), layers.Dense(4, activation="relu"), layers.Dense(2)])
    assert len(a.weights) == 4 and a.outputs[0].shape == (None, 2)
    b = mp.Sequential([layers.Dense(4, input_shape=(8,)), layers.Dense(2)])
    assert len(b.weights) == 4
    c = mp.Sequential()
    c.add(layers.Dense(4))
    c.add(layers.Dense(2))
    assert c.weights == []  # not built until it sees data
    assert c(X[:3]).shape == (3, 2)
    assert len(c.weights) == 4
    c.compile(optimizer="sgd", loss="mse")
    c.fit(X, RNG.standard_normal((96, 2)).astype(np.float32), epochs=1, verbose=0)
    assert [type(x).__name__ for x in c.layers] == ["Dense", "Dense"]


def test_subclassed_model() -> None:
    class TwoLayers(mp.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = layers.Dense(6, activation="tanh")
            self.out = layers.Dense(4)

        def call(self, x, training=None):  # type: ignore[no-untyped-def]
            return self.out(self.hidden(x))

    model = TwoLayers()
    model.compile(optimizer=mp.optimizers.SGD(0.1),
                  loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, Y, epochs=2, verbose=0)
    assert len(model.trainable_variables) == 4


def test_summary_and_weights_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    model = guide_model()
    model.summary()
    text = capsys.readouterr().out
    assert "dense_1 (Dense)" in text and "(None, 16)" in text
    assert f"Total params: {8 * 16 + 16 + 16 * 16 + 16 + 16 * 4 + 4:,}" in text
    other = guide_model()
    other.set_weights(model.get_weights())
    np.testing.assert_array_equal(other.predict(X), model.predict(X))
    with pytest.raises(ValueError, match="has 6 weights"):
        other.set_weights(model.get_weights()[:2])
    with pytest.raises(ValueError, match=r"dense_1/kernel.*\(8, 16\)"):
        other.set_weights([np.zeros((3, 3)), *model.get_weights()[1:]])


def test_compile_wraps_only_mixed_float16() -> None:
    mp.set_global_policy("mixed_float16")
    model = guide_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="rmsprop")
    assert isinstance(model.optimizer, LossScaleOptimizer)
    assert isinstance(model.optimizer.loss_scale, mp.DynamicLossScale)
    other = guide_model()
    other.compile(loss="sparse_categorical_crossentropy", optimizer="rmsprop")
    assert other.optimizer.loss_scale is not model.optimizer.loss_scale
    mp.set_global_policy("mixed_bfloat16")
    bf = guide_model()
    bf.compile(loss="sparse_categorical_crossentropy", optimizer="rmsprop")
    assert type(bf.optimizer).__name__ == "RMSprop"
    mp.set_global_policy(mp.Policy("mixed_float16", loss_scale=None))
    none = guide_model()
    none.compile(loss="mse", optimizer="sgd")
    assert not isinstance(none.optimizer, LossScaleOptimizer)


def test_bad_input_errors() -> None:
    model = guide_model()
    with pytest.raises(ValueError, match=r"valid names:.*sparse_categorical_crossentropy"):
        model.compile(loss="sparse_xent", optimizer="adam")
    with pytest.raises(ValueError, match=r"valid names:.*rmsprop"):
        model.compile(loss="mse", optimizer="adamax")
    with pytest.raises(ValueError, match=r"valid names:.*accuracy"):
        model.compile(loss="mse", optimizer="adam", metrics=["precision@k"])
    with pytest.raises(RuntimeError, match="compiled"):
        model.fit(X, Y, verbose=0)
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
    with pytest.raises(ValueError, match=r"label 7.*\[0, 4\).*4 classes"):
        model.fit(X, np.where(Y == 0, 7, Y), verbose=0)
    with pytest.raises(ValueError, match="label -1"):
        model.evaluate(X, Y - 1, verbose=0)
    with pytest.raises(ValueError, match=r"input 'digits' expects shape \(None, 8\), got "
                                         r"\(5, 3\)"):
        model.predict(np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match="96 samples but y has 95"):
        model.fit(X, Y[:95], verbose=0)


def test_callbacks_early_stopping_and_lambda() -> None:
    model = guide_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(0.0))
    seen: list[int] = []
    stop = mp.callbacks.EarlyStopping(monitor="loss", patience=1)
    history = model.fit(X, Y, epochs=10, verbose=0, callbacks=[
        stop, mp.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(e))])
    assert stop.stopped_epoch is not None and len(history.history["loss"]) < 10
    assert seen == list(range(len(history.history["loss"])))


def test_fit_verbose_modes(capsys: pytest.CaptureFixture[str]) -> None:
    model = guide_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                  metrics=["accuracy"])
    model.fit(X, Y, epochs=1, verbose=2, validation_data=(X[:10], Y[:10]))
    out = capsys.readouterr().out
    assert "Epoch 1/1" in out and "us/sample" in out and "val_accuracy" in out
    model.fit(X, Y, epochs=1, verbose=1)     # stdout is no terminal here: the line only
    captured = capsys.readouterr()
    assert captured.out.startswith("Epoch 1/1 - ") and captured.out.count("\n") == 1
    assert "\r" not in captured.out and "loss:" in captured.out and not captured.err


def test_fit_verbose_1_draws_a_bar_on_a_terminal(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar runs during the epoch and goes at its end, and the epoch's line
    (all of its logs: a bar as wide as the terminal cut them) stays, on stdout as Keras."""
    model = guide_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                  metrics=["accuracy"])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    model.fit(X, Y, epochs=2, verbose=1, validation_data=(X[:10], Y[:10]))
    out = capsys.readouterr().out
    assert "\r" in out and "Epoch 2/2:" in out and "step/s" in out           # the bar
    lines = [line.split("\r")[-1] for line in out.split("\n") if "val_accuracy" in line]
    assert [line[:12] for line in lines] == ["Epoch 1/2 - ", "Epoch 2/2 - "]


def test_a_notebook_gets_tqdms_widget(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a notebook tqdm.auto's class subclasses tqdm.notebook's (its own module is
    tqdm.auto), and stdout is no terminal there: the bar is still drawn."""
    import tqdm.auto
    import tqdm.notebook

    from mpcore.models import progress

    made: list[dict[str, object]] = []

    class NotebookBar(tqdm.notebook.tqdm):      # what tqdm.auto gives in a notebook
        def __init__(self, **kwargs: object) -> None:
            made.append(kwargs)

        def __del__(self) -> None:
            pass

    NotebookBar.__module__ = "tqdm.auto"
    monkeypatch.setattr(tqdm.auto, "tqdm", NotebookBar)
    assert progress.progress_bar(0, 1, 3) is not None and made[0]["total"] == 3


# --- overflow under mixed_float16 --------------------------------------------------------------
def _mixed_model(seed: int) -> mp.Model:
    mp.set_global_policy("mixed_float16")
    mp.random.set_seed(seed)
    model = guide_model(units=32)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(0.05))
    return model


def test_weights_multiplied_into_overflow_skip_steps_then_recover() -> None:
    model = _mixed_model(4)
    # Forward stays finite in float16; gradients times the 2**15 loss scale overflow.
    model.set_weights([w * 8.0 for w in model.get_weights()])
    opt = model.optimizer
    losses, skipped_before = [], []
    for _ in range(40):
        before = model.get_weights()
        skipped_before.append(opt.skipped_steps)
        losses.append(model.train_on_batch(X[:32], Y[:32]))
        if opt.skipped_steps > skipped_before[-1]:  # this step was skipped
            for a, b in zip(before, model.get_weights()):
                np.testing.assert_array_equal(a, b)
    assert opt.skipped_steps >= 1
    assert opt.loss_scale() < 2**15
    assert opt.iterations == 40 - opt.skipped_steps      # Keras 3 counts applied steps only
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0]


def test_batch_with_inf_is_skipped_and_training_continues() -> None:
    model = _mixed_model(5)
    bad = X[:32].copy()
    bad[3, 2] = np.inf
    model.train_on_batch(X[:32], Y[:32])
    before = model.get_weights()
    model.train_on_batch(bad, Y[:32])
    assert model.optimizer.skipped_steps == 1
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    first = model.train_on_batch(X[:32], Y[:32])
    for _ in range(30):
        last = model.train_on_batch(X[:32], Y[:32])
    assert model.optimizer.skipped_steps == 1 and last < first
