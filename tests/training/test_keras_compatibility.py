"""Where the Keras-style API used to surprise a Keras user or fail late (issue 15, items 11-13):
training on no rows, live views handed out as values, inputs matched by name, and arguments
checked before any work with errors that name the argument and its valid values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(11)
X = RNG.standard_normal((24, 4)).astype(np.float32)
Y = RNG.integers(0, 3, 24)


def _classifier(seed: int = 0, optimizer: Any = "sgd") -> mp.Model:
    mp.random.set_seed(seed)
    model = mp.Sequential([mp.Input(shape=(4,)), layers.Dense(5, activation="relu"),
                           layers.Dense(3, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer,
                  metrics=["accuracy"])
    return model


class _Join(layers.Layer):
    """Concatenates its inputs along the last axis (mpcore has no merge layers yet)."""

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        return mp.ops.concat(list(inputs), axis=-1)


def _two_inputs(seed: int = 0) -> mp.Model:
    mp.random.set_seed(seed)
    a = mp.Input(shape=(4,), name="a")
    b = mp.Input(shape=(2,), name="b")
    h = _Join()([layers.Dense(3, name="from_a")(a), b])
    model = mp.Model(inputs=[a, b], outputs=layers.Dense(3, activation="softmax")(h))
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    return model


def _untouched(model: mp.Model, before: list[np.ndarray]) -> bool:
    return model.optimizer.iterations == 0 and all(
        np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


# --- item 11: no rows ------------------------------------------------------------------------
def test_on_batch_entry_points_on_no_rows_raise_like_fit_and_evaluate() -> None:
    """train_on_batch on 0 rows used to return [0.0, 0.0] with a NumPy warning."""
    model = _classifier()
    before = model.get_weights()
    with pytest.raises(ValueError, match="train_on_batch got no samples"):
        model.train_on_batch(X[:0], Y[:0])
    assert _untouched(model, before)
    with pytest.raises(ValueError, match="test_on_batch got no samples"):
        model.test_on_batch(X[:0], Y[:0])
    with pytest.raises(ValueError, match="predict_on_batch got no samples"):
        model.predict_on_batch(X[:0])
    with pytest.raises(ValueError, match="fit got no training samples"):
        model.fit(X[:0], Y[:0], verbose=0)


def test_on_batch_entry_points_check_the_sample_counts() -> None:
    model = _classifier()
    with pytest.raises(ValueError, match="x has 8 samples but y has 7"):
        model.train_on_batch(X[:8], Y[:7])
    with pytest.raises(ValueError, match="x has 8 samples but y has 7"):
        model.test_on_batch(X[:8], Y[:7])


def test_test_on_batch_scores_one_batch_as_evaluate_does() -> None:
    model = _classifier()
    model.train_on_batch(X, Y)
    assert model.test_on_batch(X[:10], Y[:10]) == pytest.approx(
        model.evaluate(X[:10], Y[:10], verbose=0), rel=1e-6)
    logs = model.test_on_batch(X[:10], Y[:10], return_dict=True)
    assert set(logs) == {"loss", "accuracy"}


# --- item 12: values are copies, inputs match by name -----------------------------------------
@pytest.mark.parametrize("fused", [True, False])
def test_a_saved_variable_value_does_not_change_with_training(fused: bool) -> None:
    """Variable.numpy() used to be a read-only view that the next in-place update changed."""
    var = mp.Variable([1.0, 2.0])
    saved, snapshot = var.numpy(), var.value()
    opt = mp.optimizers.SGD(0.5)
    opt.use_fused_kernels = fused
    opt.apply_gradients([(mp.constant([1.0, 1.0]), var)])
    assert saved.tolist() == [1.0, 2.0] and snapshot.numpy().tolist() == [1.0, 2.0]
    assert var.numpy().tolist() == [0.5, 1.5]
    saved[0] = 9.0  # a copy the caller owns, as Keras/TF hand out
    assert var.numpy().tolist() == [0.5, 1.5]


@pytest.mark.parametrize("convert", [mp.constant, mp.convert_to_tensor])
def test_a_constant_made_from_a_variable_is_a_snapshot(convert) -> None:
    """mp.constant(variable) used to share the variable's array: in-place updates showed
    through the "constant" (tf.constant(variable) reads the value once)."""
    var = mp.Variable([1.0, 2.0])
    frozen = convert(var)
    mp.optimizers.SGD(0.5).apply_gradients([(mp.constant([1.0, 1.0]), var)])
    assert var.numpy().tolist() == [0.5, 1.5]
    assert frozen.numpy().tolist() == [1.0, 2.0]
    assert type(frozen) is mp.Tensor


def test_get_weights_are_writable_copies() -> None:
    model = _classifier()
    weights = model.get_weights()
    kept = [w.copy() for w in weights]
    assert all(w.flags.writeable for w in weights)
    weights[0] += 1.0  # Keras users edit them in place before set_weights
    model.fit(X, Y, epochs=1, verbose=0)
    np.testing.assert_array_equal(weights[1], kept[1])  # training did not show through
    model.set_weights(weights)
    np.testing.assert_array_equal(model.get_weights()[0], kept[0] + 1.0)


def test_fit_takes_a_dict_of_inputs_by_name_in_any_order() -> None:
    xa, xb = X, RNG.standard_normal((24, 2)).astype(np.float32)
    by_list = _two_inputs().fit([xa, xb], Y, epochs=2, shuffle=False, verbose=0)
    by_name = _two_inputs().fit({"b": xb, "a": xa}, Y, epochs=2, shuffle=False, verbose=0)
    assert by_name.history["loss"] == pytest.approx(by_list.history["loss"], rel=1e-6)
    model = _two_inputs()
    np.testing.assert_array_equal(model.predict({"b": xb, "a": xa}), model.predict([xa, xb]))
    np.testing.assert_array_equal(model({"b": xb, "a": xa}).numpy(),
                                  model([xa, xb]).numpy())


@pytest.mark.parametrize("entry", ["fit", "evaluate", "predict", "train_on_batch",
                                   "test_on_batch", "predict_on_batch", "call"])
def test_unknown_or_missing_input_names_are_rejected_naming_the_inputs(entry: str) -> None:
    """fit({"nope": X}, Y) used to be accepted: a dict was matched by position."""
    model = _two_inputs()
    before = model.get_weights()
    xb = np.zeros((24, 2), np.float32)
    for data, problem in (({"nope": X, "b": xb}, r"unknown 'nope' and missing 'a'"),
                          ({"a": X}, r"missing 'b'"),
                          ({"a": X, "b": xb, "c": xb}, r"unknown 'c'")):
        args = (data,) if entry in ("predict", "predict_on_batch", "call") else (data, Y)
        with pytest.raises(ValueError, match=rf"inputs named 'a', 'b'; the data has {problem}"):
            if entry == "call":
                model(data)
            else:
                getattr(model, entry)(*args, **({"verbose": 0} if "_" not in entry else {}))
    assert _untouched(model, before)


def test_a_single_input_model_takes_a_dict_keyed_by_the_input_name() -> None:
    model = mp.Sequential([mp.Input(shape=(4,), name="pixels"), layers.Dense(3)])
    np.testing.assert_array_equal(model.predict({"pixels": X}), model.predict(X))
    with pytest.raises(ValueError, match="inputs named 'pixels'; the data has unknown 'x'"):
        model.predict({"x": X})


def test_a_dict_of_inputs_matches_by_its_keys() -> None:
    a, b = mp.Input(shape=(4,), name="input_a"), mp.Input(shape=(2,), name="input_b")
    out = layers.Dense(2)(_Join()([a, b]))
    model = mp.Model(inputs={"left": a, "right": b}, outputs=out)
    xb = np.ones((24, 2), np.float32)
    np.testing.assert_array_equal(model.predict({"right": xb, "left": X}),
                                  model.predict({"left": X, "right": xb}))
    with pytest.raises(ValueError, match="inputs named 'left', 'right'"):
        model.predict({"input_a": X, "input_b": xb})


def test_predict_returns_writable_arrays_the_caller_owns() -> None:
    """As Keras: predictions can be edited in place (post-processing, thresholds)."""
    model = mp.Sequential([mp.Input(shape=(4,)), layers.Activation("linear")])
    for pred in (model.predict(X), model.predict_on_batch(X)):
        assert pred.flags.writeable
        pred[:] = 0.0
        assert np.abs(model.predict(X)).sum() > 0  # neither the model nor X changed
    np.testing.assert_array_equal(model.predict(X), X)


def test_summary_lines_have_the_asked_length() -> None:
    """line_length used to be ignored."""
    model = _classifier()
    for width in (72, 120):
        lines: list[str] = []
        model.summary(print_fn=lines.append, line_length=width)
        assert {len(line) for line in lines if set(line) <= {"_", "="}} == {width}
        assert max(len(line) for line in lines) <= width
    with pytest.raises(ValueError, match="line_length must be an integer >= 72, got 40"):
        model.summary(line_length=40)
