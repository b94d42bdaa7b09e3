"""BatchNormalization and LayerNormalization: forward passes and gradients against float64
NumPy references on every backend, float32 statistics and 16-bit outputs under the mixed
policies, training against inference, moving statistics of traced steps bit for bit equal to
eager ones, Keras 3 configs, and errors. Cases marked "Keras 3" are ported from
keras/src/layers/normalization/*_test.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import check_close, rounded

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(7)
LOW = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


# --- float64 references ---------------------------------------------------------------------
def ref_norm(x: np.ndarray, red: tuple[int, ...], gamma: np.ndarray, beta: np.ndarray,
             eps: float, mean: Any = None, var: Any = None) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * gamma + beta``; the statistics over ``red`` unless
    given (inference); ``gamma``/``beta`` already broadcastable."""
    if mean is None:
        mean, var = x.mean(red, keepdims=True), x.var(red, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def ref_grads(x: np.ndarray, red: tuple[int, ...], gamma: np.ndarray, dy: np.ndarray,
              eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d/dx, d/dgamma, d/dbeta of ``sum(ref_norm(x) * dy)`` with batch statistics (the
    parameters' gradients summed over the axes they broadcast along)."""
    mean, var = x.mean(red, keepdims=True), x.var(red, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    g = dy * gamma
    dx = rstd * (g - g.mean(red, keepdims=True) - xhat * (g * xhat).mean(red, keepdims=True))
    over = tuple(i for i in range(x.ndim) if gamma.shape[i] == 1)   # gamma: rank of x
    return dx, (dy * xhat).sum(over), dy.sum(over)


def close32(got: Any, want: np.ndarray) -> None:
    """float32 against float64: rtol 1e-5, with an absolute floor at 1e-5 of the largest
    value (a gradient's cancellation leaves elements near zero with an absolute error)."""
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5,
                               atol=1e-5 * max(1.0, float(np.abs(want).max())))


def grads_of(layer: layers.Layer, x: np.ndarray, dy: np.ndarray, training: bool) -> tuple:
    """The layer's output and the gradients of ``sum(output * dy)`` w.r.t. the input and
    each trainable weight (the output read in float32)."""
    xt = mp.constant(x)
    with mp.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt, training=training)
        loss = mp.ops.sum(mp.ops.multiply(mp.ops.cast(y, "float32"), mp.constant(dy)))
    return y, tape.gradient(loss, [xt, *layer.trainable_weights])


def randomize(layer: layers.Layer) -> dict[str, np.ndarray]:
    out = {}
    for v in layer.weights:
        key = v.name.split("/")[-1]
        value = RNG.uniform(0.5, 1.5, v.shape) if "variance" in key or key == "gamma" else \
            RNG.standard_normal(v.shape)
        v.assign(value.astype(np.float32))
        out[key] = value.astype(np.float32).astype(np.float64)
    return out


def bshape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d if i in axes else 1 for i, d in enumerate(shape))


# --- BatchNormalization ---------------------------------------------------------------------
BN_CASES = [((6, 4), -1), ((5, 3, 4), 1), ((4, 3, 3, 2), -1)]


@pytest.mark.parametrize("shape,axis", BN_CASES)
def test_batch_norm_training_forward_gradient_and_moving_stats(backend: mp.Backend,
                                                               shape: tuple, axis: int) -> None:
    layer = layers.BatchNormalization(axis=axis, momentum=0.9)
    x = (RNG.standard_normal(shape) * 3 + 2).astype(np.float32)
    layer.build(x.shape)
    w = randomize(layer)
    ax = axis % len(shape)
    red = tuple(i for i in range(len(shape)) if i != ax)
    bs = bshape(shape, (ax,))
    gamma, beta = w["gamma"].reshape(bs), w["beta"].reshape(bs)
    dy = RNG.standard_normal(shape)
    y, (dx, dgamma, dbeta) = grads_of(layer, x, dy, training=True)
    x64 = x.astype(np.float64)
    close32(y, ref_norm(x64, red, gamma, beta, 1e-3))
    rdx, rdg, rdb = ref_grads(x64, red, gamma, dy, 1e-3)
    close32(dx, rdx)
    close32(dgamma, rdg)
    close32(dbeta, rdb)
    # Keras 3's update, with the biased batch variance
    close32(layer.moving_mean, w["moving_mean"] * 0.9 + x64.mean(red) * 0.1)
    close32(layer.moving_variance, w["moving_variance"] * 0.9 + x64.var(red) * 0.1)


@pytest.mark.parametrize("training", [False, None])
def test_batch_norm_inference_uses_moving_stats(backend: mp.Backend, training: Any) -> None:
    layer = layers.BatchNormalization(axis=1)
    x = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    layer.build(x.shape)
    w = randomize(layer)
    before = [v.numpy() for v in layer.weights]
    dy = RNG.standard_normal(x.shape)
    y, (dx, dgamma, dbeta) = grads_of(layer, x, dy, training=training)
    b = (1, 3, 1)
    mean, var = w["moving_mean"].reshape(b), w["moving_variance"].reshape(b)
    gamma = w["gamma"].reshape(b)
    rstd = 1 / np.sqrt(var + 1e-3)
    close32(y, ref_norm(x.astype(np.float64), (0, 2), gamma, w["beta"].reshape(b), 1e-3,
                        mean, var))
    close32(dx, dy * gamma * rstd)
    close32(dgamma, (dy * (x - mean) * rstd).sum((0, 2)))
    close32(dbeta, dy.sum((0, 2)))
    for v, old in zip(layer.weights, before):
        np.testing.assert_array_equal(v.numpy(), old)


@pytest.mark.parametrize("policy", list(LOW))
def test_batch_norm_mixed_float32_statistics(policy: str) -> None:
    mp.set_global_policy(policy)
    low = LOW[policy]
    layer = layers.BatchNormalization(momentum=0.5)
    # a large offset: 16-bit statistics would lose the small variations entirely
    x = (100.0 + RNG.standard_normal((32, 5))).astype(np.float32)
    dy = RNG.standard_normal(x.shape)
    y, grads = grads_of(layer, x, dy, training=True)
    assert y.dtype == low
    assert [v.dtype for v in layer.weights] == ["float32"] * 4
    assert [g.dtype for g in grads[1:]] == ["float32", "float32"]
    xl = rounded(x, low)                           # what the layer receives
    check_close(y, ref_norm(xl, (0,), 1.0, 0.0, 1e-3), low)
    # float32 statistics of the 16-bit input: float32's accuracy, not 16-bit's
    close32(layer.moving_mean, 0.5 * xl.mean(0))
    close32(layer.moving_variance, 0.5 + 0.5 * xl.var(0))
    # the output's gradient reaches the layer in 16 bits, its weights' in float32
    _, rdg, rdb = ref_grads(xl, (0,), np.ones((1, 5)), rounded(dy, low), 1e-3)
    check_close(grads[1], rdg, low)
    check_close(grads[2], rdb, low)
    out = layer(x, training=False)
    assert out.dtype == low
    check_close(out, ref_norm(xl, (0,), 1.0, 0.0, 1e-3, np.asarray(layer.moving_mean),
                              np.asarray(layer.moving_variance)), low)


def test_batch_norm_large_moving_variance_under_float16() -> None:
    # Keras 3: test_large_value_within_autocast_scope (70000 overflows float16)
    mp.set_global_policy("mixed_float16")
    layer = layers.BatchNormalization()
    layer.build((1, 4, 4, 3))
    layer.moving_variance.assign(np.full(3, 70000.0, np.float32))
    np.testing.assert_array_equal(layer.moving_variance.numpy(), 70000.0)
    out = np.asarray(layer(np.full((1, 4, 4, 3), 300.0, np.float32))).astype(np.float64)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, 300 / np.sqrt(70000.001), rtol=2e-3)


@pytest.mark.parametrize("axis,shape", [(-1, (5, 2, 3)), (1, (5, 3, 3, 2))])
def test_batch_norm_correctness_keras(axis: int, shape: tuple) -> None:
    # Keras 3: BatchNormalizationTest.test_correctness (without the masking part)
    layer = layers.BatchNormalization(axis=axis, momentum=0)
    x = RNG.normal(loc=5.0, scale=10.0, size=shape)
    out = x
    for _ in range(3):
        out = layer(out, training=True)
    red = tuple(i for i in range(len(shape)) if i != axis % len(shape))
    out = np.asarray(out)
    np.testing.assert_allclose(out.mean(red), 0.0, atol=1e-3)
    np.testing.assert_allclose(out.std(red), 1.0, atol=1e-3)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.0, atol=1e-3)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 1.0, atol=1e-3)
    inference, training = layer(x, training=False), layer(x, training=True)
    assert not np.allclose(np.asarray(inference), np.asarray(training), atol=1e-3)
    training = layer(x, training=True)          # momentum 0: now the moving stats are x's
    np.testing.assert_allclose(np.asarray(layer(x, training=False)), np.asarray(training),
                               rtol=1e-4, atol=1e-4)


def test_batch_norm_frozen_runs_in_inference_mode() -> None:
    # Keras 3: test_trainable_behavior
    layer = layers.BatchNormalization(axis=-1, momentum=0.8, epsilon=1e-7)
    layer.build((1, 4, 4, 3))
    layer.trainable = False
    assert (len(layer.weights), len(layer.trainable_weights),
            len(layer.non_trainable_weights)) == (4, 0, 4)
    x = RNG.normal(loc=5.0, scale=10.0, size=(200, 4, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(layer(x, training=True)), x, rtol=1e-6)
    np.testing.assert_array_equal(layer.moving_mean.numpy(), 0.0)
    layer.trainable = True
    assert (len(layer.trainable_weights), len(layer.non_trainable_weights)) == (2, 2)
    assert [v.name.split("/")[-1] for v in layer.weights] == [
        "gamma", "beta", "moving_mean", "moving_variance"]
    assert [v.trainable for v in layer.weights] == [True, True, False, False]
    out = np.asarray(layer(x, training=True))
    np.testing.assert_allclose(out.mean((0, 1, 2)), 0.0, atol=1e-3)
    np.testing.assert_allclose(out.std((0, 1, 2)), 1.0, atol=1e-3)


@pytest.mark.parametrize("center,scale,trainable", [(True, True, 2), (False, False, 0),
                                                    (True, False, 1)])
def test_batch_norm_basics(center: bool, scale: bool, trainable: int) -> None:
    # Keras 3: test_bn_basics
    layer = layers.BatchNormalization(center=center, scale=scale)
    assert layer(RNG.standard_normal((2, 3)), training=True).shape == (2, 3)
    assert len(layer.trainable_weights) == trainable
    assert len(layer.non_trainable_weights) == 2


def _bn_model(policy: str) -> mp.Model:
    mp.set_global_policy(policy)
    mp.random.set_seed(11)
    inputs = mp.Input((4, 3))
    x = layers.BatchNormalization(momentum=0.9)(inputs)
    x = layers.Dense(6, activation="relu")(layers.Flatten()(x))
    x = layers.BatchNormalization(axis=1)(x)
    return mp.Model(inputs, layers.Activation("softmax", dtype="float32")(layers.Dense(3)(x)))


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_traced_fit_moving_stats_equal_eager_bit_for_bit(policy: str) -> None:
    x = (RNG.standard_normal((48, 4, 3)) * 2 + 1).astype(np.float32)
    y = RNG.integers(0, 3, 48)
    runs = []
    for jit in (False, True):
        model = _bn_model(policy)
        initial = [v.numpy() for v in model.non_trainable_weights]
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      jit_compile=jit)
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)     # 12 steps
        stats = [v.numpy() for v in model.non_trainable_weights]
        assert len(stats) == 4 and all(not np.array_equal(a, b)
                                       for a, b in zip(stats, initial))
        if jit:
            traced = model._traced["train"]
            assert traced.eager_reason is None and traced.tracing_count == 1
        runs.append((stats, model.get_weights()))
    (eager_stats, eager_w), (traced_stats, traced_w) = runs
    for a, b in zip(eager_stats + eager_w, traced_stats + traced_w):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_mp_function_step_replays_moving_stat_updates() -> None:
    layer = layers.BatchNormalization(momentum=0.5)
    xs = [RNG.standard_normal((8, 3)).astype(np.float32) for _ in range(4)]
    layer.build((8, 3))

    def step(x: Any) -> Any:
        return layer(x, training=True)

    eager = [np.asarray(step(mp.constant(x))) for x in xs]
    eager_stats = [layer.moving_mean.numpy(), layer.moving_variance.numpy()]
    for v, value in zip(layer.non_trainable_weights, ([0.0] * 3, [1.0] * 3)):
        v.assign(np.asarray(value, np.float32))
    traced = mp.function(step)
    outs = [np.asarray(traced(mp.constant(x))) for x in xs]
    outs += [layer.moving_mean.numpy(), layer.moving_variance.numpy()]
    for a, b in zip(eager + eager_stats, outs):
        assert np.array_equal(a, b)


BN_KERAS_KEYS = {"name", "trainable", "dtype", "axis", "momentum", "epsilon", "center", "scale",
                 "beta_initializer", "gamma_initializer", "moving_mean_initializer",
                 "moving_variance_initializer", "beta_regularizer", "gamma_regularizer",
                 "beta_constraint", "gamma_constraint", "synchronized", "renorm",
                 "renorm_clipping", "renorm_momentum"}


def test_batch_norm_config_round_trip() -> None:
    layer = layers.BatchNormalization(axis=1, momentum=0.8, epsilon=1e-5, center=False,
                                      moving_variance_initializer="zeros",
                                      dtype="mixed_bfloat16", name="bn")
    config = layer.get_config()
    assert set(config) == BN_KERAS_KEYS
    assert (config["axis"], config["momentum"], config["epsilon"], config["center"],
            config["moving_variance_initializer"]) == (1, 0.8, 1e-5, False, "zeros")
    again = layers.BatchNormalization.from_config(config)
    assert again.get_config() == config and again.dtype_policy == mp.Policy("mixed_bfloat16")
    assert layers.BatchNormalization(**{**config, "dtype": "float32"}).momentum == 0.8
    again(np.ones((2, 3, 2), np.float32))
    np.testing.assert_array_equal(again.moving_variance.numpy(), 0.0)


def test_batch_norm_bad_input_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="axis must be one int"):
        layers.BatchNormalization(axis=[1, 2])
    with pytest.raises(NotImplementedError, match=r"gamma_regularizer='l2'.*default"):
        layers.BatchNormalization(gamma_regularizer="l2")
    with pytest.raises(NotImplementedError, match="synchronized=True"):
        layers.BatchNormalization(synchronized=True)
    layer = layers.BatchNormalization(axis=2)
    with pytest.raises(ValueError, match=r"axis 2 is out of range .*rank 2.*-2\.\.1"):
        layer(np.ones((2, 3), np.float32))
    assert layer.weights == []                   # refused before any weight was made
    layer = layers.BatchNormalization()
    layer(np.ones((2, 3), np.float32), training=True)
    with pytest.raises(ValueError, match="rank 2"):
        layer(np.ones((2, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"axis 1 of its input to be 3 \(built for \(2, 3\)\)"):
        layer(np.ones((2, 4), np.float32))


def test_batch_norm_symbolic_shapes_and_dtypes() -> None:
    mp.set_global_policy("mixed_float16")
    inputs = mp.Input((5, 4))
    layer = layers.BatchNormalization(axis=1)
    out = layer(inputs)
    assert out.shape == (None, 5, 4) and out.dtype == "float16"
    assert [v.shape for v in layer.weights] == [(5,)] * 4
    np.testing.assert_array_equal(layer.moving_mean.numpy(), 0.0)   # shape inference: no update


# --- LayerNormalization ---------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((3, 4, 5), [1, 2]), ((3, 4, 5), 1),
                                        ((2, 3, 4, 2), [-3, -1])])
def test_layer_norm_forward_and_gradient(backend: mp.Backend, shape: tuple, axis: Any) -> None:
    layer = layers.LayerNormalization(axis=axis)
    x = (RNG.standard_normal(shape) * 2 + 3).astype(np.float32)
    layer.build(x.shape)
    w = randomize(layer)
    axes = tuple(layer.axis)
    bs = bshape(shape, axes)
    gamma, beta = w["gamma"].reshape(bs), w["beta"].reshape(bs)
    dy = RNG.standard_normal(shape)
    y, (dx, dgamma, dbeta) = grads_of(layer, x, dy, training=False)
    x64 = x.astype(np.float64)
    close32(y, ref_norm(x64, axes, gamma, beta, 1e-3))
    rdx, rdg, rdb = ref_grads(x64, axes, gamma, dy, 1e-3)
    close32(dx, rdx)
    close32(dgamma, rdg.reshape(dgamma.shape))
    close32(dbeta, rdb.reshape(dbeta.shape))


@pytest.mark.parametrize("policy", list(LOW))
def test_layer_norm_mixed_computes_in_float32(policy: str) -> None:
    mp.set_global_policy(policy)
    low = LOW[policy]
    layer = layers.LayerNormalization()
    x = (100.0 + RNG.standard_normal((4, 32))).astype(np.float32)
    dy = RNG.standard_normal(x.shape)
    y, grads = grads_of(layer, x, dy, training=True)
    assert y.dtype == low and [v.dtype for v in layer.weights] == ["float32"] * 2
    assert [g.dtype for g in grads[1:]] == ["float32", "float32"]
    xl = rounded(x, low)
    check_close(y, ref_norm(xl, (1,), 1.0, 0.0, 1e-3), low)
    _, rdg, rdb = ref_grads(xl, (1,), np.ones((1, 32)), rounded(dy, low), 1e-3)
    check_close(grads[1], rdg, low)
    check_close(grads[2], rdb, low)


def test_layer_norm_output_keras() -> None:
    # Keras 3: LayerNormalizationTest.test_output and test_output_with_rms_scaling
    layer = layers.LayerNormalization(dtype="float32", beta_initializer="ones",
                                      gamma_initializer="ones")
    out = layer(np.arange(5, dtype=np.float32)[None, :])
    np.testing.assert_allclose(np.asarray(out), [[-0.41386, 0.29307, 1.0, 1.70693, 2.41386]],
                               rtol=1e-5, atol=1e-5)
    with pytest.warns(UserWarning, match="rms_scaling=True.*deprecated"):
        layer = layers.LayerNormalization(dtype="float32", rms_scaling=True,
                                          gamma_initializer="ones")
    out = layer(np.arange(5, dtype=np.float32)[None, :])
    np.testing.assert_allclose(np.asarray(out), [[0.0, 0.70693, 1.41386, 2.12079, 2.82772]],
                               rtol=1e-5, atol=1e-5)
    assert layer.beta is None and len(layer.trainable_weights) == 1


def test_layer_norm_axes_keras() -> None:
    # Keras 3: test_unsorted_axis, test_axis_is_canonicalized, test_ln_basics
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    sorted_, unsorted = (layers.LayerNormalization(axis=[-2, -1]),
                         layers.LayerNormalization(axis=[-1, -2]))
    np.testing.assert_array_equal(np.asarray(sorted_(x)), np.asarray(unsorted(x)))
    layer = layers.LayerNormalization(axis=-1)
    layer.build((2, 4))
    assert layer.axis == [1]
    layer = layers.LayerNormalization(axis=(-3, -2, -1))
    assert layer(RNG.standard_normal((2, 8, 8, 3))).shape == (2, 8, 8, 3)
    assert layer.gamma.shape == (8, 8, 3)
    layer = layers.LayerNormalization(scale=False, center=False)
    assert layer(x).shape == x.shape and layer.weights == []


def test_layer_norm_bad_input_is_a_clear_error() -> None:
    # Keras 3: test_invalid_axis, test_out_of_bounds_axis, test_duplicate_axis
    with pytest.raises(TypeError, match="an int or a list/tuple of ints"):
        layers.LayerNormalization(axis={"axis": -1})
    x = np.zeros((2, 4), np.float32)
    for axis in (2, 99, -3, [0, 99]):
        with pytest.raises(ValueError, match=r"is out of bounds .*valid axes are -2\.\.1"):
            layers.LayerNormalization(axis=axis)(x)
    for axis in ([-1, 1], [1, 1]):
        with pytest.raises(ValueError, match="duplicate axes"):
            layers.LayerNormalization(axis=axis)(x)
    with pytest.raises(NotImplementedError, match="beta_constraint"):
        layers.LayerNormalization(beta_constraint="non_neg")
    layer = layers.LayerNormalization()
    layer(x)
    with pytest.raises(ValueError, match="rank 2"):
        layer(np.zeros((2, 3, 4), np.float32))


def test_layer_norm_config_round_trip() -> None:
    layer = layers.LayerNormalization(axis=[1, 2], epsilon=1e-5, center=False,
                                      dtype="mixed_float16")
    config = layer.get_config()
    assert set(config) == {"name", "trainable", "dtype", "axis", "epsilon", "center", "scale",
                           "rms_scaling", "beta_initializer", "gamma_initializer",
                           "beta_regularizer", "gamma_regularizer", "beta_constraint",
                           "gamma_constraint"}
    again = layers.LayerNormalization.from_config(config)
    assert again.get_config() == config and again.compute_dtype == "float16"
    from mpcore.layers.core import LayerNormalization  # its first home still works

    assert LayerNormalization is layers.LayerNormalization
