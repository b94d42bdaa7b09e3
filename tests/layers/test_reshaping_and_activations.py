"""Reshape, Permute, the Softmax layer and the activation names: forward against NumPy,
gradients against finite differences in float64, dtypes, config and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from grad_checks import check_gradients

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(2)


def test_reshape_and_permute(backend: mp.Backend) -> None:
    x = RNG.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(np.asarray(layers.Reshape((4, 3), dtype="float64")(x)),
                                  x.reshape(2, 4, 3))
    np.testing.assert_array_equal(np.asarray(layers.Reshape((-1,), dtype="float64")(x)),
                                  x.reshape(2, 12))
    np.testing.assert_array_equal(np.asarray(layers.Permute((2, 1), dtype="float64")(x)),
                                  x.transpose(0, 2, 1))
    check_gradients(lambda t: layers.Permute((2, 1), dtype="float64")(t), [x])
    inp = mp.Input((3, 4))
    assert layers.Reshape((2, -1))(inp).shape == (None, 2, 6)   # reshaping_test.py (Keras 3)
    assert layers.Permute((2, 1))(inp).shape == (None, 4, 3)
    assert layers.Reshape(**layers.Reshape((2, 6)).get_config()).target_shape == (2, 6)
    assert layers.Permute(**layers.Permute((2, 1)).get_config()).dims == (2, 1)


def test_reshape_and_permute_errors() -> None:
    with pytest.raises(ValueError, match=r"\(3, 4\) \(12 values\) cannot be reshaped to "
                                         r"\(5, -1\)"):
        layers.Reshape((5, -1))(mp.Input((3, 4)))
    with pytest.raises(ValueError, match="at most one -1"):
        layers.Reshape((-1, -1))
    with pytest.raises(ValueError, match=r"permutation of 1..2"):
        layers.Permute((0, 1))
    with pytest.raises(ValueError, match="rank 3"):
        layers.Permute((2, 1))(mp.Input((2, 3, 4)))


def _softmax(x: np.ndarray, axis: int | tuple[int, ...] = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_layer(backend: mp.Backend) -> None:
    x = RNG.standard_normal((2, 3, 5))
    np.testing.assert_allclose(np.asarray(layers.Softmax(dtype="float64")(x)), _softmax(x),
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(layers.Softmax(axis=(1, 2), dtype="float64")(x)),
                               _softmax(x, (1, 2)), rtol=1e-12)
    check_gradients(lambda t: layers.Softmax(axis=1, dtype="float64")(t), [x])
    # keras/src/layers/activations/softmax_test.py: a mask drops the masked-out logits
    mask = np.array([[1, 1, 0, 0, 1]] * 3, bool)[None].repeat(2, 0)
    got = np.asarray(layers.Softmax(dtype="float64")(x, mask=mask))
    want = _softmax(np.where(mask, x, -np.inf))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_softmax_layer_is_float32_inside(policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    x = RNG.standard_normal((4, 7)).astype(np.float32) * 4
    out = layers.Softmax()(x)
    assert out.dtype == low
    # computed in float32, rounded once: within half an ulp of the float64 result's rounding
    ulp = 2.0 ** (-8 if low == "bfloat16" else -11)
    np.testing.assert_allclose(np.asarray(out).astype(np.float64),
                               _softmax(np.asarray(mp.constant(x, dtype=low)).astype(
                                   np.float64)), rtol=ulp, atol=1e-6)
    assert layers.Softmax(dtype="float32")(x).dtype == "float32"
    mask = np.ones((4, 7), bool)
    mask[:, 3:] = False
    masked = np.asarray(layers.Softmax()(x, mask=mask)).astype(np.float64)
    assert np.all(masked[:, 3:] == 0.0)   # float16's -3e4 underflows exp to 0 as -1e9 does


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(x))


ACTIVATIONS = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "log_softmax": lambda x: x - x.max(-1, keepdims=True) - np.log(
        np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    "softplus": _softplus,
    "softsign": lambda x: x / (1 + np.abs(x)),
    "elu": lambda x: np.where(x > 0, x, np.exp(x) - 1),
    "relu6": lambda x: np.clip(x, 0, 6),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.2 * x),
    "hard_sigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
    "hard_silu": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "exponential": np.exp,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_names(name: str) -> None:
    # away from the kinks of relu6, leaky_relu, elu and hard_sigmoid
    x = RNG.uniform(-4, 4, (3, 6))
    x = np.where(np.abs(x) < 0.05, 0.3, x)
    x = np.where(np.abs(np.abs(x) - 3) < 0.05, 2.5, x)
    layer = layers.Activation(name, dtype="float64")
    np.testing.assert_allclose(np.asarray(layer(x)), ACTIVATIONS[name](x), rtol=1e-10,
                               atol=1e-12)
    check_gradients(lambda t: layers.Activation(name, dtype="float64")(t), [x])


@pytest.mark.parametrize("name", ["silu", "gelu", "softplus", "elu", "log_softmax", "mish"])
def test_activations_keep_the_compute_dtype(name: str) -> None:
    mp.set_global_policy("mixed_bfloat16")
    assert layers.Activation(name)(np.ones((2, 3), np.float32)).dtype == "bfloat16"
    assert layers.Dense(3, activation=name)(np.ones((2, 3), np.float32)).dtype == "bfloat16"


def test_gelu_approximate_and_unknown_names() -> None:
    x = RNG.standard_normal((4,))
    got = np.asarray(layers.activations.gelu(mp.constant(x), approximate=True))
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(ValueError, match=r"valid names: .*silu"):
        layers.Activation("swishy")
    assert layers.Activation("swish").get_config()["activation"] == "silu"
