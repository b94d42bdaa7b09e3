"""LossScaleOptimizer as TF 2.4+ and Keras 3 spell it (``dynamic``, ``initial_scale``,
``dynamic_growth_steps``, ``scale_loss``, ``float(opt.loss_scale)``, ``DTypePolicy``) beside TF
2.3's ``loss_scale``, which the guide's code uses. The scaling cases are ported from Keras 3's
``keras/src/optimizers/loss_scale_optimizer_test.py`` (test_finite_step, test_infinite_step,
test_upscaling, test_downscaling), written for mpcore's guide loop: the scaled gradients go
through ``get_unscaled_gradients`` before ``apply_gradients``."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp

LSO = mp.mixed_precision.LossScaleOptimizer
GRADS = np.array([1.0, 6.0, 7.0, 2.0], np.float32)


def _step(opt: LSO, v: mp.Variable, grads: np.ndarray) -> None:
    scaled = opt.get_scaled_loss(mp.constant(grads))   # the "loss" is the gradients
    opt.apply_gradients(zip(opt.get_unscaled_gradients([scaled]), [v]))


def test_finite_step() -> None:
    opt = LSO(mp.optimizers.SGD(0.5))
    v = mp.Variable([1.0, 2.0, 3.0, 4.0])
    _step(opt, v, GRADS)
    np.testing.assert_allclose(v.numpy(), [0.5, -1.0, -0.5, 3.0])


def test_infinite_step() -> None:
    opt = LSO(mp.optimizers.SGD(0.5))
    v = mp.Variable([1.0, 2.0, 3.0, 4.0])
    _step(opt, v, np.full(4, np.inf, np.float32))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_upscaling() -> None:
    opt = LSO(mp.optimizers.SGD(0.5), initial_scale=2.0, dynamic_growth_steps=2)
    v = mp.Variable([1.0, 2.0, 3.0, 4.0])
    for _ in range(8):
        _step(opt, v, GRADS)
    assert float(opt.loss_scale) == 32.0
    assert float(np.asarray(opt.scale_loss(mp.constant(1.0)))) == 32.0


def test_downscaling() -> None:
    opt = LSO(mp.optimizers.SGD(0.5), initial_scale=32.0)
    v = mp.Variable([1.0, 2.0, 3.0, 4.0])
    for _ in range(4):
        _step(opt, v, np.full(4, np.inf, np.float32))
    assert float(opt.loss_scale) == 2.0


def test_the_arguments_map_onto_loss_scales() -> None:
    default = LSO(mp.optimizers.SGD())
    assert default.dynamic and default.initial_scale == 2.0**15
    assert default.dynamic_growth_steps == 2000
    assert default.loss_scale == mp.DynamicLossScale()
    grown = LSO(mp.optimizers.SGD(), initial_scale=1024, dynamic_growth_steps=10)
    assert grown.loss_scale == mp.DynamicLossScale(1024, increment_period=10)
    fixed = LSO(mp.optimizers.SGD(), dynamic=False, initial_scale=128)
    assert not fixed.dynamic and fixed.initial_scale == 128.0
    assert fixed.dynamic_growth_steps is None and fixed.loss_scale == mp.FixedLossScale(128)
    old = LSO(mp.optimizers.SGD(), 256)            # TF 2.3's positional loss_scale
    assert not old.dynamic and float(old.loss_scale) == 256.0
    assert mp.DTypePolicy is mp.Policy is mp.mixed_precision.DTypePolicy


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dynamic": False}, ValueError, "initial_scale is required when dynamic=False"),
    ({"dynamic": False, "initial_scale": 8, "dynamic_growth_steps": 5}, ValueError,
     "dynamic_growth_steps applies to a dynamic loss scale only"),
    ({"loss_scale": "dynamic", "initial_scale": 8}, ValueError,
     r"give loss_scale \(TF 2.3\) or initial_scale \(TF 2.4\+, Keras 3\), not both"),
    ({"dynamic": "yes"}, TypeError, "dynamic must be True or False, got 'yes'"),
    ({"loss_scale": False}, TypeError, "pass dynamic=False by keyword"),
    ({"initial_scale": -1.0}, ValueError, "^initial_scale must be"),
    ({"dynamic_growth_steps": 0}, ValueError, "^dynamic_growth_steps must be an integer >= 1"),
    ({"dynamic": False, "initial_scale": float("inf")}, ValueError, "^initial_scale must be"),
])
def test_bad_arguments_say_what_is_valid(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        LSO(mp.optimizers.SGD(), **kwargs)


@pytest.mark.parametrize("grads", [None, 3.0])
def test_unscaling_something_other_than_a_list_of_gradients_says_what_it_takes(
        grads: object) -> None:
    with pytest.raises(TypeError, match=r"get_unscaled_gradients takes the list of gradients "
                                        r"\(tape.gradient\(scaled_loss, variables\)\), got "):
        LSO(mp.optimizers.SGD()).get_unscaled_gradients(grads)  # type: ignore[arg-type]
