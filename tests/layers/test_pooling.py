"""Pooling layers: AveragePooling2D (mp.ops.avg_pool2d), MaxPooling2D, the global poolings;
forward and gradients against NumPy float64 references, TF's "same" padding rule (padding is
not counted in a mean), dtypes under mixed policies, data_format, config and errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from grad_checks import check_gradients

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(1)


def ref_avg_pool(x: np.ndarray, pool: tuple[int, int], strides: tuple[int, int],
                 padding: str) -> np.ndarray:
    """Mean over the in-image part of each window (TF's AvgPool)."""
    n, h, w, c = x.shape
    if padding == "valid":
        oh, ow = (h - pool[0]) // strides[0] + 1, (w - pool[1]) // strides[1] + 1
        top = left = 0
    else:
        oh, ow = -(-h // strides[0]), -(-w // strides[1])
        top = max((oh - 1) * strides[0] + pool[0] - h, 0) // 2
        left = max((ow - 1) * strides[1] + pool[1] - w, 0) // 2
    out = np.zeros((n, oh, ow, c))
    for i, j in itertools.product(range(oh), range(ow)):
        r0, c0 = i * strides[0] - top, j * strides[1] - left
        win = x[:, max(r0, 0):min(r0 + pool[0], h), max(c0, 0):min(c0 + pool[1], w), :]
        out[:, i, j, :] = win.mean(axis=(1, 2))
    return out


CASES = [((2, 2), None, "valid", (2, 4, 4, 3)), ((2, 2), None, "valid", (1, 5, 5, 2)),
         ((3, 3), (2, 2), "same", (2, 5, 6, 2)), ((3, 2), (1, 2), "valid", (1, 5, 4, 1)),
         ((2, 2), (2, 2), "same", (1, 5, 5, 2))]


@pytest.mark.parametrize("pool,strides,padding,shape", CASES)
def test_average_pooling_forward_and_gradients(pool: tuple[int, int], strides: tuple[int, int],
                                               padding: str, shape: tuple[int, ...],
                                               backend: mp.Backend) -> None:
    x = RNG.standard_normal(shape)
    layer = layers.AveragePooling2D(pool, strides, padding, dtype="float64")
    want = ref_avg_pool(x, pool, strides or pool, padding)
    np.testing.assert_allclose(np.asarray(layer(x)), want, rtol=1e-12, atol=1e-12)
    check_gradients(lambda t: mp.ops.avg_pool2d(t, pool, strides, padding), [x])


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_pooling_dtypes_under_mixed_policies(policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    x = RNG.standard_normal((2, 4, 4, 3)).astype(np.float32)
    for layer in (layers.AveragePooling2D(), layers.MaxPooling2D(),
                  layers.GlobalAveragePooling2D(), layers.GlobalMaxPooling2D()):
        out = layer(x)
        assert out.dtype == low, type(layer).__name__
    # the mean is summed in float32: within one rounding of the float64 mean
    got = np.asarray(layers.GlobalAveragePooling2D()(x)).astype(np.float64)
    np.testing.assert_allclose(got, x.mean(axis=(1, 2)), rtol=2 ** -7 if low == "bfloat16"
                               else 2 ** -10, atol=1e-3)


@pytest.mark.parametrize("keepdims", [False, True])
def test_global_poolings_forward_and_gradients(keepdims: bool, backend: mp.Backend) -> None:
    x2, x1 = RNG.standard_normal((2, 3, 4, 5)), RNG.standard_normal((2, 6, 3))
    cases = [(layers.GlobalAveragePooling2D, x2, lambda a: a.mean((1, 2), keepdims=keepdims)),
             (layers.GlobalMaxPooling2D, x2, lambda a: a.max((1, 2), keepdims=keepdims)),
             (layers.GlobalAveragePooling1D, x1, lambda a: a.mean(1, keepdims=keepdims)),
             (layers.GlobalMaxPooling1D, x1, lambda a: a.max(1, keepdims=keepdims))]
    for cls, x, ref in cases:
        layer = cls(keepdims=keepdims, dtype="float64")
        np.testing.assert_allclose(np.asarray(layer(x)), ref(x), rtol=1e-12)
        check_gradients(lambda t, c=cls: c(keepdims=keepdims, dtype="float64")(t), [x])


def test_channels_first() -> None:
    # keras/src/layers/pooling/global_average_pooling_test.py: data_format="channels_first"
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    out = layers.GlobalAveragePooling2D(data_format="channels_first")(x)
    np.testing.assert_allclose(np.asarray(out), x.mean(axis=(2, 3)), rtol=1e-6, atol=1e-6)
    pooled = layers.AveragePooling2D(data_format="channels_first")(x)
    want = ref_avg_pool(x.transpose(0, 2, 3, 1), (2, 2), (2, 2), "valid").transpose(0, 3, 1, 2)
    np.testing.assert_allclose(np.asarray(pooled), want, rtol=1e-6, atol=1e-6)


def test_pooling_shapes_and_config() -> None:
    # keras/src/layers/pooling/average_pooling_test.py: output shapes for valid and same
    x = mp.Input((7, 7, 3))
    assert layers.AveragePooling2D(2)(x).shape == (None, 3, 3, 3)
    assert layers.AveragePooling2D(2, padding="same")(x).shape == (None, 4, 4, 3)
    assert layers.AveragePooling2D(3, strides=1)(x).shape == (None, 5, 5, 3)
    assert layers.GlobalAveragePooling2D(keepdims=True)(x).shape == (None, 1, 1, 3)
    layer = layers.AveragePooling2D((3, 2), strides=(1, 2), padding="same")
    cfg = layer.get_config()
    assert (cfg["pool_size"], cfg["strides"], cfg["padding"], cfg["data_format"]) == (
        (3, 2), (1, 2), "same", "channels_last")
    assert layers.AveragePooling2D(**cfg).get_config() == cfg
    g = layers.GlobalMaxPooling1D(keepdims=True)
    assert layers.GlobalMaxPooling1D(**g.get_config()).keepdims


def test_pooling_errors() -> None:
    with pytest.raises(ValueError, match="rank 4"):
        layers.AveragePooling2D()(mp.Input((4, 4)))
    with pytest.raises(ValueError, match="rank 3"):
        layers.GlobalAveragePooling1D()(mp.Input((4, 4, 2)))
    with pytest.raises(ValueError, match="padding must be 'valid' or 'same'"):
        layers.AveragePooling2D(padding="full")
    with pytest.raises(ValueError, match="data_format must be one of channels_last, "
                                         "channels_first"):
        layers.GlobalAveragePooling2D(data_format="NHWC")
    with pytest.raises(ValueError, match="larger than the input"):
        layers.AveragePooling2D(5)(np.ones((1, 3, 3, 1), np.float32))
