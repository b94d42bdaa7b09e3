"""mpcore -> .keras -> mpcore: every layer, Sequential, functional and subclassed models give
the same predictions bit for bit and the same configs; a loaded model continues training
exactly as the uninterrupted run; ``.weights.h5`` files.

Cases ported from Keras 3's ``keras/src/saving/saving_lib_test.py``
(``test_saved_model_with_custom_model`` / ``test_load_model_api`` style round trips,
``test_compile_overridden_warnings`` not applicable) and
``keras/src/models/functional_test.py`` (``test_functional_config``-style round trips).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpcore as mp

L = mp.layers
RNG = np.random.default_rng(7)


def _randomize(model: mp.Model) -> None:
    """Weights away from their initial values (so a load that kept them would show)."""
    model.set_weights([RNG.normal(size=w.shape).astype(w.dtype) if w.dtype.kind == "f"
                       else w for w in model.get_weights()])


def _one_layer(layer: Callable[[], Any], shape: tuple[int, ...], dtype: str = "float32",
               inputs: int = 1) -> tuple[mp.Model, Any]:
    ins = [mp.Input(shape, dtype=dtype) for _ in range(inputs)]
    made = layer()
    if isinstance(made, mp.layers.MultiHeadAttention):
        out = made(ins[0], ins[0])
    else:
        out = made(ins if inputs > 1 else ins[0])
    model = mp.Model(ins if inputs > 1 else ins[0], out)
    if dtype.startswith("int"):
        x = RNG.integers(0, 10, size=(3, *shape)).astype(dtype)
    else:
        x = RNG.normal(size=(3, *shape)).astype(dtype)
    return model, [x] * inputs if inputs > 1 else x


LAYERS: dict[str, tuple[Callable[[], Any], tuple[int, ...], str, int]] = {
    "Dense": (lambda: L.Dense(3, activation="tanh", use_bias=True), (4,), "float32", 1),
    "Conv2D": (lambda: L.Conv2D(2, (3, 2), strides=(1, 2), padding="same",
                                activation="relu"), (6, 6, 3), "float32", 1),
    "MaxPooling2D": (lambda: L.MaxPooling2D((2, 2), strides=1), (5, 5, 2), "float32", 1),
    "AveragePooling2D": (lambda: L.AveragePooling2D(2, padding="same"), (5, 5, 2),
                         "float32", 1),
    "GlobalAveragePooling1D": (lambda: L.GlobalAveragePooling1D(), (4, 3), "float32", 1),
    "GlobalAveragePooling2D": (lambda: L.GlobalAveragePooling2D(keepdims=True), (4, 4, 3),
                               "float32", 1),
    "GlobalMaxPooling1D": (lambda: L.GlobalMaxPooling1D(), (4, 3), "float32", 1),
    "GlobalMaxPooling2D": (lambda: L.GlobalMaxPooling2D(), (4, 4, 3), "float32", 1),
    "Flatten": (lambda: L.Flatten(), (2, 3, 2), "float32", 1),
    "Dropout": (lambda: L.Dropout(0.4, seed=3), (5,), "float32", 1),
    "Activation": (lambda: L.Activation("sigmoid"), (5,), "float32", 1),
    "BatchNormalization": (lambda: L.BatchNormalization(momentum=0.9, epsilon=1e-2), (6,),
                           "float32", 1),
    "LayerNormalization": (lambda: L.LayerNormalization(epsilon=1e-4), (3, 6), "float32", 1),
    "Embedding": (lambda: L.Embedding(10, 4), (5,), "int32", 1),
    "Add": (lambda: L.Add(), (4,), "float32", 2),
    "Subtract": (lambda: L.Subtract(), (4,), "float32", 2),
    "Multiply": (lambda: L.Multiply(), (4,), "float32", 2),
    "Average": (lambda: L.Average(), (4,), "float32", 2),
    "Maximum": (lambda: L.Maximum(), (4,), "float32", 2),
    "Minimum": (lambda: L.Minimum(), (4,), "float32", 2),
    "Concatenate": (lambda: L.Concatenate(axis=1), (4,), "float32", 2),
    "MultiHeadAttention": (lambda: L.MultiHeadAttention(2, 3, value_dim=4,
                                                        output_shape=5), (4, 6), "float32", 1),
    "Reshape": (lambda: L.Reshape((3, 4)), (12,), "float32", 1),
    "Permute": (lambda: L.Permute((2, 1)), (3, 4), "float32", 1),
    "Softmax": (lambda: L.Softmax(axis=1), (3, 4), "float32", 1),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_layer_round_trips(name: str, tmp_path) -> None:
    make, shape, dtype, inputs = LAYERS[name]
    model, x = _one_layer(make, shape, dtype, inputs)
    _randomize(model)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = mp.models.load_model(path)
    np.testing.assert_array_equal(np.asarray(loaded.predict(x, verbose=0)),
                                  np.asarray(model.predict(x, verbose=0)))
    mine = next(lyr for lyr in model.layers if type(lyr).__name__ == name)
    theirs = next(lyr for lyr in loaded.layers if type(lyr).__name__ == name)
    assert theirs.get_config() == mine.get_config()
    for a, b in zip(mine.weights, theirs.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_input_layer_round_trips(tmp_path) -> None:
    inp = mp.Input((3, 2), batch_size=4, dtype="float16", name="pixels")
    model = mp.Model(inp, L.Flatten()(inp))
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras").layers[0]
    assert isinstance(loaded, L.InputLayer)
    assert (loaded.batch_shape, loaded.input_dtype, loaded.name) == ((4, 3, 2), "float16",
                                                                      "pixels")


def _branching() -> mp.Model:
    """Two Dense layers of the same class whose Keras order (by depth) is not mpcore's call
    order: their weights must not swap."""
    inp = mp.Input((4,), name="x")
    deep = L.Dense(3, name="deep_b")(L.Dense(3, name="deep_a")(inp))
    shallow = L.Dense(3, name="shallow")(inp)
    merged = L.Concatenate(name="cat")([deep, shallow])
    return mp.Model(inp, L.Dense(2, name="out")(merged))


def test_functional_and_sequential_round_trip(tmp_path) -> None:
    seq = mp.Sequential([L.Dense(5, input_shape=(4,), activation="relu"),
                         L.BatchNormalization(), L.Dense(2)], name="seq")
    for model in (_branching(), seq):
        _randomize(model)
        x = RNG.normal(size=(3, 4)).astype("float32")
        model.save(tmp_path / "m.keras")
        loaded = mp.models.load_model(tmp_path / "m.keras")
        assert type(loaded) is type(model) and loaded.name == model.name
        assert [lyr.name for lyr in loaded.layers] == [lyr.name for lyr in model.layers]
        np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
        assert loaded.get_config() == model.get_config()


def test_model_config_round_trip_without_weights() -> None:
    """``Model.from_config(model.get_config())`` (Keras' functional_test round trip)."""
    model = _branching()
    clone = mp.Model.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert [w.shape for w in clone.weights] == [w.shape for w in model.weights]


@mp.saving.register_keras_serializable(package="RoundTrip")
class Scaled(mp.Model):
    """A subclassed model with its own get_config (saving_lib_test's CustomModel)."""

    def __init__(self, units: int = 3, factor: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.factor = units, factor
        self.dense = L.Dense(units)
        self.norm = L.LayerNormalization()

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        return self.norm(self.dense(inputs)) * self.factor

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "factor": self.factor}


def test_subclassed_model_round_trips(tmp_path) -> None:
    model = Scaled(units=4, factor=0.5, name="scaled")
    x = RNG.normal(size=(2, 3)).astype("float32")
    model(x)
    _randomize(model)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, RNG.normal(size=(2, 4)).astype("float32"), epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, Scaled) and (loaded.units, loaded.factor) == (4, 0.5)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.optimizer.iterations == model.optimizer.iterations == 2


def _trainable(policy: str, optimizer: Callable[[], Any]) -> tuple[mp.Model, Any, Any]:
    mp.set_global_policy(policy)
    try:
        mp.random.set_seed(11)
        inp = mp.Input((6,))
        h = L.BatchNormalization()(L.Dense(8, activation="relu")(inp))
        out = L.Activation("softmax", dtype="float32")(L.Dense(3)(h))
        model = mp.Model(inp, out)
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    finally:
        mp.set_global_policy("float32")
    rng = np.random.default_rng(3)
    return (model, rng.normal(size=(32, 6)).astype("float32"),
            rng.integers(0, 3, size=(32,)))


@pytest.mark.parametrize(("policy", "optimizer"), [
    ("float32", lambda: mp.optimizers.Adam(0.01)),
    ("float32", lambda: mp.optimizers.SGD(0.05, momentum=0.9, nesterov=True)),
    ("float32", lambda: mp.optimizers.RMSprop(0.01, momentum=0.5)),
    ("mixed_float16", lambda: mp.optimizers.Adam(0.01)),
    ("mixed_float16", lambda: mp.LossScaleOptimizer(mp.optimizers.SGD(0.1), 256.0)),
    # saved after 8 micro-steps of 3: two updates and two gradients summed, pending
    ("float32", lambda: mp.optimizers.Adam(0.01, gradient_accumulation_steps=3)),
    ("mixed_float16", lambda: mp.optimizers.SGD(0.1, momentum=0.9,
                                                 gradient_accumulation_steps=3)),
])
def test_loaded_model_continues_as_uninterrupted(policy: str, optimizer: Callable[[], Any],
                                                 tmp_path) -> None:
    """Save after two epochs, load, train two more: the weights, the optimizer's step and
    the loss scale end where four uninterrupted epochs end, bit for bit."""
    whole, x, y = _trainable(policy, optimizer)
    whole.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)
    first, x, y = _trainable(policy, optimizer)
    first.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    first.save(tmp_path / "m.keras")
    resumed = mp.models.load_model(tmp_path / "m.keras")
    assert type(resumed.optimizer) is type(whole.optimizer)
    resumed.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    for a, b in zip(resumed.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(a, b)
    accumulation = getattr(whole.optimizer, "inner_optimizer", whole.optimizer)
    steps = accumulation.gradient_accumulation_steps or 1
    assert resumed.optimizer.iterations == whole.optimizer.iterations == 16 // steps
    if isinstance(whole.optimizer, mp.LossScaleOptimizer):
        assert resumed.optimizer.loss_scale == whole.optimizer.loss_scale
        assert resumed.optimizer.loss_scale.state_dict() == whole.optimizer.loss_scale.state_dict()


def test_dynamic_loss_scale_state_round_trips(tmp_path) -> None:
    model, x, y = _trainable("mixed_float16", lambda: mp.optimizers.Adam(0.01))
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    scale = model.optimizer.loss_scale
    scale.load_state_dict({"current_loss_scale": 512.0, "num_good_steps": 7})
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras").optimizer.loss_scale
    assert loaded.state_dict() == {"current_loss_scale": 512.0, "num_good_steps": 7}


def test_weights_h5_round_trip(tmp_path) -> None:
    """``.weights.h5`` is Keras' h5 layout (with the optimizer's state); other suffixes keep
    mpcore's own format."""
    model, x, y = _trainable("float32", lambda: mp.optimizers.Adam(0.01))
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    model.save_weights(tmp_path / "m.weights.h5")
    other, _, _ = _trainable("float32", lambda: mp.optimizers.Adam(0.01))
    other.load_weights(tmp_path / "m.weights.h5")
    for a, b in zip(other.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert other.optimizer.iterations == model.optimizer.iterations
    model.save_weights(str(tmp_path / "m.weights"))          # mpcore's own format
    with open(tmp_path / "m.weights", "rb") as f:
        assert f.read(6) == b"mpcore"


def test_load_model_compile_false(tmp_path) -> None:
    model, x, _ = _trainable("float32", lambda: mp.optimizers.Adam(0.01))
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras", compile=False)
    assert loaded.optimizer is None
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_save_model_and_saving_module_agree(tmp_path) -> None:
    model = _branching()
    mp.models.save_model(model, tmp_path / "a.keras")
    mp.saving.save_model(model, tmp_path / "b.keras")
    a = mp.saving.load_model(tmp_path / "a.keras")
    b = mp.models.load_model(tmp_path / "b.keras")
    assert a.get_config() == b.get_config()


def test_operators_on_symbolic_tensors_round_trip(tmp_path) -> None:
    """``x + y``, ``x * 0.5``, ``2.0 - x``, ``-x``, ``x[:, -1]``, ``x ** 2``: Keras'
    operations in the config, mpcore's operator layers again after loading."""
    a, b = mp.Input((4, 3)), mp.Input((4, 3))
    y = -(2.0 - (a + b) * 0.5)
    y = L.Dense(2)((y[:, -1] / 3.0) ** 2.0)
    model = mp.Model([a, b], y)
    x = [RNG.normal(size=(2, 4, 3)).astype("float32") for _ in range(2)]
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.get_config() == model.get_config()
    classes = [lyr["class_name"] for lyr in model.get_config()["layers"]]
    assert classes == ["InputLayer", "InputLayer", "Add", "Multiply", "Subtract", "Negative",
                       "GetItem", "TrueDivide", "Power", "Dense"]


def _sub_model(out_size: int, name: str) -> mp.Model:
    inputs = mp.Input((4,))
    return mp.Model(inputs, L.Dense(out_size)(inputs), name=name)


def nested_models() -> tuple[mp.Model, mp.Model]:
    """Keras 3's saving_lib_test ``test_nested_functional_model_saving`` and
    ``test_nested_shared_functional_model_saving`` models."""
    a, b = mp.Input((4,)), mp.Input((4,))
    nested = mp.Model([a, b], [_sub_model(2, "func_a")(a), _sub_model(3, "func_b")(b)])
    inputs = [mp.Input((4,)), mp.Input((4,))]
    shared = _sub_model(4, "func_shared")
    outputs = [L.Dense(2)(shared(inputs[0])), L.Dense(2)(shared(inputs[1]))]
    return nested, mp.Model(inputs, outputs)


@pytest.mark.parametrize("which", [0, 1], ids=["nested", "nested_shared"])
def test_nested_functional_models(which: int, tmp_path) -> None:
    model = nested_models()[which]
    _randomize(model)
    x = [RNG.normal(size=(2, 4)).astype("float32") for _ in range(2)]
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras")
    for got, want in zip(loaded.predict(x, verbose=0), model.predict(x, verbose=0)):
        np.testing.assert_array_equal(got, want)


def test_reused_layer(tmp_path) -> None:
    """saving_lib_test ``test_load_model_containing_reused_layer``: one Dense called twice."""
    inputs = mp.Input((4,))
    dense = L.Dense(4)
    model = mp.Model(inputs, dense(L.Activation("relu")(dense(inputs))))
    _randomize(model)
    model.save(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras")
    x = RNG.normal(size=(2, 4)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert len(loaded.weights) == 2


def test_load_weights_of_a_keras_file(tmp_path) -> None:
    """saving_lib_test ``test_load_weights_only_with_keras_file``."""
    model = _branching()
    _randomize(model)
    model.save(tmp_path / "m.keras")
    other = _branching()
    other.load_weights(tmp_path / "m.keras")
    for a, b in zip(other.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
