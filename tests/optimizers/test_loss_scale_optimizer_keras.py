"""LossScaleOptimizer as tf-keras and Keras 3 have it (issue 33, item 7): ``minimize`` and
``compute_gradients`` scale and unscale, tf-keras' scaling warnings and attributes, one wrapper
per optimizer, checkpoints across LossScaleOptimizer and plain optimizers, and compile honouring
a policy's loss scale. Each ported case names its source: tf-keras'
``tf_keras/mixed_precision/loss_scale_optimizer_test.py`` ("tf-keras") or Keras 3's
``keras/src/optimizers/loss_scale_optimizer_test.py`` ("Keras 3")."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import numpy as np
import pytest

import mpcore as mp

LSO = mp.mixed_precision.LossScaleOptimizer


def _sum(x: mp.Tensor) -> mp.Tensor:
    return mp.ops.sum(x)


# --- minimize and compute_gradients scale and unscale --------------------------------------
def test_fixed_loss_scale_applied_to_loss_with_minimize() -> None:
    """tf-keras testFixedLossScaleAppliedToLossWithMinimize: the gradient the tape sees is the
    scaled one; the update the unscaled one (5 - 1 * 2 == 3)."""
    var = mp.Variable([5.0])
    opt = LSO(mp.optimizers.SGD(2.0), dynamic=False, initial_scale=10.0)
    assert float(opt.loss_scale) == 10.0
    pairs = opt.compute_gradients(lambda: _sum(var), [var])
    assert pairs[0][1] is var and float(pairs[0][0].numpy()[0]) == 1.0
    opt.minimize(lambda: _sum(var), var_list=[var])
    np.testing.assert_array_equal(var.numpy(), [3.0])


def test_minimize_keeps_float16_gradients_from_underflowing() -> None:
    """The defect: minimize was the plain optimizer's, so a float16 gradient of 2**-26 flushed
    to zero; scaled by 2**15 it is 2**-11 in float16, unscaled in float32."""
    a = mp.constant(2.0**-13, dtype="float16")

    def loss(var: mp.Variable) -> mp.Tensor:
        return _sum(mp.ops.cast(var, "float16") * a * a)

    plain, scaled = mp.Variable([1.0]), mp.Variable([1.0])
    mp.optimizers.SGD(1.0).minimize(lambda: loss(plain), [plain])
    LSO(mp.optimizers.SGD(1.0)).minimize(lambda: loss(scaled), [scaled])
    assert plain.numpy()[0] == 1.0                         # underflowed: no update
    assert scaled.numpy()[0] == np.float32(1.0 - 2.0**-26)


def test_dynamic_update_with_minimize() -> None:
    """tf-keras testDynamicUpdate: a finite step applies and doubles the scale (growth 1); a
    NaN step leaves the variable and halves it."""
    var = mp.Variable([1.0, 2.0])
    opt = LSO(mp.optimizers.SGD(1.0), initial_scale=2, dynamic_growth_steps=1)
    opt.minimize(lambda: var * 2.0, var_list=[var])
    np.testing.assert_array_equal(var.numpy(), [-1.0, 0.0])
    assert float(opt.loss_scale) == 4.0
    opt.minimize(lambda: var * float("nan"), var_list=[var])
    np.testing.assert_array_equal(var.numpy(), [-1.0, 0.0])
    assert float(opt.loss_scale) == 2.0


def test_compute_gradients_with_a_tape_and_a_tensor_loss() -> None:
    """tf-keras' compute_gradients(loss, var_list, tape): a tensor loss is scaled on the tape
    that computed it; without the tape it is tf-keras' error."""
    var = mp.Variable([3.0])
    opt = LSO(mp.optimizers.SGD(1.0), dynamic=False, initial_scale=8.0)
    tape = mp.GradientTape()
    with tape:
        loss = _sum(var * var)
    (grad, got), = opt.compute_gradients(loss, [var], tape=tape)
    assert got is var and float(grad.numpy()[0]) == 6.0
    with pytest.raises(ValueError, match="`tape` is required when a `Tensor` loss is passed"):
        opt.compute_gradients(loss, [var])


def test_var_list_may_be_a_callable() -> None:
    var = mp.Variable([1.0])
    mp.optimizers.SGD(0.5).minimize(lambda: _sum(var * 4.0), lambda: [var])
    np.testing.assert_array_equal(var.numpy(), [-1.0])


# --- attributes ---------------------------------------------------------------------------
def test_dynamic_attrs_with_fixed_loss_scale() -> None:
    """tf-keras testDynamicAttrsWithFixedLossScale."""
    opt = LSO(mp.optimizers.SGD(), dynamic=False, initial_scale=2.0)
    assert not opt.dynamic
    assert opt.dynamic_counter is None and opt.dynamic_growth_steps is None


def test_dynamic_loss_scale_default_values_and_counter() -> None:
    """tf-keras testDynamicLossScaleDefaultValues and testDynamicLossScale's counter checks."""
    opt = LSO(mp.optimizers.SGD())
    assert opt.initial_scale == 2**15 and opt.dynamic_growth_steps == 2000
    assert opt.dynamic_counter == 0 and float(opt.loss_scale) == 2**15
    var = mp.Variable([1.0])
    opt = LSO(mp.optimizers.SGD(), initial_scale=2, dynamic_growth_steps=3)
    assert isinstance(opt.initial_scale, float) and isinstance(opt.dynamic_growth_steps, int)
    for expected in (1, 2, 0):
        opt.minimize(lambda: _sum(var), [var])
        assert opt.dynamic_counter == expected
    assert float(opt.loss_scale) == 4.0
    assert opt.inner_optimizer.iterations == opt.iterations == 3


def test_get_scaled_loss() -> None:
    """tf-keras testGetScaledLoss: tensors and callables, float32 and float16."""
    opt = LSO(mp.optimizers.SGD(), dynamic=False, initial_scale=2.0)
    for dtype in ("float32", "float16"):
        loss = mp.constant(5.0, dtype=dtype)
        assert float(opt.get_scaled_loss(loss).numpy()) == 10.0
        assert float(opt.get_scaled_loss(lambda loss=loss: loss)().numpy()) == 10.0
        assert opt.get_scaled_loss(loss).dtype == dtype


def test_get_unscaled_gradients() -> None:
    """tf-keras testGetUnscaledGradients."""
    opt = LSO(mp.optimizers.SGD(), dynamic=False, initial_scale=2)
    grads = opt.get_unscaled_gradients([mp.constant(3.0), None,
                                        mp.constant(-4.0, dtype="float16")])
    assert [None if g is None else float(g.numpy()) for g in grads] == [1.5, None, -2.0]


def test_name_and_inner_optimizer() -> None:
    """Keras 3 test_config (``name=``) and tf-keras' inner_optimizer."""
    inner = mp.optimizers.SGD(0.5)
    opt = LSO(inner, name="lso")
    assert opt.name == "lso" and opt.inner_optimizer is inner
    assert LSO(mp.optimizers.SGD()).name == "LossScaleOptimizer(SGD)"
    with pytest.raises(ValueError, match="name must be a string or None"):
        LSO(mp.optimizers.SGD(), name=3)  # type: ignore[arg-type]


def test_iterations_update() -> None:
    """Keras 3 test_iterations_update: every applied step counts; a skipped one does not
    (Keras 3's rule, tests/optimizers/test_loss_scale_iterations.py)."""
    var = mp.Variable([1.0, 2.0, 3.0, 4.0])
    opt = LSO(mp.optimizers.SGD(0.5))
    assert opt.iterations == 0
    for step in (1, 2):
        opt.minimize(lambda: _sum(var), [var])
        assert opt.iterations == step
    opt.minimize(lambda: _sum(var * mp.constant(float("inf"))), [var])
    assert opt.iterations == 2 and opt.skipped_steps == 1


# --- warnings and errors ------------------------------------------------------------------
def _warned(opt: LSO, scale: bool, unscale: bool) -> list[str]:
    var = mp.Variable(1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if scale:
            opt.get_scaled_loss(mp.constant(1.0))
        grads = [mp.constant(1.0)]
        if unscale:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, [var]))
    return [str(w.message) for w in caught]


def test_scaling_warning() -> None:
    """tf-keras testScalingWarning: which call was forgotten, in tf-keras' words."""
    (message,) = _warned(LSO(mp.optimizers.SGD()), False, False)
    assert ("You forgot to call LossScaleOptimizer.get_scaled_loss() and "
            "LossScaleOptimizer.get_unscaled_gradients() before") in message
    (message,) = _warned(LSO(mp.optimizers.SGD()), True, False)
    assert "You forgot to call LossScaleOptimizer.get_unscaled_gradients() before" in message
    (message,) = _warned(LSO(mp.optimizers.SGD()), False, True)
    assert "You forgot to call LossScaleOptimizer.get_scaled_loss() before" in message


def test_scaling_no_warning() -> None:
    """tf-keras testScalingNoWarning; and the warning comes once per optimizer, not per
    step."""
    assert _warned(LSO(mp.optimizers.SGD()), True, True) == []
    opt = LSO(mp.optimizers.SGD())
    assert len(_warned(opt, False, False)) == 1 and _warned(opt, False, False) == []


def test_error_when_nesting() -> None:
    """tf-keras testErrorWhenNesting."""
    with pytest.raises(TypeError, match="LossScaleOptimizer cannot wrap another "
                                        "LossScaleOptimizer"):
        LSO(LSO(mp.optimizers.SGD()))


def test_error_wrapping_same_optimizer_multiple_times() -> None:
    """tf-keras testErrorWrappingSameOptimizerMultipleTimes; a wrapper that is gone frees
    its optimizer."""
    inner = mp.optimizers.SGD()
    first = LSO(inner)
    with pytest.raises(ValueError, match=r'"inner_optimizer" is already wrapped by a '
                                         r"LossScaleOptimizer\."):
        LSO(inner)
    del first
    gc.collect()
    assert LSO(inner).inner_optimizer is inner


def test_error_when_wrapping_non_optimizer() -> None:
    """tf-keras testErrorWhenWrappingNonOptimizer."""
    with pytest.raises(TypeError, match=r'"inner_optimizer" must be an instance of '
                                        r"mp\.optimizers\.Optimizer, but got: 1"):
        LSO(1)  # type: ignore[arg-type]


# --- checkpoints across LossScaleOptimizer and plain optimizers ------------------------------
def _model(policy: str, seed: int = 0) -> mp.Model:
    mp.set_global_policy(policy)
    mp.random.set_seed(seed)
    inputs = mp.Input((6,))
    x = mp.layers.Dense(8, activation="relu")(inputs)
    outputs = mp.layers.Dense(3, dtype="float32")(x)
    model = mp.Model(inputs, outputs)
    model.compile(loss="mse", optimizer=mp.optimizers.Adam(0.01), jit_compile=False)
    return model


X = np.random.default_rng(7).standard_normal((16, 6)).astype(np.float32)
Y = np.random.default_rng(8).standard_normal((16, 3)).astype(np.float32)


@pytest.mark.parametrize("saved, restored", [("float32", "mixed_float16"),
                                             ("mixed_float16", "float32")])
def test_checkpoints_restore_across_loss_scale_and_plain_optimizers(
        tmp_path: Path, saved: str, restored: str) -> None:
    """A float32 run continues under mixed_float16 (the loss scale starts afresh) and the
    other way round (the scale is dropped): weights, slots and iterations carry over."""
    source = _model(saved)
    for _ in range(3):
        source.train_on_batch(X, Y)
    path = str(tmp_path / "run.mpck")
    source.save_checkpoint(path)
    target = _model(restored, seed=1)
    target.load_checkpoint(path)
    assert (source.optimizer.iterations, target.optimizer.iterations) == (3, 3)
    for a, b in zip(source.get_weights(), target.get_weights()):
        np.testing.assert_array_equal(a, b)
    inner = getattr(source.optimizer, "inner_optimizer", source.optimizer)
    other = getattr(target.optimizer, "inner_optimizer", target.optimizer)
    for va, vb in zip(inner.variables(), other.variables()):
        np.testing.assert_array_equal(va.numpy(), vb.numpy())
    if restored == "mixed_float16":
        assert target.optimizer.loss_scale == mp.DynamicLossScale()   # afresh
    target.train_on_batch(X, Y)
    assert target.optimizer.iterations == 4


# --- compile and the policy's loss scale -------------------------------------------------
def _dense_model(policy: mp.Policy, optimizer: object = "sgd") -> mp.Model:
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2, dtype=policy)])
    model.compile(loss="mse", optimizer=optimizer, jit_compile=False)
    return model


def test_compile_honours_a_bfloat16_policys_explicit_loss_scale() -> None:
    """The defect: Policy("mixed_bfloat16", loss_scale="dynamic")'s scale was dropped."""
    mp.set_global_policy(mp.Policy("mixed_bfloat16", loss_scale="dynamic"))
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert isinstance(model.optimizer, LSO) and model.optimizer.dynamic
    mp.set_global_policy(mp.Policy("float32", loss_scale=128))
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert not model.optimizer.dynamic and float(model.optimizer.loss_scale) == 128.0
    mp.set_global_policy("mixed_bfloat16")          # no loss scale given: none, as Keras
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert not isinstance(model.optimizer, LSO)


def test_an_explicit_policy_loss_scale_follows_the_first_models_training() -> None:
    """The decision (mpcore.optimizers.loss_scale_optimizer.for_policy): an explicit dynamic
    scale is the first compile's own, so policy.loss_scale shows training; later compiles get
    copies."""
    policy = mp.Policy("mixed_float16", loss_scale=mp.DynamicLossScale(4.0, increment_period=1))
    mp.set_global_policy(policy)
    first = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    first.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert first.optimizer.loss_scale is policy.loss_scale
    first.train_on_batch(np.ones((2, 4), np.float32), np.ones((2, 2), np.float32))
    assert float(policy.loss_scale) == 8.0
    second = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    second.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert second.optimizer.loss_scale is not policy.loss_scale
    assert float(second.optimizer.loss_scale) == 4.0          # the configuration, afresh


def test_the_default_loss_scale_is_a_copy_per_compile() -> None:
    """Policy("mixed_float16")'s default scale: the global policy is every model's, so each
    compile trains its own copy (TF 2.4+, Keras 3) and the policy's stays the configuration."""
    mp.set_global_policy("mixed_float16")
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd", jit_compile=False)
    assert model.optimizer.loss_scale is not mp.global_policy().loss_scale
    assert model.optimizer.loss_scale == mp.global_policy().loss_scale


def test_compiling_again_with_the_same_optimizer_keeps_its_wrapper() -> None:
    mp.set_global_policy("mixed_float16")
    opt = mp.optimizers.SGD()
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(2)])
    model.compile(loss="mse", optimizer=opt, jit_compile=False)
    wrapper = model.optimizer
    model.compile(loss="mean_squared_error", optimizer=opt, jit_compile=False)
    assert model.optimizer is wrapper and wrapper.inner_optimizer is opt
