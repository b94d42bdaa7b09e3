"""Dense under mixed_float8: its scaling state (Keras 3's variables), the recipes' bookkeeping
(ports of Keras 3's ``test_quantize_float8`` and ``test_quantize_float8_inference``,
keras/src/layers/core/dense_test.py, and of Transformer Engine's
``test_fp8_scale_update_with_linear_module``, tests/pytorch/test_recipe.py), traced steps
equal to eager ones bit for bit, and training (a tiny problem here, MNIST when slow)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import mpcore as mp
from mpcore.mixed_precision import CurrentScaling, DelayedScaling

NAMES = ["inputs_scale", "inputs_amax_history", "kernel_scale", "kernel_amax_history",
         "outputs_grad_scale", "outputs_grad_amax_history"]
F32 = np.float32


def _layer(recipe: Any = None, units: int = 32, in_dim: int = 16, **kwargs: Any) -> Any:
    layer = mp.layers.Dense(units, dtype=mp.Policy("mixed_float8", float8_recipe=recipe),
                            **kwargs)
    layer.build((None, in_dim))
    return layer


def _state(layer: Any) -> dict[str, np.ndarray]:
    return {v.name.split("/")[-1]: v.numpy() for v in layer.non_trainable_weights}


def _step(layer: Any, opt: Any) -> Callable[[Any, Any], Any]:
    def step(x: Any, dy: Any) -> Any:
        with mp.GradientTape() as tape:
            y = layer(x, training=True)
            loss = mp.ops.sum(mp.ops.cast(y, "float32") * dy)
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        return loss
    return step


def _bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(F32)


def _te_scale(amax: F32, scale: F32, fp8_max: float, margin: int = 0) -> F32:
    """Transformer Engine's _default_sf_compute, in float32."""
    if not (amax > 0 and np.isfinite(amax)):
        return scale
    return F32(F32(F32(fp8_max) / amax) / F32(2.0 ** margin))


def _rolled(history: np.ndarray, amax: F32) -> np.ndarray:
    out = np.roll(history, -1)
    out[0] = amax
    return out


def test_the_layer_has_keras_3s_variables() -> None:
    layer = _layer()
    assert [v.name.split("/")[-1] for v in layer.non_trainable_weights] == NAMES
    assert len(layer.trainable_weights) == 2
    assert all(v.dtype == "float32" for v in layer.weights)
    state = _state(layer)
    assert state["inputs_scale"] == 1.0 and state["kernel_amax_history"].shape == (1,)
    assert _state(_layer(DelayedScaling()))["outputs_grad_amax_history"].shape == (1024,)
    plain = mp.layers.Dense(4, dtype="mixed_bfloat16")
    plain.build((None, 3))
    assert not plain.non_trainable_weights


def test_keras_quantize_float8_bookkeeping() -> None:
    """Keras 3's test_quantize_float8 (delayed scaling, history 1024, amax by max): after each
    step the variables hold the scale from the history before it, and the history with the
    step's amax rolled in. Keras keeps reciprocal scales; mpcore keeps multipliers."""
    layer = _layer(DelayedScaling())
    step = _step(layer, mp.optimizers.AdamW(learning_rate=0.1))
    rng = np.random.default_rng(0)
    sx = sk = sg = F32(1)
    hx, hk, hg = (np.zeros(1024, F32) for _ in range(3))
    for _ in range(3):
        x = rng.standard_normal((16, 16)).astype(F32)
        g = rng.standard_normal((16, 32)).astype(F32)
        k = layer.kernel.numpy()
        sx, sk, sg = (_te_scale(np.max(h), s, m) for h, s, m in
                      ((hx, sx, 448.0), (hk, sk, 448.0), (hg, sg, 57344.0)))
        hx = _rolled(hx, np.max(np.abs(_bf16(x))))
        hk = _rolled(hk, np.max(np.abs(k)))
        hg = _rolled(hg, np.max(np.abs(_bf16(g))))   # the gradient reaches the GEMM in bfloat16
        step(mp.constant(x), mp.constant(g))
        state = _state(layer)
        for name, want in (("inputs_amax_history", hx), ("kernel_amax_history", hk),
                           ("outputs_grad_amax_history", hg), ("inputs_scale", sx),
                           ("kernel_scale", sk), ("outputs_grad_scale", sg)):
            np.testing.assert_array_equal(state[name], want, err_msg=name)
    assert state["inputs_scale"] != 1.0   # the scales moved after the first step


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [31, 1024])
def test_transformer_engine_scale_update(algo: str, length: int) -> None:
    """TE's test_fp8_scale_update_with_linear_module (margin 2, HYBRID): with histories and
    scales set at random, one step's scales are fp8_max / reduce(history) / 2**margin and the
    histories roll by one with the step's amaxes at [0]."""
    layer = _layer(DelayedScaling(length, algo, margin=2), units=16)
    rng = np.random.default_rng(length)
    before = {}
    for v in layer.non_trainable_weights:
        value = (2 * rng.random(v.shape) + 0.5).astype(F32)
        v.assign(value)
        before[v.name.split("/")[-1]] = value
    x = rng.standard_normal((16, 16)).astype(F32)
    g = rng.standard_normal((16, 16)).astype(F32)
    kernel = layer.kernel.numpy()
    _step(layer, mp.optimizers.SGD(0.0))(mp.constant(x), mp.constant(g))
    after = _state(layer)
    amaxes = {"inputs": np.max(np.abs(_bf16(x))), "kernel": np.max(np.abs(kernel)),
              "outputs_grad": np.max(np.abs(_bf16(g)))}
    for prefix, amax in amaxes.items():
        history = before[f"{prefix}_amax_history"]
        reduced = np.max(history) if algo == "max" else history[0]
        fp8_max = 57344.0 if prefix == "outputs_grad" else 448.0
        np.testing.assert_array_equal(after[f"{prefix}_scale"],
                                      _te_scale(reduced, before[f"{prefix}_scale"], fp8_max, 2))
        np.testing.assert_array_equal(after[f"{prefix}_amax_history"], _rolled(history, amax))


def test_current_scaling_keeps_this_steps_power_of_two_scale() -> None:
    layer = _layer(CurrentScaling())
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(F32) * 5
    _step(layer, mp.optimizers.SGD(0.0))(mp.constant(x), mp.constant(np.ones((8, 32), F32)))
    state = _state(layer)
    amax = np.max(np.abs(_bf16(x)))
    assert state["inputs_amax_history"][0] == amax
    assert state["inputs_scale"] == 2.0 ** np.floor(np.log2(448.0 / amax))
    assert state["outputs_grad_scale"] == 2.0 ** 15    # |g| = 1: 57344 / 1 rounded down
    kernel_amax = np.max(np.abs(layer.kernel.numpy()))   # the float32 kernel's, not bf16's
    assert state["kernel_amax_history"][0] == kernel_amax
    assert state["kernel_scale"] == 2.0 ** np.floor(np.log2(448.0 / kernel_amax))


def test_keras_quantize_float8_inference() -> None:
    """Keras 3's test: training=False gives what training=True gives, and keeps the state."""
    layer = _layer(DelayedScaling(8), units=16, in_dim=8)
    x = mp.constant(np.random.default_rng(2).random((64, 8)))
    y_inference = layer(x, training=False)
    assert _state(layer)["inputs_amax_history"].max() == 0.0
    y_training = layer(x, training=True)
    np.testing.assert_array_equal(y_inference.numpy(), y_training.numpy())
    assert _state(layer)["inputs_amax_history"].max() > 0.0


def test_the_forward_pass_is_the_fp8_product() -> None:
    """y = bf16(decode(q(x)) @ decode(q(w)) / (sx * sw)) + bias, with power-of-two scales."""
    layer = _layer(units=8, in_dim=12, bias_initializer="ones")
    x = np.random.default_rng(3).standard_normal((5, 12)).astype(F32)
    y = layer(mp.constant(x), training=True).numpy().astype(F32)
    s = _state(layer)
    e4m3 = ml_dtypes.float8_e4m3fn
    qx = np.clip(_bf16(x) * s["inputs_scale"], -448, 448).astype(e4m3).astype(np.float64)
    qw = np.clip(layer.kernel.numpy() * s["kernel_scale"], -448, 448).astype(e4m3).astype(
        np.float64)
    want = (qx @ qw) / (float(s["inputs_scale"]) * float(s["kernel_scale"]))
    want = _bf16(_bf16(want.astype(F32)) + 1.0)
    np.testing.assert_allclose(y, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling(4, "most_recent")])
def test_a_traced_step_equals_the_eager_step_bit_for_bit(backend: mp.Backend,
                                                         recipe: Any) -> None:
    results = []
    for traced in (False, True):
        mp.random.set_seed(0)
        layer = _layer(recipe, units=8, in_dim=6)
        step = _step(layer, mp.optimizers.RMSprop(0.01))
        if traced:
            step = mp.function(step)
        rng = np.random.default_rng(4)
        for _ in range(4):
            step(mp.constant(rng.standard_normal((5, 6)).astype(F32)),
                 mp.constant(rng.standard_normal((5, 8)).astype(F32)))
        results.append([v.numpy() for v in layer.weights])
    for eager, traced_value in zip(*results):
        np.testing.assert_array_equal(eager, traced_value)


def _regression(policy: Any, epochs: int = 30) -> float:
    mp.random.set_seed(0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 8)).astype(F32)
    y = (x @ rng.standard_normal((8, 1)) + 0.5).astype(F32)
    with mp.policy_scope(policy):
        model = mp.Sequential([mp.Input((8,)), mp.layers.Dense(16, activation="relu"),
                               mp.layers.Dense(1)])
    model.compile(loss="mse", optimizer=mp.optimizers.Adam(0.01))
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)
    return float(history.history["loss"][-1]) / float(history.history["loss"][0])


def test_a_tiny_regression_trains_as_mixed_bfloat16_does() -> None:
    fp8 = _regression("mixed_float8")
    bf16 = _regression("mixed_bfloat16")
    assert fp8 < 0.1 and fp8 < bf16 * 3 + 0.02, (fp8, bf16)


@pytest.mark.slow  # 5 epochs, three times
def test_mnist_within_one_and_two_points_of_mixed_bfloat16(
        backend: mp.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's bar: the guide's model (its 10-wide output layer in mixed_bfloat16, as
    demo.build_model makes it under mixed_float8) within 1 point of mixed_bfloat16's test
    accuracy under current scaling, 2 points under delayed scaling."""
    from conftest import SHARED_MNIST, train_guide_on_mnist

    if not os.path.isdir(SHARED_MNIST):
        pytest.skip(f"no offline MNIST at {SHARED_MNIST}")
    monkeypatch.setenv("MPCORE_DATA_DIR", str(SHARED_MNIST))
    data = mp.datasets.mnist.load()
    _, bf16 = train_guide_on_mnist("mixed_bfloat16", data)
    for recipe, bar in ((CurrentScaling(), 0.01), (DelayedScaling(), 0.02)):
        model, fp8 = train_guide_on_mnist(mp.Policy("mixed_float8", float8_recipe=recipe),
                                          data)
        print(f"{backend.name}: mixed_bfloat16 {bf16:.4f}, mixed_float8 {recipe} {fp8:.4f}")
        assert fp8 >= 0.88 and bf16 - fp8 <= bar, (recipe, fp8, bf16)
        assert model.get_layer("dense_logits").dtype_policy.name == "mixed_bfloat16"
        hidden = [model.get_layer(name) for name in ("dense_1", "dense_2")]
        assert all(la.dtype_policy == mp.Policy("mixed_float8", float8_recipe=recipe)
                   and float(la.inputs_scale.numpy()) != 1.0 for la in hidden)


def test_keras_spellings() -> None:
    """Keras 3's test_quantize_float8_fitting, in part: layer.quantize("float8") on a built
    layer, then fit; model.quantize; the float8_from_mixed_bfloat16 dtype policy name."""
    layer = mp.layers.Dense(16, dtype="mixed_bfloat16")
    layer.build((None, 8))
    layer.quantize("float8")
    assert layer.dtype_policy.name == "mixed_float8"
    assert len(layer.trainable_weights) == 2 and len(layer.non_trainable_weights) == 6
    assert layer.kernel_amax_history is layer.non_trainable_weights[3]
    model = mp.Sequential([layer])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(6)
    x, y = rng.random((64, 8)).astype(F32), rng.random((64, 16)).astype(F32)
    model.fit(x, y, epochs=2, verbose=0)
    assert float(layer.inputs_scale.numpy()) != 1.0
    with mp.policy_scope("mixed_bfloat16"):
        other = mp.Sequential([mp.Input((8,)), mp.layers.Dense(4), mp.layers.Dense(2)])
    other.quantize("float8", float8_recipe=DelayedScaling(8))
    assert [la.dtype_policy for la in other.layers] == [
        mp.Policy("mixed_float8", float8_recipe=DelayedScaling(8))] * 2
    assert mp.layers.Dense(2, dtype="float8_from_mixed_bfloat16").dtype_policy.name == \
        "mixed_float8"
    with mp.policy_scope("mixed_bfloat16"):   # the guide's model: a float32 last layer stays
        inner = mp.Sequential([mp.Input((8,)), mp.layers.Dense(4)])
        outer = mp.Sequential([mp.Input((8,)), inner, mp.layers.Dense(2, dtype="float32")])
    outer.quantize("float8")
    assert inner.layers[0].dtype_policy.name == "mixed_float8"
    assert outer.layers[-1].dtype_policy.name == "float32"
    with pytest.raises(ValueError, match="no mixed_bfloat16 Dense layer"):
        outer.quantize("float8")


def test_quantize_refuses_what_it_cannot_do() -> None:
    layer = mp.layers.Dense(4)
    with pytest.raises(ValueError, match="must be built"):
        layer.quantize("float8")
    layer.build((None, 3))
    with pytest.raises(ValueError, match="mode must be 'float8'"):
        layer.quantize("int8")
    with pytest.raises(ValueError, match="float8_from_float32 is not supported"):
        layer.quantize("float8")
    fp8 = _layer()
    with pytest.raises(ValueError, match="already computes in float8"):
        fp8.quantize("float8")


def test_keras_float8_from_float32_policy_is_refused_saying_why() -> None:
    # it was "unknown policy", though the README names it as a Keras spelling mpcore refuses
    for make in (lambda: mp.Policy("float8_from_float32"),
                 lambda: mp.layers.Dense(2, dtype="float8_from_float32")):
        with pytest.raises(ValueError, match=r"'float8_from_float32' \(FP8 GEMMs in a float32 "
                                             r"model\) is not supported: use 'mixed_float8'"):
            make()
