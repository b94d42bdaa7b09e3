"""Layers: the guide's dtype rules, forward passes against NumPy references, gradients against
finite differences in float64, and errors that name the layer and the shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from grad_checks import numeric_grad

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(0)


# --- the guide's dtype facts --------------------------------------------------------------------
@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_guide_dtype_facts(policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    inputs = mp.Input(shape=(784,), name="digits")
    dense1 = layers.Dense(16, activation="relu", name="dense_1")
    x = dense1(inputs)
    assert dense1.dtype_policy == mp.Policy(policy)
    assert x.dtype == low
    assert dense1.kernel.dtype == "float32" and dense1.dtype == "float32"
    outputs = layers.Activation("softmax", dtype="float32", name="predictions")(
        layers.Dense(10)(x))
    assert outputs.dtype == "float32"
    model = mp.Model(inputs, outputs)
    out = model(RNG.random((3, 784), dtype=np.float32))
    assert out.dtype == "float32"
    np.testing.assert_allclose(np.asarray(out).sum(axis=1), 1.0, rtol=1e-5)
    # softmax inside a 16-bit layer is computed in float32 and handed back in 16 bits
    assert layers.Dense(10, activation="softmax")(x).dtype == low


def test_layer_dtype_override_and_integer_inputs_not_cast() -> None:
    mp.set_global_policy("mixed_float16")
    assert layers.Dense(2, dtype="float32").compute_dtype == "float32"
    assert layers.Dense(2, dtype=mp.Policy("mixed_bfloat16")).compute_dtype == "bfloat16"
    assert layers.Dense(2).compute_dtype == "float16"
    ints = mp.constant([[1, 2], [3, 4]], dtype="int32")
    assert layers.Flatten()(ints).dtype == "int32"
    assert layers.Flatten()(mp.constant([[1.0, 2.0]])).dtype == "float16"
    with pytest.raises(ValueError, match="valid names"):
        layers.Dense(2, dtype="float8")


def test_weight_cast_once_per_step() -> None:
    mp.set_global_policy("mixed_float16")
    dense = layers.Dense(4)
    dense(np.ones((2, 3), np.float32))
    with mp.GradientTape():
        a = dense.kernel.read_as("float16")
        b = dense.kernel.read_as("float16")
        assert a is b
    with mp.GradientTape():
        assert dense.kernel.read_as("float16") is not a  # a new step casts again


# --- forward and gradients in float64 ----------------------------------------------------------
def check_layer_gradients(layer: layers.Layer, x: np.ndarray, training: bool = False) -> None:
    """Tape gradients of sum(layer(x) * r) w.r.t. x and every weight == finite differences."""
    x = np.array(x, dtype=np.float64)
    out0 = layer(mp.constant(x), training=training)
    r = RNG.standard_normal(out0.shape)
    weights = layer.trainable_weights
    host = [np.array(w.numpy(), dtype=np.float64) for w in weights]

    def objective() -> float:
        for w, h in zip(weights, host):
            w.assign(h)
        mp.random.set_seed(7)  # the same dropout mask at every evaluation
        return float((np.asarray(layer(mp.constant(x), training=training)) * r).sum())

    objective()
    xt = mp.constant(x)
    mp.random.set_seed(7)
    with mp.GradientTape() as tape:
        tape.watch(xt)
        loss = mp.ops.sum(layer(xt, training=training) * mp.constant(r))
    grads = tape.gradient(loss, [xt, *weights])
    np.testing.assert_allclose(np.asarray(grads[0]), numeric_grad(objective, x),
                               rtol=1e-5, atol=1e-7, err_msg=f"{layer.name}: d/dx")
    for w, h, g in zip(weights, host, grads[1:]):
        np.testing.assert_allclose(np.asarray(g), numeric_grad(objective, h), rtol=1e-5,
                                   atol=1e-7, err_msg=f"{layer.name}: d/d{w.name}")


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


ACTIVATION_REFS = {
    "linear": lambda x: x, "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "gelu": _gelu,
    "softmax": lambda x: np.exp(x - x.max(-1, keepdims=True))
    / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
}


@pytest.mark.parametrize("activation", sorted(ACTIVATION_REFS))
def test_dense_forward_and_gradients(activation: str) -> None:
    layer = layers.Dense(3, activation=activation, dtype="float64")
    x = RNG.standard_normal((4, 5)) + 0.05  # keeps relu away from its kink
    out = layer(x)
    assert out.dtype == "float64"
    k, b = (np.asarray(w) for w in layer.weights)
    np.testing.assert_allclose(np.asarray(out), ACTIVATION_REFS[activation](x @ k + b),
                               rtol=1e-10, atol=1e-12)
    check_layer_gradients(layer, x)


@pytest.mark.parametrize("activation", sorted(ACTIVATION_REFS))
def test_activation_forward_and_gradients(activation: str) -> None:
    layer = layers.Activation(activation, dtype="float64")
    x = RNG.standard_normal((3, 4)) + 0.05
    np.testing.assert_allclose(np.asarray(layer(x)), ACTIVATION_REFS[activation](x),
                               rtol=1e-10, atol=1e-12)
    check_layer_gradients(layer, x)


def test_dense_on_rank3_and_without_bias() -> None:
    layer = layers.Dense(2, use_bias=False, dtype="float64")
    x = RNG.standard_normal((2, 3, 4))
    assert layer(x).shape == (2, 3, 2)
    assert len(layer.weights) == 1
    check_layer_gradients(layer, x)


def test_dropout() -> None:
    layer = layers.Dropout(0.5, dtype="float64")
    x = RNG.standard_normal((20, 30)) + 3.0
    assert np.array_equal(np.asarray(layer(x)), x)  # inference: the identity
    y = np.asarray(layer(x, training=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 2.0 * x[kept])
    assert 0.35 < kept.mean() < 0.65
    check_layer_gradients(layer, x, training=True)
    with pytest.raises(ValueError, match="rate"):
        layers.Dropout(1.0)


def test_flatten() -> None:
    layer = layers.Flatten(dtype="float64")
    x = RNG.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(np.asarray(layer(x)), x.reshape(2, 12))
    check_layer_gradients(layer, x)


def test_layer_normalization() -> None:
    layer = layers.LayerNormalization(dtype="float64")
    x = RNG.standard_normal((3, 6)) * 2 + 1
    layer(x)
    layer.gamma.assign(RNG.standard_normal(6))
    layer.beta.assign(RNG.standard_normal(6))
    g, b = np.asarray(layer.gamma), np.asarray(layer.beta)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(layer(x)), (x - mean) / np.sqrt(var + 1e-3) * g + b,
                               rtol=1e-10)
    check_layer_gradients(layer, x)


def test_layer_normalization_statistics_in_float32() -> None:
    # A large offset: float16 statistics would lose the small variations entirely.
    mp.set_global_policy("mixed_float16")
    layer = layers.LayerNormalization()
    x = (1000.0 + RNG.standard_normal((4, 32))).astype(np.float32)
    out = layer(x)
    assert out.dtype == "float16"
    x16 = x.astype(np.float16).astype(np.float64)  # what the layer receives
    ref = (x16 - x16.mean(-1, keepdims=True)) / np.sqrt(x16.var(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(np.asarray(out).astype(np.float64), ref, rtol=5e-3, atol=5e-3)


def _conv_ref(x: np.ndarray, k: np.ndarray, stride: int, padding: str) -> np.ndarray:
    kh, kw = k.shape[:2]
    n, h, w, _ = x.shape
    if padding == "same":
        oh, ow = -(-h // stride), -(-w // stride)
        ph = max((oh - 1) * stride + kh - h, 0)
        pw = max((ow - 1) * stride + kw - w, 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, oh, ow, k.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[:, i, j, :] = np.tensordot(patch, k, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize("stride,padding", [(1, "valid"), (1, "same"), (2, "same"),
                                            (2, "valid")])
def test_conv2d(stride: int, padding: str) -> None:
    layer = layers.Conv2D(3, 3, strides=stride, padding=padding, activation="tanh",
                          dtype="float64")
    x = RNG.standard_normal((2, 6, 5, 2))
    out = layer(x)
    k, b = (np.asarray(w) for w in layer.weights)
    np.testing.assert_allclose(np.asarray(out), np.tanh(_conv_ref(x, k, stride, padding) + b),
                               rtol=1e-10, atol=1e-12)
    check_layer_gradients(layer, x)


def test_conv2d_is_an_allow_op() -> None:
    mp.set_global_policy("mixed_float16")
    layer = layers.Conv2D(4, 3)
    assert layer(RNG.random((1, 5, 5, 2), dtype=np.float32)).dtype == "float16"
    assert layer.kernel.dtype == "float32"


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_max_pooling(padding: str) -> None:
    layer = layers.MaxPooling2D(2, padding=padding, dtype="float64")
    x = RNG.standard_normal((2, 5, 5, 3))  # distinct values: no ties at the max
    out = np.asarray(layer(x))
    pad = 1 if padding == "same" else 0
    xp = np.pad(x, ((0, 0), (0, pad), (0, pad), (0, 0)), constant_values=-np.inf)
    n = (xp.shape[1]) // 2
    ref = xp[:, :2 * n, :2 * n].reshape(2, n, 2, n, 2, 3).max(axis=(2, 4))
    np.testing.assert_array_equal(out, ref)
    check_layer_gradients(layer, x)


# --- errors ------------------------------------------------------------------------------------
def test_wrong_shape_names_layer_and_shapes() -> None:
    dense = layers.Dense(4, name="my_dense")
    dense(np.ones((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"my_dense.*Dense.*8.*\(2, 5\)"):
        dense(np.ones((2, 5), np.float32))
    conv = layers.Conv2D(2, 3, name="my_conv")
    with pytest.raises(ValueError, match=r"my_conv.*rank 4.*\(2, 5\)"):
        conv(np.ones((2, 5), np.float32))
    inputs = mp.Input((3,))
    with pytest.raises(ValueError, match=r"my_dense.*axis -1.*8.*\(None, 3\)"):
        dense(inputs)


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid names: linear, relu"):
        layers.Dense(2, activation="swishy")
    with pytest.raises(ValueError, match=r"valid names:.*glorot_uniform"):
        layers.Dense(2, kernel_initializer="nope")(np.ones((1, 2), np.float32))
    with pytest.raises(ValueError, match="padding"):
        layers.Conv2D(2, 3, padding="full")
    with pytest.raises(ValueError, match="units"):
        layers.Dense(0)


def test_initializers_are_seeded_by_mp_random() -> None:
    mp.random.set_seed(3)
    a = layers.Dense(4)
    a(np.ones((1, 5), np.float32))
    mp.random.set_seed(3)
    b = layers.Dense(4)
    b(np.ones((1, 5), np.float32))
    np.testing.assert_array_equal(np.asarray(a.kernel), np.asarray(b.kernel))
    limit = math.sqrt(6 / (5 + 4))
    assert np.abs(np.asarray(a.kernel)).max() <= limit
