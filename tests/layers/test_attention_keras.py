"""MultiHeadAttention: a selection of Keras 3's own tests, ported. Source:
keras/src/layers/attention/multi_head_attention_test.py (keras-team/keras); each test names
the Keras test it ports. Left out: use_gate, sliding_window, flash attention, LoRA/DoRA,
quantization, constraints and Keras masks on tensors (test_query_mask_propagation), which
mpcore does not have; masks given as query_mask/value_mask stand in for the latter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("kwargs,count", [({}, 8), ({"value_dim": 4, "use_bias": False,
                                                    "dropout": 0.5}, 4)])
def test_keras_basics(kwargs: dict[str, Any], count: int) -> None:
    # Keras: test_basics (the cases without use_gate)
    mha = layers.MultiHeadAttention(num_heads=2, key_dim=2, **kwargs)
    out = mha(np.ones((2, 8, 16)), np.ones((2, 4, 16)))
    assert out.shape == (2, 8, 16)
    assert len(mha.trainable_weights) == count and not mha.non_trainable_weights


@pytest.mark.parametrize("q_dims,v_dims,axes", [
    ((3, 4), (3, 2), (2,)), ((3, 4), (3, 2), (1, 2)), ((5, 3, 4), (5, 3, 2), (2, 3))])
def test_keras_high_dim_attention(q_dims: tuple[int, ...], v_dims: tuple[int, ...],
                                  axes: tuple[int, ...]) -> None:
    # Keras: test_high_dim_attention (4d_inputs_1freebatch, 4d_inputs_2d_attention,
    # 5d_inputs_2d_attention)
    query_shape, value_shape = (3, *q_dims, 8), (3, *v_dims, 8)
    mha = layers.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=axes)
    out = mha(RNG.random(query_shape), RNG.random(value_shape))
    assert out.shape == query_shape and len(mha.trainable_weights) == 8


def test_keras_attention_axes_negative_indexing() -> None:
    # Keras: test_attention_axes_negative_indexing
    x = RNG.normal(size=(2, 3, 8, 4))
    mha_pos = layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=2)
    mha_neg = layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=-2)
    mha_pos(x, x)
    mha_neg(x, x)
    mha_neg.set_weights(mha_pos.get_weights())
    z_pos, a_pos = mha_pos(x, x, return_attention_scores=True)
    z_neg, a_neg = mha_neg(x, x, return_attention_scores=True)
    assert z_pos.shape == z_neg.shape and a_pos.shape == a_neg.shape
    np.testing.assert_allclose(np.asarray(z_pos), np.asarray(z_neg), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(a_pos), np.asarray(a_neg), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("query_dims,value_dims,key_dims,output_shape", [
    ((4, 8), (2, 8), None, None), ((4, 8), (2, 8), (2, 3), None),
    ((4, 8), (2, 8), None, (3, 4)), ((4, 8), (2, 8), (2, 3), (1, 5)),
    ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), None),
    ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), (3, 2)),
    ((4, 2, 3, 8), (4, 2, 3, 7), (4, 2, 3, 8), None)])
def test_keras_compute_output_shape(query_dims: tuple[int, ...], value_dims: tuple[int, ...],
                                    key_dims: tuple[int, ...] | None,
                                    output_shape: tuple[int, ...] | None) -> None:
    # Keras: test_compute_output_shape
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=2, value_dim=2,
                                      output_shape=output_shape)
    query_shape, value_shape = (7, *query_dims), (7, *value_dims)
    key_shape = (7, *key_dims) if key_dims else None
    output = layer(query=np.ones(query_shape), value=np.ones(value_shape),
                   key=np.ones(key_shape) if key_shape else None)
    assert output.shape == layer.compute_output_shape(query_shape, value_shape, key_shape)
    assert output.shape == layer.compute_output_shape(
        list(query_shape), list(value_shape), list(key_shape) if key_shape else None)


@pytest.mark.parametrize("query_shape,value_shape,key_shape", [
    ((2, 4, 8), (2, 2, 7), (2,)), ((2, 4, 8), (2, 2, 8), (2, 1, 7)),
    ((2, 4, 2, 3, 8), (2, 1, 1, 5, 8), (2, 1, 15, 5, 2))])
def test_keras_shape_mismatch_error(query_shape: tuple[int, ...],
                                    value_shape: tuple[int, ...],
                                    key_shape: tuple[int, ...]) -> None:
    # Keras: test_shape_mismatch_error
    layer = layers.MultiHeadAttention(num_heads=4, key_dim=2, value_dim=2)
    with pytest.raises(ValueError, match="must be equal"):
        layer.compute_output_shape(query_shape, value_shape, key_shape)
    with pytest.raises(ValueError, match="must be equal"):
        layer(np.ones(query_shape), np.ones(value_shape), np.ones(key_shape))


def test_keras_invalid_scalar_args_rejected() -> None:
    # Keras: test_invalid_scalar_args_rejected
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="argument `num_heads`"):
            layers.MultiHeadAttention(num_heads=bad, key_dim=4)
        with pytest.raises(ValueError, match="argument `key_dim`"):
            layers.MultiHeadAttention(num_heads=4, key_dim=bad)
        with pytest.raises(ValueError, match="argument `value_dim`"):
            layers.MultiHeadAttention(num_heads=4, key_dim=4, value_dim=bad)
    layers.MultiHeadAttention(num_heads=4, key_dim=4, value_dim=None)


def test_keras_initializer() -> None:
    # Keras: test_initializer (without use_gate; glorot_normal for TruncatedNormal)
    layer = layers.MultiHeadAttention(num_heads=12, key_dim=64,
                                      kernel_initializer="glorot_normal")
    layer.build((2, 4, 8), (2, 4, 8))
    query = layer.query_dense.kernel.numpy()
    for other in (layer.key_dense, layer.value_dense):
        assert not np.allclose(query, other.kernel.numpy())
    assert not np.allclose(query[:8, :4, :8], layer.output_dense.kernel.numpy()[:8, :4, :8])


@pytest.mark.parametrize("use_causal_mask", [True, False])
def test_keras_masking(use_causal_mask: bool) -> None:
    # Keras: test_masking, with the Embedding(mask_zero=True) masks passed as query_mask and
    # value_mask (mpcore has no Keras masks on tensors)
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=2)
    query = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]])
    value = np.array([[5, 4, 0], [3, 0, 0], [2, 1, 1]])
    q_embedded = RNG.normal(size=(3, 5, 8)).astype(np.float32)
    v_embedded = RNG.normal(size=(3, 3, 8)).astype(np.float32)
    output = layer(query=q_embedded, value=v_embedded, query_mask=query != 0,
                   value_mask=value != 0, use_causal_mask=use_causal_mask)
    mask = np.array([[[1, 1, 0]] * 3 + [[0, 0, 0]] * 2, [[1, 0, 0]] * 5,
                     [[1, 1, 1]] + [[0, 0, 0]] * 4])
    if use_causal_mask:
        mask = mask & np.array([[[1, 0, 0], [1, 1, 0]] + [[1, 1, 1]] * 3])
    manual = layer(query=q_embedded, value=v_embedded, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(output), np.asarray(manual), rtol=1e-6, atol=1e-6)


def test_keras_masking_with_different_shapes() -> None:
    # Keras: test_masking_with_different_shapes
    x = RNG.random((2, 5, 8)).astype(np.float32)
    mask = np.tril(np.ones((5, 5)))
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
    output_1 = layer(query=x, value=x, attention_mask=mask)
    mask = np.tile(mask[None, ...], (2, 1, 1))
    output_2 = layer(query=x, value=x, attention_mask=mask)
    mask = np.tile(mask[:, None, ...], (1, 2, 1, 1))
    output_3 = layer(query=x, value=x, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(output_1), np.asarray(output_2), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(output_1), np.asarray(output_3), rtol=1e-6)


def test_keras_causal_with_other_mask() -> None:
    # Keras: test_causal_only_with_other_mask_falls_back
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    layer.build(query_shape=x.shape, value_shape=x.shape)
    extra_mask = np.ones((2, 5, 5), dtype="bool")
    extra_mask[:, 2, 3] = False
    merged = extra_mask & np.tril(np.ones((5, 5), dtype="bool"))
    out1 = layer(x, x, attention_mask=extra_mask, use_causal_mask=True)
    out2 = layer(x, x, attention_mask=merged, use_causal_mask=False)
    assert tuple(out1.shape) == (2, 5, 8)
    np.testing.assert_allclose(np.asarray(out1), np.asarray(out2), atol=1e-5)


@pytest.mark.parametrize("dropout,return_attention_scores", [(0.0, True), (0.1, False),
                                                             (0.1, True)])
def test_keras_causal_masks_with_dropout_or_scores(dropout: float,
                                                   return_attention_scores: bool) -> None:
    # Keras: test_causal_only_masks_when_fused_path_disabled
    t = 6
    future = np.triu(np.ones((t, t)), k=1).astype(bool)
    x = np.random.RandomState(0).randn(1, t, 8).astype("float32")
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=dropout)
    if return_attention_scores:
        _, scores = layer(x, x, use_causal_mask=True, return_attention_scores=True,
                          training=False)
        assert np.asarray(scores)[..., future].sum() < 1e-6
    else:
        out_causal = layer(x, x, use_causal_mask=True, training=False)
        out_explicit = layer(x, x, attention_mask=(~future)[None], training=False)
        np.testing.assert_allclose(np.asarray(out_causal), np.asarray(out_explicit),
                                   atol=1e-5)


def test_keras_causal_masks_non_4d_inputs() -> None:
    # Keras: test_causal_only_masks_non_4d_inputs
    t = 5
    future = np.triu(np.ones((t, t)), k=1).astype(bool)
    x = np.random.RandomState(0).randn(1, t, 3, 8).astype("float32")
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=1)
    _, scores = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    assert np.asarray(scores)[..., future].sum() < 1e-6


@pytest.mark.parametrize("dtype", ["float16", "mixed_float16"])
def test_keras_correctness(dtype: str) -> None:
    # Keras: test_correctness (without flash attention)
    num_heads, key_dim = 8, 8
    query = np.identity(key_dim)[np.newaxis, ...]
    key = np.identity(key_dim)[np.newaxis, ...]
    value = np.reshape(np.arange(key_dim * key_dim), (1, key_dim, key_dim)) / 100.0
    layer = layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim, dtype=dtype)
    layer.build(query.shape, key.shape, value.shape)
    kernel = np.repeat(np.identity(key_dim)[:, np.newaxis, :], num_heads, axis=1)
    bias = np.zeros((num_heads, key_dim))
    layer.set_weights([kernel, bias] * 3 + [kernel, np.zeros((key_dim,))])
    expected_output = np.tile(np.array([2.406, 2.440, 2.473, 2.504, 2.535, 2.568, 2.602,
                                        2.633])[np.newaxis, :, np.newaxis], (1, 1, key_dim))
    expected_score = np.array([[0.1187] * i + [0.1691] + [0.1187] * (7 - i) for i in range(8)])
    expected_score = np.tile(expected_score[np.newaxis, np.newaxis, ...], (1, key_dim, 1, 1))
    output, scores = layer(query=query, value=value, key=key, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(output, np.float64), expected_output, atol=1e-2)
    np.testing.assert_allclose(np.asarray(scores, np.float64), expected_score, atol=1e-2)


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 3, 5)])
def test_keras_symbolic_return_attention_scores(shape: tuple[int, ...]) -> None:
    # Keras: test_symbolic_return_attention_scores (mpcore's symbolic batch axis is None)
    mha = layers.MultiHeadAttention(num_heads=4, key_dim=2)
    symbolic_out = mha(mp.Input(shape[1:]), mp.Input(shape[1:]), return_attention_scores=True)
    assert len(symbolic_out) == 2
    out = mha(RNG.random(shape), RNG.random(shape), return_attention_scores=True)
    assert len(out) == 2
    assert symbolic_out[0].shape == (None, *out[0].shape[1:])
    assert symbolic_out[1].shape == (None, *out[1].shape[1:])


@pytest.mark.parametrize("output_shape,expected", [(8, (2, 4, 8)), ((8, 8), (2, 4, 8, 8))])
def test_keras_output_shape(output_shape: Any, expected: tuple[int, ...]) -> None:
    # Keras: test_multi_head_attention_output_shape_as_int / _as_tuple / _error
    mha = layers.MultiHeadAttention(num_heads=2, key_dim=16, output_shape=output_shape)
    assert mha(query=RNG.random((2, 4, 16)), value=RNG.random((2, 4, 16))).shape == expected
    with pytest.raises(ValueError, match=r"Invalid `output_shape`"):
        layers.MultiHeadAttention(num_heads=2, key_dim=16, output_shape=8.0)
