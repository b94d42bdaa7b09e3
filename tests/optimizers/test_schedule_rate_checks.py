"""A built-in schedule some of whose rates are negative or not finite is kept whole, so the
optimizer refuses the first such rate by name at its step, before it touches a weight, traced
or eager: the device computes a rate without a look at it (the cosine schedules, recorded on
the device since they are, applied a negative rate at every step and raised only when the
host next read ``optimizer.learning_rate``, after the epoch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.optimizers import device_schedules

S = mp.optimizers.schedules


@pytest.mark.parametrize("schedule, reason", [
    (S.CosineDecay(-0.1, 10), "initial_learning_rate is -0.1"),
    (S.CosineDecay(0.1, 3, alpha=-1.0), "the final rate (alpha times the decay's start) is -0.1"),
    (S.CosineDecay(0.1, 3, warmup_target=-0.1, warmup_steps=2), "warmup_target is -0.1"),
    (S.CosineDecay(1e300, 3, alpha=1e10), "is inf"),
    (S.CosineDecayRestarts(0.1, 3, alpha=-0.5), "is -0.05"),
    (S.ExponentialDecay(-0.1, 10, 0.5), "initial_learning_rate is -0.1"),
    (S.ExponentialDecay(0.1, 10, -0.5), "decay_rate=-0.5 < 0"),
    (S.ExponentialDecay(0.1, 10, 1.5), f"the rate at step {2**63 - 1} is inf"),
    (S.InverseTimeDecay(0.1, 10, -0.5), "decay_rate=-0.5 < 0"),
    (S.PolynomialDecay(0.1, 10, end_learning_rate=-0.01), "end_learning_rate is -0.01"),
    (S.PolynomialDecay(0.1, 10, power=-1.0), "power=-1.0 < 0"),
    (S.PiecewiseConstantDecay([5], [0.1, -0.1]), "values[1] is -0.1"),
], ids=repr)
def test_a_schedule_with_invalid_rates_is_kept_whole_saying_why(schedule: Any,
                                                                 reason: str) -> None:
    why = device_schedules.why_not(schedule, mp.get_backend("cpu"))
    assert why is not None and reason in why, why
    assert "refuses such a rate by name" in why


@pytest.mark.parametrize("schedule", [
    S.CosineDecay(0.1, 10, alpha=2.0), S.CosineDecay(0.0, 10, warmup_target=0.1, warmup_steps=3),
    S.CosineDecayRestarts(0.1, 3, m_mul=0.0, alpha=0.5), S.ExponentialDecay(0.1, 10, 1.0),
    S.ExponentialDecay(0.1, 10, 0.0), S.InverseTimeDecay(0.0, 10, 0.5),
    S.PolynomialDecay(0.1, 10, end_learning_rate=0.0, power=0.0),
], ids=repr)
def test_a_schedule_of_valid_rates_stays_recorded(schedule: Any) -> None:
    assert device_schedules.why_not(schedule, mp.get_backend("cpu")) is None


@pytest.mark.parametrize("jit", [True, False])
def test_fit_refuses_the_first_negative_cosine_rate_before_the_step(jit: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = rng.integers(0, 3, 32)
    mp.random.set_seed(3)
    model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(3)])
    model.compile(loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=mp.optimizers.SGD(S.CosineDecay(0.1, 3, alpha=-1.0)),
                  jit_compile=jit)
    with pytest.raises(ValueError, match=r"CosineDecay.*returned -0\.0499.* at step 2"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert model.optimizer.iterations == 2    # steps 0 and 1 ran; step 2 touched nothing
    assert all(np.isfinite(w).all() for w in model.get_weights())
