"""sample_weight and class_weight in fit and evaluate, with Keras 3's semantics: the loss is
``sum(w * loss) / batch_size`` (``reduction="sum_over_batch_size"``), the compiled
``metrics`` are not weighted (Keras 3 weights only ``weighted_metrics``), class_weight is the
matching per-sample weights; traced steps equal eager ones bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(23)
X = RNG.random((64, 8), dtype=np.float32)
Y = RNG.integers(0, 3, 64).astype(np.int32)
W = RNG.random(64).astype(np.float32) * 2.0


def _model(seed: int = 5, jit_compile: bool | str = "auto", policy: str = "float32",
           metrics: list[str] | None = None) -> mp.Model:
    mp.set_global_policy(policy)
    try:
        mp.random.set_seed(seed)
        inputs = mp.Input((8,))
        x = layers.Dense(16, activation="relu")(inputs)
        x = layers.Dense(3)(x)
        model = mp.Model(inputs, layers.Activation("softmax", dtype="float32")(x))
    finally:
        mp.set_global_policy(None)
    model.compile(optimizer=mp.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=metrics, jit_compile=jit_compile)
    return model


def _same_weights(a: mp.Model, b: mp.Model) -> None:
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)


def _per_sample_losses(model: mp.Model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    loss = mp.losses.SparseCategoricalCrossentropy(reduction="none")
    return np.asarray(loss(y, model.predict(x)))


@pytest.mark.parametrize("jit_compile", [True, False])
def test_all_ones_equals_no_sample_weight(jit_compile: bool) -> None:
    plain, ones = _model(jit_compile=jit_compile), _model(jit_compile=jit_compile)
    a = plain.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    b = ones.fit(X, Y, sample_weight=np.ones(64, np.float32), batch_size=16, epochs=2,
                 shuffle=False, verbose=0)
    _same_weights(plain, ones)
    assert a.history["loss"] == b.history["loss"]


def test_the_weighted_loss_is_keras_sum_over_batch_size() -> None:
    model = _model()
    w = W.copy()
    w[[3, 10]] = 0.0
    per_sample = _per_sample_losses(model, X, Y)
    got = model.evaluate(X, Y, sample_weight=w, batch_size=64, verbose=0)
    # Keras 3: sum(w * loss) / batch_size (a zero weight drops the sample from the sum, not
    # from the count)
    assert got == pytest.approx(float(np.sum(w * per_sample) / 64), rel=1e-5)
    # batches of 16: the loss tracker averages the batches' losses weighted by their size
    by_batch = [np.sum(w[i:i + 16] * per_sample[i:i + 16]) / 16 for i in range(0, 64, 16)]
    assert model.evaluate(X, Y, sample_weight=w, batch_size=16, verbose=0) == pytest.approx(
        float(np.mean(by_batch)), rel=1e-5)


def test_a_zero_weight_drops_the_sample_from_the_gradient() -> None:
    # one step on 4 samples, sample 2 weighted 0 == one step on the other 3 with weights 3/4
    # (the same sum(w * loss) / 4)
    zero, dropped = _model(), _model()
    keep = np.array([0, 1, 3])
    zero.fit(X[:4], Y[:4], sample_weight=np.array([1, 1, 0, 1], np.float32), batch_size=4,
             shuffle=False, verbose=0)
    dropped.fit(X[keep], Y[keep], sample_weight=np.full(3, 0.75, np.float32), batch_size=3,
                shuffle=False, verbose=0)
    for a, b in zip(zero.get_weights(), dropped.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_traced_equals_eager_bit_for_bit_with_sample_weight(policy: str) -> None:
    traced, eager = _model(jit_compile=True, policy=policy), _model(jit_compile=False,
                                                                    policy=policy)
    a = traced.fit(X, Y, sample_weight=W, batch_size=16, epochs=2, shuffle=False, verbose=0)
    b = eager.fit(X, Y, sample_weight=W, batch_size=16, epochs=2, shuffle=False, verbose=0)
    _same_weights(traced, eager)
    assert a.history["loss"] == b.history["loss"]
    assert traced.evaluate(X, Y, sample_weight=W, verbose=0) == eager.evaluate(
        X, Y, sample_weight=W, verbose=0)


def test_with_and_without_sample_weight_are_two_signatures() -> None:
    model = _model(jit_compile=True)
    model.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    step = model.train_function
    assert step.tracing_count == 1
    model.fit(X, Y, sample_weight=W, batch_size=16, shuffle=False, verbose=0)
    assert model.train_function is step and step.tracing_count == 2
    model.fit(X, Y, sample_weight=W * 2, batch_size=16, shuffle=False, verbose=0)
    model.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    assert step.tracing_count == 2    # both replayed


def test_class_weight_equals_the_matching_sample_weight() -> None:
    class_weight = {0: 0.5, 1: 2.0}    # class 2 not given: weight 1, as Keras
    matching = np.array([class_weight.get(int(c), 1.0) for c in Y], np.float32)
    by_class, by_sample = _model(), _model()
    mp.random.set_seed(9)      # the same shuffles for both
    a = by_class.fit(X, Y, class_weight=class_weight, batch_size=16, epochs=2, verbose=0)
    mp.random.set_seed(9)
    b = by_sample.fit(X, Y, sample_weight=matching, batch_size=16, epochs=2, verbose=0)
    _same_weights(by_class, by_sample)
    assert a.history["loss"] == b.history["loss"]
    # one-hot labels: the class is the argmax (Keras 3's class_weight_to_sample_weights)
    one_hot = _model()
    one_hot.compile(optimizer=mp.optimizers.SGD(0.1), loss="categorical_crossentropy")
    reference = _model()
    reference.compile(optimizer=mp.optimizers.SGD(0.1), loss="categorical_crossentropy")
    y_hot = np.eye(3, dtype=np.float32)[Y]
    one_hot.fit(X, y_hot, class_weight=class_weight, batch_size=16, shuffle=False, verbose=0)
    reference.fit(X, y_hot, sample_weight=matching, batch_size=16, shuffle=False, verbose=0)
    _same_weights(one_hot, reference)


def test_compiled_metrics_are_not_weighted_as_keras_3() -> None:
    model = _model(metrics=["accuracy"])
    plain = model.evaluate(X, Y, verbose=0, return_dict=True)
    weighted = model.evaluate(X, Y, sample_weight=np.zeros(64, np.float32), verbose=0,
                              return_dict=True)
    assert weighted["loss"] == 0.0
    assert weighted["accuracy"] == plain["accuracy"]


def test_sample_weight_goes_with_validation_split_and_validation_data() -> None:
    model = _model()
    history = model.fit(X, Y, sample_weight=W, validation_split=0.25, batch_size=16,
                        verbose=0)
    # the held-out quarter keeps its weights
    assert history.history["val_loss"][0] == pytest.approx(
        model.evaluate(X[48:], Y[48:], sample_weight=W[48:], batch_size=16, verbose=0),
        rel=1e-6)
    history = model.fit(X[:48], Y[:48], validation_data=(X[48:], Y[48:], W[48:]),
                        batch_size=16, verbose=0)
    assert history.history["val_loss"][0] == pytest.approx(
        model.evaluate(X[48:], Y[48:], sample_weight=W[48:], batch_size=16, verbose=0),
        rel=1e-6)


def test_multi_output_sample_weights() -> None:
    mp.random.set_seed(2)
    inputs = mp.Input((8,))
    a = layers.Dense(3, activation="softmax", name="a")(inputs)
    b = layers.Dense(3, activation="softmax", name="b")(inputs)
    model = mp.Model(inputs, [a, b])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    one = model.evaluate(X, [Y, Y], sample_weight=W, batch_size=64, verbose=0,
                         return_dict=True)
    per_output = model.evaluate(X, [Y, Y], sample_weight=[W, np.ones(64, np.float32)],
                                batch_size=64, verbose=0, return_dict=True)
    assert per_output["a_loss"] == one["a_loss"]           # W on output a both times
    plain = model.evaluate(X, [Y, Y], batch_size=64, verbose=0, return_dict=True)
    assert per_output["b_loss"] == pytest.approx(plain["b_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="only supported for Models with a single output"):
        model.fit(X, [Y, Y], class_weight={0: 1.0}, verbose=0)


def test_bad_weights_are_one_clear_error() -> None:
    model = _model()
    with pytest.raises(ValueError, match="x has 64 samples but sample_weight has 10"):
        model.fit(X, Y, sample_weight=np.ones(10), verbose=0)
    with pytest.raises(ValueError, match="class_weight` and `sample_weight` at the same"):
        model.fit(X, Y, sample_weight=W, class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="class_weight must be a dict"):
        model.fit(X, Y, class_weight=[1.0, 2.0], verbose=0)
    with pytest.raises(ValueError, match="integer keys"):
        model.fit(X, Y, class_weight={"cat": 1.0}, verbose=0)


def test_custom_train_step_gets_the_sample_weight() -> None:
    seen: list[bool] = []

    class Custom(mp.Model):
        def train_step(self, data: object) -> dict[str, float]:
            _, _, sw = mp.utils.unpack_x_y_sample_weight(data)
            seen.append(sw is not None)
            return super().train_step(data)

    mp.random.set_seed(5)
    inputs = mp.Input((8,))
    x = layers.Dense(16, activation="relu")(inputs)
    x = layers.Dense(3)(x)
    model = Custom(inputs, layers.Activation("softmax", dtype="float32")(x))
    model.compile(optimizer=mp.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  jit_compile=False)
    model.fit(X, Y, sample_weight=W, batch_size=16, shuffle=False, verbose=0)
    reference = _model(jit_compile=False)
    reference.fit(X, Y, sample_weight=W, batch_size=16, shuffle=False, verbose=0)
    assert seen == [True] * 4
    _same_weights(model, reference)


def test_on_batch_methods_take_weights() -> None:
    model, reference = _model(), _model()
    matching = np.array([{0: 3.0}.get(int(c), 1.0) for c in Y[:16]], np.float32)
    a = model.train_on_batch(X[:16], Y[:16], class_weight={0: 3.0})
    b = reference.train_on_batch(X[:16], Y[:16], sample_weight=matching)
    assert a == b
    _same_weights(model, reference)
    assert model.test_on_batch(X[:16], Y[:16], sample_weight=np.zeros(16)) == 0.0


def test_per_sample_weights_spread_over_a_sequence_and_float64_weights() -> None:
    loss = mp.losses.SparseCategoricalCrossentropy()
    rng = np.random.default_rng(1)
    y_pred = rng.random((4, 5, 3)).astype(np.float32) + 0.1
    y_pred /= y_pred.sum(-1, keepdims=True)
    y_true = rng.integers(0, 3, (4, 5))
    w = np.array([1.0, 0.0, 2.0, 0.5])                    # float64, one per sequence
    per_element = np.asarray(mp.losses.SparseCategoricalCrossentropy(reduction="none")(
        y_true, y_pred))
    got = loss(y_true, y_pred, sample_weight=w)
    assert got.dtype == "float32"
    np.testing.assert_allclose(float(got), np.sum(w[:, None] * per_element) / 20, rtol=1e-6)
    with pytest.raises(ValueError, match="does not fit losses of shape"):
        loss(y_true, y_pred, sample_weight=np.ones(3))


@pytest.mark.parametrize("target_encoding", ["int", "categorical"])
def test_class_weights_keras(target_encoding: str) -> None:
    # ported from keras/src/trainers/data_adapters/array_data_adapter_test.py::
    # test_class_weights
    from mpcore.models.data_adapters.host_batches import class_weight_to_sample_weights

    if target_encoding == "int":
        y = np.array([[0], [1], [2], [3]], dtype="int32")
    else:
        y = np.eye(4, dtype="float32")
    class_weight = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}
    np.testing.assert_allclose(class_weight_to_sample_weights(y, class_weight),
                               [0.1, 0.2, 0.3, 0.4])


def test_class_weight_leaves_the_validation_split_unweighted_as_keras_3() -> None:
    model = _model()
    history = model.fit(X, Y, class_weight={0: 5.0}, validation_split=0.25, batch_size=16,
                        verbose=0)
    assert history.history["val_loss"][0] == pytest.approx(
        model.evaluate(X[48:], Y[48:], batch_size=16, verbose=0), rel=1e-6)


def test_labels_and_weights_as_lists_of_numpy_scalars() -> None:
    # list(array) holds NumPy scalars (np.float32 is no Python float): each was taken as an
    # input of its own, "x has 64 samples but sample_weight has 0"
    listed, arrays = _model(), _model()
    listed.fit(X, list(Y), sample_weight=list(W), batch_size=16, epochs=1, shuffle=False,
               verbose=0)
    arrays.fit(X, Y, sample_weight=W, batch_size=16, epochs=1, shuffle=False, verbose=0)
    _same_weights(listed, arrays)
    assert listed.evaluate(X, list(Y), sample_weight=list(W), verbose=0) == \
        arrays.evaluate(X, Y, sample_weight=W, verbose=0)
