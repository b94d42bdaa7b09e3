"""``serialize_keras_object`` / ``deserialize_keras_object``, ``get_config``/``from_config`` of
optimizers, losses, metrics, the policy and the LossScaleOptimizer, and custom objects by
registration or ``custom_objects=``.

Ported from Keras 3's ``keras/src/saving/serialization_lib_test.py`` (``test_simple_objects``,
``test_builtin_layers``, ``test_custom_fn``, ``test_custom_layer``, ``test_lambda_fn``,
``test_deserialize_invalid_type_config``, ``test_deserialize_invalid_function_config``,
``test_safe_mode_scope``) and ``keras/src/saving/object_registration_test.py``
(``test_custom_object_scope``, ``test_serialize_custom_class_with_default_name``,
``test_serialize_custom_class_with_custom_name``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.saving import deserialize_keras_object, serialize_keras_object
from mpcore.saving import serialization as _serialization


def roundtrip(obj: Any, custom_objects: dict[str, Any] | None = None,
              safe_mode: bool = True) -> tuple[Any, Any, Any]:
    """serialize, through JSON, deserialize, serialize again (Keras' helper)."""
    serialized = serialize_keras_object(obj)
    data = json.loads(json.dumps(serialized))
    restored = deserialize_keras_object(data, custom_objects=custom_objects,
                                        safe_mode=safe_mode)
    return serialized, restored, serialize_keras_object(restored)


def test_simple_objects() -> None:
    for obj in ["hello", ["hello", 0, "world", 1.0, True], {"1": "hello", "2": 0, "3": True},
                {"1": "hello", "2": [True, False]}, None]:
        serialized, restored, reserialized = roundtrip(obj)
        assert serialized == reserialized
        assert restored == obj
    assert deserialize_keras_object({"class_name": "__ellipsis__", "config": {}}) is Ellipsis
    assert deserialize_keras_object(
        {"class_name": "__slice__", "config": {"start": None, "stop": 20, "step": 1}}
    ) == slice(None, 20, 1)


def test_builtin_layers() -> None:
    layer = mp.layers.Dense(3, name="foo", trainable=False, dtype="float16")
    serialized, restored, reserialized = roundtrip(layer)
    assert serialized == reserialized
    assert (serialized["module"], serialized["class_name"]) == ("keras.layers", "Dense")
    assert serialized["config"]["dtype"] == {
        "module": "keras", "class_name": "DTypePolicy", "config": {"name": "float16"},
        "registered_name": None}
    assert (restored.name, restored.trainable, restored.compute_dtype) == ("foo", False,
                                                                           "float16")


def custom_fn(x: Any) -> Any:
    return x * x


def test_custom_fn() -> None:
    obj = {"activation": mp.saving.register_keras_serializable(package="Ser")(custom_fn)}
    serialized, restored, reserialized = roundtrip(obj)
    assert serialized == reserialized and restored["activation"] is custom_fn
    dense = mp.layers.Dense(1, activation=custom_fn)
    dense.build((None, 2))
    _, new_dense, _ = roundtrip(dense)
    x = np.random.default_rng(0).normal(size=(2, 2)).astype("float32")
    new_dense.set_weights(dense.get_weights())
    np.testing.assert_array_equal(new_dense(x).numpy(), dense(x).numpy())


class CustomLayer(mp.layers.Layer):
    def __init__(self, factor: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x: Any, training: bool | None = None) -> Any:
        return x * self.factor

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor}


def test_custom_layer_by_custom_objects() -> None:
    layer = CustomLayer(factor=2.0)
    x = np.ones((2, 2), "float32")
    serialized, new_layer, _ = roundtrip(layer, custom_objects={"CustomLayer": CustomLayer})
    assert serialized["module"] == __name__ and serialized["registered_name"] == "CustomLayer"
    np.testing.assert_array_equal(new_layer(x).numpy(), layer(x).numpy())
    with pytest.raises(TypeError, match=r"CustomLayer.*register_keras_serializable.*"
                                        r"custom_objects"):
        deserialize_keras_object(serialized)


def test_custom_object_scope() -> None:
    serialized = serialize_keras_object(CustomLayer(factor=3.0))
    with mp.saving.custom_object_scope({"CustomLayer": CustomLayer}):
        assert deserialize_keras_object(serialized).factor == 3.0
    with pytest.raises(TypeError, match="Could not locate class 'CustomLayer'"):
        deserialize_keras_object(serialized)


def test_register_with_default_and_custom_name() -> None:
    @mp.saving.register_keras_serializable(package="Pkg")
    class Default(CustomLayer):
        pass

    @mp.saving.register_keras_serializable(package="Pkg", name="Other")
    class Named(CustomLayer):
        pass

    assert mp.saving.get_registered_name(Default) == "Pkg>Default"
    assert mp.saving.get_registered_name(Named) == "Pkg>Other"
    assert mp.saving.get_custom_objects()["Pkg>Other"] is Named
    assert mp.saving.get_registered_object("Pkg>Default") is Default
    for cls in (Default, Named):
        restored = deserialize_keras_object(serialize_keras_object(cls(factor=1.5)))
        assert type(restored) is cls and restored.factor == 1.5
    with pytest.raises(ValueError, match="get_config"):
        mp.saving.register_keras_serializable()(type("NoConfig", (), {}))
    with pytest.raises(ValueError, match="package"):
        mp.saving.register_keras_serializable(package="a>b")


def test_lambda_fn() -> None:
    """Keras 3 loads a lambda with safe_mode=False; mpcore never writes one nor loads one."""
    config = {"activation": {"class_name": "__lambda__", "config": {"value": "..."}}}
    with pytest.raises(ValueError, match="arbitrary code execution"):
        deserialize_keras_object(config, safe_mode=True)
    with pytest.raises(NotImplementedError, match="lambdas"):
        deserialize_keras_object(config, safe_mode=False)
    with pytest.raises(ValueError, match="lambda"):
        serialize_keras_object({"activation": lambda x: x})


def test_safe_mode_scope() -> None:
    config = {"class_name": "__lambda__", "config": {"value": "..."}}
    with _serialization.safe_mode_scope(True), pytest.raises(ValueError,
                                                              match="arbitrary code"):
        deserialize_keras_object(config, safe_mode=False)


def test_deserialize_invalid_configs() -> None:
    with pytest.raises(TypeError, match="config of 'Dense' must be a dict"):
        deserialize_keras_object({"class_name": "Dense", "module": "keras.layers",
                                  "config": [1, 2, 3]})
    with pytest.raises(TypeError, match="Expected 'config' to be a non-null str"):
        deserialize_keras_object({"class_name": "function", "config": ["not", "a", "str"]})


OPTIMIZERS = [
    lambda: mp.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=1.0),
    lambda: mp.optimizers.RMSprop(0.002, rho=0.8, momentum=0.1, epsilon=1e-6),
    lambda: mp.optimizers.Adam(0.003, beta_1=0.8, beta_2=0.99, global_clipnorm=2.0),
    lambda: mp.optimizers.AdamW(0.001, weight_decay=0.01, gradient_accumulation_steps=2),
    lambda: mp.optimizers.Adam(mp.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)),
    lambda: mp.LossScaleOptimizer(mp.optimizers.Adam(0.01), dynamic=True,
                                  initial_scale=1024.0, dynamic_growth_steps=100),
    lambda: mp.LossScaleOptimizer(mp.optimizers.SGD(0.1), 128.0),
]


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_optimizer_round_trips(make: Any) -> None:
    opt = make()
    serialized, restored, reserialized = roundtrip(opt)
    assert serialized == reserialized
    assert serialized["module"] == "keras.optimizers"
    assert type(restored) is type(opt) and restored.get_config() == opt.get_config()
    assert type(opt).from_config(opt.get_config()).get_config() == opt.get_config()


def test_loss_scale_optimizer_config_is_keras() -> None:
    opt = mp.LossScaleOptimizer(mp.optimizers.Adam(0.01), dynamic=True, initial_scale=1024.0,
                                dynamic_growth_steps=100, name="lso")
    config = serialize_keras_object(opt)["config"]
    assert config == {"name": "lso", "inner_optimizer": serialize_keras_object(opt.inner_optimizer),
                      "initial_scale": 1024.0, "dynamic_growth_steps": 100}


def test_keras_optimizer_config_off_keys() -> None:
    """Keras 3 writes EMA, loss_scale_factor and amsgrad: accepted at their off values,
    refused otherwise (an EMA mpcore does not run would train differently)."""
    base = {"name": "adam", "learning_rate": 0.001, "weight_decay": None, "clipnorm": None,
            "global_clipnorm": None, "clipvalue": None, "use_ema": False, "ema_momentum": 0.99,
            "ema_overwrite_frequency": None, "loss_scale_factor": None,
            "gradient_accumulation_steps": None, "beta_1": 0.9, "beta_2": 0.999,
            "epsilon": 1e-07, "amsgrad": False}
    config = {"module": "keras.optimizers", "class_name": "Adam", "config": base,
              "registered_name": None}
    assert deserialize_keras_object(config).beta_2 == 0.999
    for key, value in (("use_ema", True), ("amsgrad", True), ("loss_scale_factor", 8.0)):
        bad = {**config, "config": {**base, key: value}}
        with pytest.raises(NotImplementedError, match=f"{key}={value!r} is not supported"):
            deserialize_keras_object(bad)


LOSSES = [mp.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
          mp.losses.CategoricalCrossentropy(), mp.losses.MeanSquaredError(name="mse_loss"),
          mp.losses.BinaryCrossentropy(from_logits=True)]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda x: type(x).__name__)
def test_loss_round_trips(loss: Any) -> None:
    serialized, restored, reserialized = roundtrip(loss)
    assert serialized == reserialized and serialized["module"] == "keras.losses"
    assert type(restored) is type(loss) and restored.get_config() == loss.get_config()
    assert type(loss).from_config(loss.get_config()).get_config() == loss.get_config()


def test_keras_loss_config_loads() -> None:
    config = {"module": "keras.losses", "class_name": "SparseCategoricalCrossentropy",
              "config": {"name": "sparse_categorical_crossentropy",
                         "reduction": "sum_over_batch_size", "from_logits": True,
                         "ignore_class": None, "dtype": None}, "registered_name": None}
    assert deserialize_keras_object(config).from_logits is True


METRICS = [mp.metrics.Mean(name="avg"), mp.metrics.SparseCategoricalAccuracy(),
           mp.metrics.CategoricalAccuracy(name="acc"), mp.metrics.Accuracy(),
           mp.metrics.BinaryAccuracy(threshold=0.3)]


@pytest.mark.parametrize("metric", METRICS, ids=lambda x: type(x).__name__)
def test_metric_round_trips(metric: Any) -> None:
    serialized, restored, reserialized = roundtrip(metric)
    assert serialized == reserialized and serialized["module"] == "keras.metrics"
    assert type(restored) is type(metric) and restored.get_config() == metric.get_config()
    assert type(metric).from_config(metric.get_config()).get_config() == metric.get_config()


def test_policy_is_keras_dtype_policy() -> None:
    serialized, restored, _ = roundtrip(mp.Policy("mixed_float16"))
    assert serialized == {"module": "keras", "class_name": "DTypePolicy",
                          "config": {"name": "mixed_float16"}, "registered_name": None}
    assert restored == mp.Policy("mixed_float16")
    fixed = mp.Policy("mixed_float16", loss_scale=256)
    _, restored, _ = roundtrip(fixed)
    assert restored == fixed and restored.loss_scale == mp.FixedLossScale(256)
    assert mp.Policy.from_config(fixed.get_config()) == fixed


def test_unknown_builtin_names_the_class() -> None:
    config = {"module": "keras.layers", "class_name": "Conv3DTranspose", "config": {},
              "registered_name": None}
    with pytest.raises(TypeError, match=r"Conv3DTranspose.*register_keras_serializable"):
        deserialize_keras_object(config)


def my_loss(y_true: Any, y_pred: Any) -> Any:
    return mp.ops.mean(mp.ops.square(mp.ops.subtract(y_pred, y_true)), axis=-1)


def test_unregistered_function_needs_custom_objects(tmp_path) -> None:
    """A loss function that was never registered is saved by its name; loading finds it in
    ``custom_objects`` and names it when missing."""
    inputs = mp.Input((3,))
    model = mp.Model(inputs, mp.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", loss=my_loss)
    model.save(tmp_path / "m.keras")
    with pytest.raises(TypeError, match=r"function 'my_loss'.*custom_objects"):
        mp.models.load_model(tmp_path / "m.keras")
    loaded = mp.models.load_model(tmp_path / "m.keras", custom_objects={"my_loss": my_loss})
    assert loaded.loss.fn is my_loss
