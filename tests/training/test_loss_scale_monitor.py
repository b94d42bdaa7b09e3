"""LossScaleMonitor: per step the loss scale, whether the step was applied and, for a skipped
step, the variables whose gradients held Inf/NaN; History carries the series."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the Inf fed on purpose
def test_skipped_steps_name_the_variables_with_non_finite_gradients() -> None:
    mp.set_global_policy("mixed_float16")
    mp.random.set_seed(2)
    inputs = mp.Input((4,))
    hidden = layers.Dense(3, activation="relu", name="hidden")(inputs)
    model = mp.Model(inputs, layers.Activation("softmax", dtype="float32")(
        layers.Dense(2, name="head")(hidden)))
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    x = np.ones((32, 4), np.float32)
    x[9, 2] = np.inf                                  # the second batch of 8
    y = np.zeros(32, np.int64)
    monitor = mp.callbacks.LossScaleMonitor()
    history = model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[monitor])

    assert monitor.applied == [True, False, True, True]
    assert monitor.nonfinite[0] == [] and monitor.nonfinite[2:] == [[], []]
    assert "hidden/kernel" in monitor.nonfinite[1]     # where the Inf entered
    assert monitor.scales[1] == monitor.scales[0] / 2
    assert history.steps == {"loss_scale": monitor.scales, "applied": monitor.applied,
                             "nonfinite": monitor.nonfinite}


def test_without_loss_scaling_every_step_is_applied() -> None:
    mp.set_global_policy("float32")
    model = mp.Sequential([mp.Input((2,)), layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    monitor = mp.callbacks.LossScaleMonitor()
    history = model.fit(np.ones((8, 2), np.float32), np.ones((8, 1), np.float32), batch_size=4,
                        verbose=0, callbacks=[monitor])
    assert monitor.applied == [True, True] and monitor.scales == [1.0, 1.0]
    assert history.steps["nonfinite"] == [[], []]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the Inf fed on purpose
def test_without_loss_scaling_a_skipped_step_is_reported_too() -> None:
    mp.set_global_policy("float32")
    x = np.ones((8, 4), np.float32)
    x[0, 0] = np.inf
    model = mp.Sequential([mp.Input((4,)), layers.Dense(2, name="only")])
    model.compile(optimizer="sgd", loss="mse")
    monitor = mp.callbacks.LossScaleMonitor()
    for _ in range(2):                                   # one monitor, two fits
        history = model.fit(x, np.zeros((8, 2), np.float32), batch_size=8, verbose=0,
                            callbacks=[monitor])
        assert history.steps["applied"] == [False]
        assert "only/kernel" in history.steps["nonfinite"][0]
