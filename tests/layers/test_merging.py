"""Merge layers (Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate), their
functions, and the operators on KerasTensors: forward and gradients against NumPy float64,
dtypes under each policy, broadcasting and errors as Keras 3's (keras/src/layers/merging/
merging_test.py is the source of the cases marked so)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from grad_checks import check_gradients

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(0)

MERGES: dict[str, tuple[type, Callable[..., np.ndarray]]] = {
    "add": (layers.Add, lambda a, b: a + b),
    "subtract": (layers.Subtract, lambda a, b: a - b),
    "multiply": (layers.Multiply, lambda a, b: a * b),
    "average": (layers.Average, lambda a, b: (a + b) / 2),
    "maximum": (layers.Maximum, np.maximum),
    "minimum": (layers.Minimum, np.minimum),
}


@pytest.mark.parametrize("name", sorted(MERGES))
def test_merge_forward_and_gradients(name: str, backend: mp.Backend) -> None:
    cls, ref = MERGES[name]
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 4))
    layer = cls(dtype="float64")
    np.testing.assert_allclose(np.asarray(layer([a, b])), ref(a, b), rtol=1e-12)
    check_gradients(lambda x, y: cls(dtype="float64")([x, y]), [a, b])
    # the function form is the layer (keras/src/layers/merging/merging_test.py)
    fn = getattr(layers, name)
    np.testing.assert_allclose(np.asarray(fn([a, b], dtype="float64")), ref(a, b), rtol=1e-12)


@pytest.mark.parametrize("name", ["add", "multiply", "average", "maximum", "minimum"])
def test_merge_three_inputs(name: str) -> None:
    cls, ref = MERGES[name]
    xs = [RNG.standard_normal((2, 5)).astype(np.float32) for _ in range(3)]
    out = np.asarray(cls()(xs))
    want = (sum(xs) / 3 if name == "average" else
            ref(ref(xs[0], xs[1]), xs[2]) if name != "add" else sum(xs))
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_merge_broadcasts_as_keras() -> None:
    # merging_test.py: inputs of different ranks get axes of size 1 after the batch axis
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((2, 4)).astype(np.float32)
    out = layers.Add()([a, b])
    np.testing.assert_allclose(np.asarray(out), a + b[:, None, :], rtol=1e-6)
    x, y = mp.Input((3, 4)), mp.Input((1, 4))
    assert layers.Multiply()([x, y]).shape == (None, 3, 4)


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_merge_dtypes_under_mixed_policies(policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    a = np.ones((2, 3), np.float32)
    assert layers.Add()([a, a]).dtype == low           # a residual stays 16-bit
    assert layers.Add(dtype="float32")([a, a]).dtype == "float32"
    x = mp.Input((3,))
    assert layers.add([x, x]).dtype == low
    ints = mp.constant(np.ones((2, 3)), dtype="int32")
    assert layers.Add()([ints, ints]).dtype == "int32"  # integers are never cast


def test_concatenate_forward_gradients_and_config(backend: mp.Backend) -> None:
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 2))
    out = layers.Concatenate(dtype="float64")([a, b])
    np.testing.assert_allclose(np.asarray(out), np.concatenate([a, b], -1))
    check_gradients(lambda x, y: layers.concatenate([x, y], dtype="float64"), [a, b])
    c = RNG.standard_normal((2, 1, 4))
    np.testing.assert_allclose(np.asarray(layers.concatenate([a, c], axis=1)),
                               np.concatenate([a, c], 1), rtol=1e-6)
    layer = layers.Concatenate(axis=1, name="cat")
    cfg = layer.get_config()
    assert cfg["axis"] == 1 and cfg["name"] == "cat"
    assert layers.Concatenate(**cfg).axis == 1


def test_merge_errors_name_the_shapes() -> None:
    a, b = mp.Input((4,)), mp.Input((5,))
    with pytest.raises(ValueError, match=r"incompatible shapes \[\(None, 4\), \(None, 5\)\]"):
        layers.Add()([a, b])
    with pytest.raises(ValueError, match="exactly 2 inputs"):
        layers.Subtract()([a, a, a])
    with pytest.raises(ValueError, match="called on a list of tensors"):
        layers.Add()(a)
    with pytest.raises(ValueError, match="matching shapes except along axis -1"):
        layers.Concatenate()([mp.Input((2, 4)), mp.Input((3, 4))])
    with pytest.raises(ValueError, match="different batch sizes"):
        layers.Add()([np.ones((2, 3), np.float32), np.ones((3, 3), np.float32)])
    with pytest.raises(ValueError, match="axis must be an int"):
        layers.Concatenate(axis="last")  # type: ignore[arg-type]


# --- operators on KerasTensors ----------------------------------------------------------
def test_keras_tensor_operators_build_a_graph(backend: mp.Backend) -> None:
    x, y = mp.Input((4,), name="x"), mp.Input((4,), name="y")
    out = (x + y) * 2.0 - x / 4.0
    out = -out + 1.0
    out = 3.0 * out[:, 1:3]
    model = mp.Model([x, y], out)
    a, b = RNG.standard_normal((5, 4)), RNG.standard_normal((5, 4))
    got = np.asarray(model([a.astype(np.float32), b.astype(np.float32)]))
    want = 3.0 * (-((a + b) * 2.0 - a / 4.0) + 1.0)[:, 1:3]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    names = [layer.name.rsplit("_", 1)[0] for layer in model.layers[2:]]
    assert {"add", "multiply", "divide", "subtract", "negative", "getitem"} <= set(names)


def test_keras_tensor_operator_keeps_16_bits() -> None:
    mp.set_global_policy("mixed_bfloat16")
    x = mp.Input((8,))
    h = layers.Dense(8)(x)
    assert (h + h).dtype == "bfloat16"
    assert (h * 0.5).dtype == "bfloat16"    # a Python number is a weak scalar
    assert (np.float32(2.0) * h).dtype in ("bfloat16", "float32")


def test_operator_with_a_concrete_tensor_is_refused() -> None:
    x = mp.Input((2,))
    with pytest.raises(TypeError, match="concrete Tensor"):
        _ = x + mp.constant([1.0, 2.0])


def test_residual_block_trains_eager_and_traced_identically() -> None:
    """A functional residual block (Dense, Add, the + operator) trained by fit, eager and
    traced, lands on the same weights bit for bit."""
    data_x = RNG.standard_normal((64, 8)).astype(np.float32)
    data_y = RNG.integers(0, 3, 64)

    def build() -> mp.Model:
        mp.random.set_seed(3)
        inp = mp.Input((8,))
        h = layers.Dense(8, activation="relu")(inp)
        h = layers.add([h, layers.Dense(8)(h)])
        h = h + inp
        return mp.Model(inp, layers.Dense(3)(h))

    weights = []
    for jit in (False, True):
        model = build()
        model.compile(optimizer=mp.optimizers.SGD(0.05),
                      loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=jit)
        model.fit(data_x, data_y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)
