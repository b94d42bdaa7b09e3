"""Gradient clipping (Keras' clipnorm, clipvalue, global_clipnorm on every optimizer): the
clipped gradients against NumPy, unchanged below the threshold, the same under loss scaling as
without it, nothing clipped or applied on a skipped step, the fused and the composite update
agreeing, and bad arguments named with their valid range."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.optimizers import clipping

GRADS = [np.array([3.0, 4.0], np.float32), np.array([[0.5, -12.0], [1.0, 0.0]], np.float32)]


def step(optimizer: Any, grads: list[np.ndarray], fused: bool = True) -> list[np.ndarray]:
    """The variables' change after one SGD(lr=1) step from zeros: minus what was applied."""
    variables = [mp.Variable(np.zeros_like(g)) for g in grads]
    optimizer.use_fused_kernels = fused
    optimizer.apply_gradients(zip([mp.constant(g) for g in grads], variables))
    return [-v.numpy() for v in variables]


@pytest.mark.parametrize("fused", [True, False])
def test_clipvalue(fused: bool) -> None:
    out = step(mp.optimizers.SGD(1.0, clipvalue=2.0), GRADS, fused)
    for o, g in zip(out, GRADS):
        np.testing.assert_array_equal(o, np.clip(g, -2.0, 2.0))


@pytest.mark.parametrize("fused", [True, False])
def test_clipnorm_clips_each_gradient_to_its_own_norm(fused: bool) -> None:
    out = step(mp.optimizers.SGD(1.0, clipnorm=1.0), GRADS, fused)
    for o, g in zip(out, GRADS):
        norm = np.linalg.norm(g)
        np.testing.assert_allclose(o, g / max(norm, 1.0), rtol=1e-6)
        assert np.linalg.norm(o) <= 1.0 + 1e-6


def test_global_clipnorm_scales_all_gradients_together() -> None:
    out = step(mp.optimizers.SGD(1.0, global_clipnorm=5.0), GRADS)
    total = np.sqrt(sum(float(np.sum(g * g)) for g in GRADS))
    for o, g in zip(out, GRADS):
        np.testing.assert_allclose(o, g * (5.0 / total), rtol=1e-6)
    unchanged = step(mp.optimizers.SGD(1.0, global_clipnorm=100.0), GRADS)
    for o, g in zip(unchanged, GRADS):
        np.testing.assert_array_equal(o, g)            # below the threshold: exactly the same


def test_zero_gradients_stay_zero() -> None:
    for option in ("clipnorm", "global_clipnorm"):
        (out,) = step(mp.optimizers.SGD(1.0, **{option: 1.0}), [np.zeros(3, np.float32)])
        assert np.array_equal(out, np.zeros(3)) and np.isfinite(out).all()


@pytest.mark.parametrize("option", clipping.OPTIONS)
def test_under_loss_scaling_it_clips_the_unscaled_gradients(option: str) -> None:
    plain = step(mp.optimizers.Adam(0.1, **{option: 1.5}), GRADS)
    lso = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.Adam(0.1, **{option: 1.5}),
                                                mp.FixedLossScale(1024))
    variables = [mp.Variable(np.zeros_like(g)) for g in GRADS]
    scaled = [mp.constant(g * 1024) for g in GRADS]
    lso.get_scaled_loss(mp.constant(1.0))
    unscaled = lso.get_unscaled_gradients(scaled)
    assert lso.apply_gradients(zip(unscaled, variables))
    for v, p in zip(variables, plain):
        np.testing.assert_array_equal(-v.numpy(), p)


def test_a_skipped_step_clips_and_applies_nothing() -> None:
    lso = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(1.0, global_clipnorm=1.0))
    variables = [mp.Variable(np.ones_like(g)) for g in GRADS]
    bad = [mp.constant(GRADS[0]), mp.constant(np.full((2, 2), np.inf, np.float32))]
    lso.get_scaled_loss(mp.constant(1.0))
    assert not lso.apply_gradients(zip(lso.get_unscaled_gradients(bad), variables))
    for v in variables:
        np.testing.assert_array_equal(v.numpy(), np.ones_like(v.numpy()))


@pytest.mark.parametrize("kwargs", [{"clipnorm": 0.0}, {"clipnorm": -1.0},
                                    {"clipvalue": float("inf")}, {"global_clipnorm": "1"},
                                    {"clipvalue": True}])
def test_bad_thresholds_name_the_valid_range(kwargs: dict[str, Any]) -> None:
    (name,) = kwargs
    with pytest.raises(ValueError, match=f"{name} must be a finite number > 0"):
        mp.optimizers.RMSprop(**kwargs)


def test_only_one_kind_of_clipping() -> None:
    with pytest.raises(ValueError, match="only one of clipnorm, clipvalue, global_clipnorm"):
        mp.optimizers.SGD(clipnorm=1.0, global_clipnorm=2.0)


@pytest.mark.parametrize("cls", [mp.optimizers.SGD, mp.optimizers.RMSprop, mp.optimizers.Adam,
                                 mp.optimizers.AdamW])
def test_every_optimizer_takes_and_keeps_the_option(cls: Any) -> None:
    opt = cls(clipnorm=0.5)
    again = cls.from_config(opt.get_config())
    assert again.clipping == ("clipnorm", 0.5) and again.get_config() == opt.get_config()
