"""Embedding: rows and their scatter-add gradient against NumPy on every backend, dtypes under
each policy (a float32 table, ids never cast to floats, rows in the compute dtype), ids out of
range, traced steps equal to eager ones, Keras 3 configs. Cases marked "Keras 3" are ported
from keras/src/layers/core/embedding_test.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import rounded

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(3)
POLICIES = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def test_embedding_correctness_keras() -> None:
    # Keras 3: EmbeddingTest.test_correctness
    layer = layers.Embedding(input_dim=3, output_dim=2)
    layer.build()
    layer.embeddings.assign(np.array([[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]]))
    out = layer(np.array([2, 1, 0]))
    np.testing.assert_array_equal(np.asarray(out), [[3.0, 3.0], [2.0, 2.0], [0.0, 0.0]])


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_embedding_rows_and_scatter_add_gradient(backend: mp.Backend, id_dtype: str) -> None:
    layer = layers.Embedding(7, 5)
    ids = np.array([[1, 3, 3], [6, 1, 3]], dtype=id_dtype)       # repeated ids add up
    out_grad = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    with mp.GradientTape() as tape:
        out = layer(mp.constant(ids))
        loss = mp.ops.sum(mp.ops.multiply(out, mp.constant(out_grad)))
    (grad,) = tape.gradient(loss, [layer.embeddings])
    table = layer.embeddings.numpy()
    np.testing.assert_array_equal(np.asarray(out), table[ids])
    want = np.zeros((7, 5))
    np.add.at(want, ids.reshape(-1), out_grad.reshape(-1, 5).astype(np.float64))
    assert grad.dtype == "float32" and grad.shape == (7, 5)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_embedding_dtypes_under_each_policy(policy: str) -> None:
    mp.set_global_policy(policy)
    low = POLICIES[policy]
    layer = layers.Embedding(3000, 4)
    ids = mp.constant(np.array([[2999, 0], [2049, 7]], dtype=np.int32))
    with mp.GradientTape() as tape:
        out = layer(ids)
        loss = mp.ops.sum(mp.ops.cast(out, "float32"))
    (grad,) = tape.gradient(loss, [layer.embeddings])
    assert layer.embeddings.dtype == "float32" and out.dtype == low and grad.dtype == "float32"
    # the float32 rows, rounded once to the compute dtype
    table = layer.embeddings.numpy()
    np.testing.assert_array_equal(np.asarray(out).astype(np.float64),
                                  rounded(table[np.asarray(ids)], low))
    assert np.asarray(grad).sum() == 16.0
    # float ids are not rounded to 16 bits first (2049 is not a float16): cast to int32 as
    # Keras 3 does, so they pick the same rows
    np.testing.assert_array_equal(np.asarray(layer(np.array([2049.0, 2999.0]))),
                                  np.asarray(out)[[1, 0], [0, 0]])


def test_embedding_ids_out_of_range_are_a_clear_error(backend: mp.Backend) -> None:
    layer = layers.Embedding(10, 3, name="words")
    for bad, ids in (("10 .*1..10", [[1, 10]]), ("-1 .*-1..2", [[-1, 2]]),
                     ("-1 .*-1..42", [[42, 3, -1]])):
        with pytest.raises(ValueError, match=rf"'words'.*input_dim\) = \[0, 10\), got id {bad}"):
            layer(np.array(ids, np.int32))
    assert layer(np.zeros((0, 2), np.int32)).shape == (0, 2, 3)


@pytest.mark.parametrize("value", [3.5, 10.0, "10", True, 0, -2, None])
def test_embedding_bad_dims_are_a_clear_error(value: Any) -> None:
    with pytest.raises(ValueError, match=r"input_dim must be a positive int, got"):
        layers.Embedding(value, 4)
    with pytest.raises(ValueError, match=r"output_dim must be a positive int, got"):
        layers.Embedding(4, value)


def test_embedding_unsupported_keras_arguments_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="embeddings_regularizer='l2'"):
        layers.Embedding(4, 2, embeddings_regularizer="l2")
    with pytest.raises(NotImplementedError, match="lora_rank=4"):
        layers.Embedding(4, 2, lora_rank=4)
    with pytest.warns(UserWarning, match="input_length.*deprecated"):
        layers.Embedding(4, 2, input_length=3)
    assert layers.Embedding(np.int64(4), 2).input_dim == 4


@pytest.mark.parametrize("shape,id_dtype,mask_zero", [((2,), "int32", False),
                                                      ((2, 3), "int64", True)])
def test_embedding_basics_keras(shape: tuple, id_dtype: str, mask_zero: bool) -> None:
    # Keras 3: EmbeddingTest.test_embedding_basics
    layer = layers.Embedding(input_dim=5, output_dim=4, mask_zero=mask_zero)
    ids = RNG.integers(0, 5, shape).astype(id_dtype)
    assert layer(ids).shape == (*shape, 4)
    assert len(layer.trainable_weights) == 1 and layer.non_trainable_weights == []
    assert layer.embeddings.name.endswith("/embeddings")
    mask = layer.compute_mask(mp.constant(ids))
    if mask_zero:
        np.testing.assert_array_equal(np.asarray(mask), ids != 0)
    else:
        assert mask is None


def test_embedding_uniform_initializer_and_weights_argument() -> None:
    layer = layers.Embedding(200, 50)
    layer.build()
    values = layer.embeddings.numpy()
    assert values.min() >= -0.05 and values.max() <= 0.05
    assert values.std() > 0.02                    # RandomUniform(-0.05, 0.05), not a constant
    given = RNG.standard_normal((3, 2)).astype(np.float32)
    layer = layers.Embedding(3, 2, weights=given)
    np.testing.assert_array_equal(layer.embeddings.numpy(), given)
    np.testing.assert_array_equal(np.asarray(layer(np.array([2]))), given[[2]])


def test_embedding_config_round_trip() -> None:
    layer = layers.Embedding(11, 3, embeddings_initializer="zeros", mask_zero=True,
                             dtype="mixed_float16", name="emb")
    config = layer.get_config()
    assert set(config) == {"name", "trainable", "dtype", "input_dim", "output_dim",
                           "embeddings_initializer", "embeddings_regularizer",
                           "activity_regularizer", "embeddings_constraint", "mask_zero",
                           "quantization_config"}
    again = layers.Embedding.from_config(config)
    assert again.get_config() == config and again.compute_dtype == "float16"
    out = again(np.array([[1, 2]]))
    assert out.dtype == "float16" and not np.asarray(out).any()


def test_embedding_symbolic_call() -> None:
    mp.set_global_policy("mixed_bfloat16")
    inputs = mp.Input((6,), dtype="int32")
    out = layers.Embedding(20, 8)(inputs)
    assert out.shape == (None, 6, 8) and out.dtype == "bfloat16"


def _text_model(policy: str) -> mp.Model:
    mp.set_global_policy(policy)
    mp.random.set_seed(4)
    inputs = mp.Input((5,), dtype="int32")
    x = layers.Flatten()(layers.Embedding(30, 4)(inputs))
    x = layers.Dense(6, activation="relu")(x)
    return mp.Model(inputs, layers.Activation("softmax", dtype="float32")(layers.Dense(3)(x)))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_traced_fit_equals_eager_bit_for_bit(policy: str) -> None:
    x = RNG.integers(0, 30, (40, 5)).astype(np.int32)
    y = RNG.integers(0, 3, 40)
    runs = []
    for jit in (False, True):
        model = _text_model(policy)
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      jit_compile=jit)
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
        if jit:
            traced = model._traced["train"]
            assert traced.eager_reason is None and traced.tracing_count == 1
        runs.append(model.get_weights())
    for a, b in zip(*runs):
        assert np.array_equal(a, b)
