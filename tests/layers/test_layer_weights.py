"""A custom layer's weights, the Keras 3 way: ``add_weight(shape=..., initializer=...)``
without a name, variables read in the compute dtype inside ``call`` under a mixed policy
(Keras' AutocastScope) and in float32 outside it, ``autocast=False`` state, ``build()``
called directly, and ``from_config`` for every layer."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers


class Linear(layers.Layer):
    """The Keras guide's custom layer (keras.io "Making new layers and models via
    subclassing"), as a user writes it."""

    def __init__(self, units: int = 4, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.units = units

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.w = self.add_weight(shape=(input_shape[-1], self.units),
                                 initializer="random_normal", trainable=True)
        self.b = self.add_weight(shape=(self.units,), initializer="zeros", trainable=True)
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     autocast=False)

    def call(self, inputs: mp.Tensor) -> mp.Tensor:
        self.calls.assign_add(1.0)
        return mp.ops.matmul(inputs, self.w) + self.b


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_variables_read_in_the_compute_dtype_inside_call(policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    layer = Linear(3)
    x = np.ones((2, 5), np.float32)
    y = layer(x)
    assert y.dtype == low                       # the matmul ran in 16 bits
    assert layer.w.dtype == "float32"           # the variable stays float32
    assert (layer.w + 1.0).dtype == "float32"   # outside call: float32
    assert layer.calls.numpy() == 1.0 and layer.calls.dtype == "float32"
    w16 = np.asarray(layer.w).astype(low if low == "float16" else np.float32)
    if low == "float16":
        np.testing.assert_allclose(np.asarray(y), x.astype(np.float16) @ w16, rtol=2e-3)
    with mp.GradientTape() as tape:
        loss = mp.ops.sum(mp.ops.cast(layer(x), "float32"))
    grads = tape.gradient(loss, layer.trainable_weights)
    assert [g.dtype for g in grads] == ["float32", "float32"]   # float32 gradients


def test_float32_layer_inside_a_mixed_model_reads_float32() -> None:
    mp.set_global_policy("mixed_bfloat16")
    inner = Linear(2, dtype="float32")
    inp = mp.Input((3,))
    out = inner(layers.Dense(3)(inp))
    assert out.dtype == "float32"
    model = mp.Model(inp, out)
    assert model(np.ones((1, 3), np.float32)).dtype == "float32"


def test_add_weight_keras_defaults_and_names() -> None:
    layer = layers.Layer(name="custom")
    a = layer.add_weight()                       # a scalar, glorot_uniform, named for Keras
    b = layer.add_weight(shape=(2, 3), dtype="int32")   # zeros for non-floating weights
    c = layer.add_weight("legacy", (4,), "ones")         # the earlier name-first order
    assert (a.shape, a.dtype, a.name) == ((), "float32", "custom/variable")
    assert b.name == "custom/variable_1" and b.dtype == "int32"
    assert np.array_equal(b.numpy(), np.zeros((2, 3)))
    assert c.name == "custom/legacy" and np.array_equal(c.numpy(), np.ones(4))
    with pytest.raises(NotImplementedError, match="regularizer and constraint"):
        layer.add_weight(shape=(2,), regularizer="l2")
    with pytest.raises(ValueError, match="aggregation must be one of none, mean"):
        layer.add_weight(shape=(2,), aggregation="max")


def test_direct_build_is_not_redone() -> None:
    # Keras 3 layer_test.py: build() called by hand marks the layer built
    dense = layers.Dense(3)
    dense.build((None, 4))
    assert dense.built
    dense(np.ones((2, 4), np.float32))
    assert len(dense.weights) == 2


LAYERS = [
    lambda: layers.Dense(3, activation="relu", name="d"),
    lambda: layers.Conv2D(2, 3, padding="same"),
    lambda: layers.BatchNormalization(momentum=0.9),
    lambda: layers.LayerNormalization(epsilon=1e-5),
    lambda: layers.Embedding(10, 4),
    lambda: layers.MultiHeadAttention(2, 4),
    lambda: layers.Add(), lambda: layers.Concatenate(axis=1),
    lambda: layers.AveragePooling2D(3, 2, "same"), lambda: layers.GlobalMaxPooling1D(),
    lambda: layers.Reshape((2, 3)), lambda: layers.Permute((2, 1)), lambda: layers.Softmax(),
    lambda: layers.Activation("gelu"), lambda: layers.Dropout(0.3, seed=1),
]


@pytest.mark.parametrize("make", LAYERS)
def test_from_config_round_trip(make: object) -> None:
    mp.set_global_policy("mixed_bfloat16")
    layer = make()  # type: ignore[operator]
    config = layer.get_config()
    again = type(layer).from_config(config)
    assert again.get_config() == config
    assert again.dtype_policy == layer.dtype_policy
    assert type(layer)(**config).get_config() == config    # Dense(**layer.get_config())


def test_the_first_argument_by_its_name() -> None:
    # Keras 3: a layer takes call's first argument by name too (mha(query=q, value=v))
    x = np.ones((2, 3), np.float32)
    assert layers.Dense(2)(inputs=x).shape == (2, 2)
    mha = layers.MultiHeadAttention(2, 4)
    q = np.ones((1, 3, 8), np.float32)
    assert mha(query=q, value=q).shape == (1, 3, 8)
    with pytest.raises(TypeError, match="got its first argument, 'query', twice"):
        mha(q, query=q, value=q)
    with pytest.raises(TypeError, match="called without its first argument, 'inputs'"):
        layers.Dense(2)()
