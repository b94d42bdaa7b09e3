"""mp.optimizers.schedules: Keras 3's learning rate schedules (formulas, configs, bad input),
as an optimizer's learning_rate (evaluated at its iterations, serialized in its config as Keras
does, resumed from a checkpoint) and inside traced steps (bit for bit the eager step's)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.optimizers import schedules

ALL = [
    schedules.ExponentialDecay(0.05, 10, 0.96, staircase=True, name="my_ed"),
    schedules.PiecewiseConstantDecay(boundaries=[10, 20], values=[1, 2, 3], name="my_pcd"),
    schedules.PolynomialDecay(0.05, 100, end_learning_rate=0.005, power=2.0, cycle=True),
    schedules.InverseTimeDecay(0.05, 10, 0.96, staircase=True, name="my_itd"),
    schedules.CosineDecay(0.05, 10, alpha=0.1, name="my_cd", warmup_target=0.1,
                          warmup_steps=5),
    schedules.CosineDecayRestarts(0.05, 10, alpha=0.1, t_mul=3.0, m_mul=4.0, name="my_cdr"),
]


def _close(actual: float, expected: float) -> None:
    assert isinstance(actual, float)
    assert actual == pytest.approx(expected, rel=1e-6, abs=1e-6)


# Ported from keras/src/optimizers/schedules/learning_rate_schedule_test.py, the test_config
# of each *Test class (run_class_serialization_test: from_config(get_config()) round trips).
@pytest.mark.parametrize("schedule", ALL, ids=lambda s: type(s).__name__)
def test_config_round_trips(schedule: schedules.LearningRateSchedule) -> None:
    again = type(schedule).from_config(schedule.get_config())
    assert again.get_config() == schedule.get_config()
    assert [again(s) for s in (0, 3, 17, 60)] == [schedule(s) for s in (0, 3, 17, 60)]
    restored = schedules.deserialize(schedules.serialize(schedule))
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()


# Ported from learning_rate_schedule_test.py: ExponentialDecayTest.test_continuous,
# test_staircase
def test_exponential_decay() -> None:
    _close(schedules.ExponentialDecay(0.05, 10, 0.96)(5), 0.05 * 0.96 ** (5.0 / 10.0))
    staircase = schedules.ExponentialDecay(0.1, 3, 0.96, staircase=True)
    _close(staircase(0), 0.1)
    _close(staircase(1), 0.1)
    _close(staircase(100), 0.1 * 0.96 ** (100 // 3))


# Ported from learning_rate_schedule_test.py: PiecewiseConstantDecayTest.test_piecewise_values,
# test_boundary_values
def test_piecewise_constant_decay() -> None:
    decayed = schedules.PiecewiseConstantDecay([100, 110, 120], [1.0, 0.1, 0.01, 0.001])
    for step, expected in [(-999.0, 1.0), (100, 1.0), (105, 0.1), (110, 0.1), (120, 0.01),
                           (999, 0.001)]:
        _close(decayed(step), expected)
    ints = schedules.PiecewiseConstantDecay([1, 2, 3], [0.4, 0.5, 0.6, 0.7])
    for step, expected in [(0, 0.4), (1, 0.4), (2, 0.5), (3, 0.6), (np.int64(4), 0.7)]:
        _close(ints(step), expected)


# Ported from learning_rate_schedule_test.py: LinearDecayTest and SqrtDecayTest (halfway, end,
# halfway_with_end, beyond_end, beyond_end_with_cycle, begin_with_cycle)
@pytest.mark.parametrize("power", [1.0, 0.5])
def test_polynomial_decay(power: float) -> None:
    lr, end = 0.05, 0.001
    _close(schedules.PolynomialDecay(lr, 10, 0.0, power=power)(5), lr * 0.5**power)
    _close(schedules.PolynomialDecay(lr, 10, end, power=power)(10), end)
    _close(schedules.PolynomialDecay(lr, 10, end, power=power)(5),
           (lr - end) * 0.5**power + end)
    _close(schedules.PolynomialDecay(lr, 10, end, power=power)(15), end)
    _close(schedules.PolynomialDecay(lr, 10, end, power=power, cycle=True)(15),
           (lr - end) * 0.25**power + end)
    _close(schedules.PolynomialDecay(lr, 10, cycle=True, power=power)(0), lr)


# Ported from learning_rate_schedule_test.py: InverseTimeDecayTest.test_decay, test_staircase
def test_inverse_time_decay() -> None:
    continuous = schedules.InverseTimeDecay(0.1, 10, 0.96)
    staircase = schedules.InverseTimeDecay(0.1, 10, 0.96, staircase=True)
    for i in range(0, 100, 7):
        _close(continuous(i), 0.1 / (1 + i / 10 * 0.96))
        _close(staircase(i), 0.1 / (1 + 0.96 * (i // 10)))


def _np_cosine_decay(step: float, decay_steps: float, alpha: float = 0.0) -> float:
    step = min(step, decay_steps)
    return (1.0 - alpha) * 0.5 * (1.0 + math.cos(math.pi * step / decay_steps)) + alpha


# Ported from learning_rate_schedule_test.py: CosineDecayTest.test_decay, test_alpha,
# test_float64, test_warmup, test_warmup_decay
def test_cosine_decay() -> None:
    for step in range(0, 1500, 250):
        _close(schedules.CosineDecay(1.0, 1000)(step), _np_cosine_decay(step, 1000))
        _close(schedules.CosineDecay(1.0, 1000, 0.1)(step), _np_cosine_decay(step, 1000, 0.1))
        _close(schedules.CosineDecay(np.float64(1.0), 1000)(step), _np_cosine_decay(step, 1000))
        warm = schedules.CosineDecay(0.0, 10, warmup_target=10.0, warmup_steps=1500)
        _close(warm(step), step / 1500 * 10.0)
    for step in range(0, 3000, 250):
        lr = schedules.CosineDecay(0.0, 1000, warmup_target=10.0, warmup_steps=2000)
        expected = (step / 2000 * 10.0 if step < 2001
                    else 10.0 * _np_cosine_decay(step - 2000, 1000))
        _close(lr(step), expected)


def _np_restarts(step: float, decay_steps: float, t_mul: float = 2.0, m_mul: float = 1.0,
                 alpha: float = 0.0) -> float:
    fac = 1.0
    while step >= decay_steps:
        step -= decay_steps
        decay_steps *= t_mul
        fac *= m_mul
    return (1.0 - alpha) * fac * 0.5 * (1.0 + math.cos(math.pi * step / decay_steps)) + alpha


# Ported from learning_rate_schedule_test.py: CosineDecayRestartsTest.test_decay, test_alpha,
# test_mmul, test_tmul
@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.1}, {"m_mul": 0.9}, {"t_mul": 1.0}])
def test_cosine_decay_restarts(kwargs: dict[str, float]) -> None:
    for step in range(0, 1500, 250):
        _close(schedules.CosineDecayRestarts(1.0, 1000, **kwargs)(step),
               _np_restarts(step, 1000, **kwargs))


def test_bad_arguments_name_what_is_valid() -> None:
    with pytest.raises(ValueError, match=r"length of boundaries should be 1 less .* values"):
        schedules.PiecewiseConstantDecay([10, 20], [1.0, 2.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        schedules.PiecewiseConstantDecay([20, 10], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="decay_steps must be"):
        schedules.ExponentialDecay(0.1, 0, 0.9)
    with pytest.raises(ValueError, match="first_decay_steps must be"):
        schedules.CosineDecayRestarts(0.1, -1)
    with pytest.raises(ValueError, match="staircase must be True or False"):
        schedules.InverseTimeDecay(0.1, 10, 0.5, staircase="yes")
    with pytest.raises(ValueError, match="initial_learning_rate must be"):
        schedules.CosineDecay("0.1", 10)
    with pytest.raises(ValueError, match="unknown learning rate schedule 'Nope'; built-in: "
                                         "ExponentialDecay"):
        schedules.deserialize({"class_name": "Nope", "config": {}})
    with pytest.raises(NotImplementedError, match="must override `__call__"):
        schedules.LearningRateSchedule()(0)


class _Bad(schedules.LearningRateSchedule):
    def __call__(self, step: int) -> Any:
        return "fast"

    def get_config(self) -> dict[str, Any]:
        return {}


def test_a_schedule_returning_a_non_number_is_named() -> None:
    opt = mp.optimizers.SGD(_Bad())
    with pytest.raises(ValueError, match=r"schedule _Bad\(\) returned 'fast' at step 0"):
        _ = opt.learning_rate


def test_optimizer_evaluates_the_schedule_at_its_iterations() -> None:
    schedule = schedules.ExponentialDecay(0.1, 2, 0.5)
    opt = mp.optimizers.SGD(schedule)
    v = mp.Variable([1.0, 2.0])
    for step in range(5):
        assert opt.learning_rate == schedule(step)
        opt.apply_gradients([(mp.constant([1.0, 1.0]), v)])
    assert opt.iterations == 5
    # Keras 3: a number set over a schedule is refused; another schedule may replace it
    with pytest.raises(TypeError, match="not settable"):
        opt.learning_rate = 0.01
    opt.learning_rate = schedules.CosineDecay(0.1, 10)
    assert opt.learning_rate == schedules.CosineDecay(0.1, 10)(5)


def test_optimizer_config_serializes_the_schedule_as_keras() -> None:
    schedule = schedules.CosineDecay(0.05, 10, warmup_target=0.1, warmup_steps=3)
    config = mp.optimizers.Adam(schedule).get_config()
    assert config["learning_rate"] == {"module": "mpcore.optimizers.schedules",
                                       "class_name": "CosineDecay",
                                       "config": schedule.get_config(),
                                       "registered_name": None}
    again = mp.optimizers.Adam.from_config(config)
    assert isinstance(again._learning_rate, schedules.CosineDecay)
    assert again.get_config() == config
    wrapped = mp.LossScaleOptimizer(mp.optimizers.SGD(schedule))
    back = mp.LossScaleOptimizer.from_config(wrapped.get_config())
    assert back.learning_rate == schedule(0)


def _dense_model(jit: bool, optimizer: Any, policy: str = "float32") -> mp.Model:
    with mp.policy_scope(policy):
        model = mp.Sequential([mp.layers.Dense(2, kernel_initializer="ones",
                                               bias_initializer="ones")])
        model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    return model


# Ported from learning_rate_schedule_test.py: TestFitLRSchedulesFlow.test_fit_lr_correctness
def test_fit_lr_correctness() -> None:
    optimizer = mp.optimizers.Adam(learning_rate=schedules.ExponentialDecay(
        initial_learning_rate=0.05, decay_steps=1, decay_rate=0.9))
    model = _dense_model(False, optimizer)
    x = np.arange(32).reshape((16, 2)).astype("float32")
    y = np.arange(32).reshape((16, 2)).astype("float32")
    history = model.fit(x, y, epochs=3, batch_size=4, shuffle=False, verbose=0)
    assert optimizer.iterations == 4 * 3
    np.testing.assert_allclose(history.history["loss"],
                               [230.79457092285156, 128.30319213867188, 79.33648681640625],
                               rtol=5e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_traced_steps_with_a_schedule_match_eager_bit_for_bit(policy: str) -> None:
    # a built-in schedule is computed on the device from iterations, eagerly and in the
    # recorded step alike (the cosine of basic float64 ops, mpcore.optimizers.cosine_math),
    # and is the host's value bit for bit: the rates and the weights are the eager step's
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 2)).astype("float32")
    y = rng.standard_normal((24, 2)).astype("float32")
    weights, rates, counts = [], [], []
    for jit in (False, True):
        schedule = schedules.CosineDecay(0.01, 6, warmup_target=0.05, warmup_steps=3)
        model = _dense_model(jit, mp.optimizers.SGD(schedule, momentum=0.9), policy)
        seen: list[float] = []
        counted: list[int] = []
        for step in range(8):
            seen.append(model.optimizer.learning_rate)
            counted.append(model.optimizer.iterations)
            lo = (step % 3) * 8
            model.train_on_batch(x[lo:lo + 8], y[lo:lo + 8])
        if jit:
            assert model.train_function is not None
        # mixed_float16's first scale (2**15) overflows once: a skipped step is not counted
        skipped = model.optimizer.skipped_steps if policy == "mixed_float16" else 0
        assert model.optimizer.iterations == 8 - skipped and skipped <= 1
        weights.append([w.copy() for w in model.get_weights()])
        rates.append(seen)
        counts.append(counted)
    assert counts[0] == counts[1]
    assert rates[0] == rates[1] == [schedule(s) for s in counts[0]]
    for eager, traced in zip(*weights):
        np.testing.assert_array_equal(eager, traced)
    assert not np.array_equal(weights[0][0], np.ones((2, 2), "float32"))


def test_checkpoint_resumes_the_schedule_at_the_saved_step(tmp_path: Any) -> None:
    schedule = schedules.ExponentialDecay(0.1, 1, 0.5)
    model = _dense_model(False, mp.optimizers.SGD(schedule))
    x = np.ones((4, 2), "float32")
    model.fit(x, x, epochs=1, batch_size=2, verbose=0)
    model.save_checkpoint(str(tmp_path / "c.mpck"))
    other = _dense_model(False, mp.optimizers.SGD(schedules.ExponentialDecay(0.1, 1, 0.5)))
    other(x)   # built, as a restore needs
    other.load_checkpoint(str(tmp_path / "c.mpck"))
    assert other.optimizer.iterations == 2
    assert other.optimizer.learning_rate == schedule(2) == 0.025
