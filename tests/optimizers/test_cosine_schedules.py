"""CosineDecay and CosineDecayRestarts computed on the device (issue 34, item 1): the device
rate is the host's bit for bit on cpu and opencl (their cosine is IEEE basic operations on
both sides, their restart tables the host's numbers), the host rate is Keras' formula within
2 ulps of the initial rate, and the configurations that cannot be tabled are kept whole, saying
why. (Their traced steps: tests/optimizers/test_device_optimizer_recorded.py's cosine
configurations.)"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import available_backends
from mpcore_cpu.backend import CpuBackend

import mpcore as mp
from mpcore.optimizers import cosine_math, device_schedules, schedules

S = schedules
BACKENDS = available_backends("cpu", "opencl")

RECORDED = [
    S.CosineDecay(0.1, 1000), S.CosineDecay(0.1, 7, alpha=0.1),
    S.CosineDecay(0.01, 6, warmup_target=0.05, warmup_steps=3),
    S.CosineDecay(0.0, 10, alpha=0.2, warmup_target=10.0, warmup_steps=15),
    S.CosineDecay(0.05, 4, warmup_target=0.1, warmup_steps=0),
    S.CosineDecayRestarts(0.1, 10), S.CosineDecayRestarts(0.1, 7, t_mul=1.0),
    S.CosineDecayRestarts(0.1, 7, t_mul=1.0, m_mul=0.5, alpha=0.1),
    S.CosineDecayRestarts(0.1, 3, t_mul=3.0, m_mul=0.9, alpha=0.05),
    S.CosineDecayRestarts(1.0, 1, t_mul=3.0), S.CosineDecayRestarts(0.1, 2.5, t_mul=1.5),
    S.CosineDecayRestarts(0.1, 3, t_mul=2.0, m_mul=2.0),
]
#: every step to 400, the restarts' boundaries of t_mul = 3 (period 5 starts at (3**5-1)/2,
#: where Keras' log formula slips), far steps
STEPS = [*range(0, 400), 999, 1000, 1001, 121, 363, 364, 3**12, (3**13 - 1) // 2, 10**6 + 3,
         12345678, 2**40, 2**62]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schedule", RECORDED, ids=repr)
def test_the_device_rate_is_the_host_rate_bit_for_bit(backend: str, schedule: Any) -> None:
    be = mp.get_backend(backend)
    assert device_schedules.why_not(schedule, be) is None
    it = mp.Variable(mp.ops.constant(0, "int64", backend=be), dtype="int64")
    for step in STEPS:
        it.assign(mp.ops.constant(step, "int64", backend=be))
        rate = device_schedules.device_rate(schedule, it)
        assert rate.dtype == "float64" and rate.shape == (1,)
        got, want = rate.numpy()[0], schedule(step)
        assert got.tobytes() == np.float64(want).tobytes(), (step, got, want)


def _keras_cosine_decay(s: S.CosineDecay, step: int) -> tuple[float, float]:
    """Keras 3's CosineDecay.__call__ in Python floats (math.cos), and the largest rate."""
    initial, steps, alpha = s.initial_learning_rate, s.decay_steps, s.alpha

    def decay(step: float, start: float) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * (step / steps)))
        return start * ((1 - alpha) * cosine + alpha)

    if s.warmup_target is None:
        return decay(min(step, steps), initial), abs(initial)
    warmup = s.warmup_steps
    top = max(abs(initial), abs(s.warmup_target))
    step = min(step, steps + warmup)
    if step < warmup:
        return (s.warmup_target - initial) * (step / warmup) + initial, top
    return decay(step - warmup, s.warmup_target), top


def _keras_restarts(s: S.CosineDecayRestarts, step: int) -> tuple[float, float]:
    """Keras 3's CosineDecayRestarts.__call__ in Python floats (math.log, math.cos; inf where
    a power overflows, as Keras'), and the period's largest rate."""
    fraction = step / s.first_decay_steps
    t_mul, m_mul, alpha = s._t_mul, s._m_mul, s.alpha
    if t_mul == 1.0:
        restart = math.floor(fraction)
        fraction -= restart
    else:
        restart = math.floor(math.log(1.0 - fraction * (1.0 - t_mul)) / math.log(t_mul))
        fraction = (fraction - (1.0 - t_mul**restart) / (1.0 - t_mul)) / t_mul**restart
    peak = cosine_math.power(m_mul, restart)
    decayed = 0.5 * peak * (1.0 + math.cos(math.pi * fraction))
    return s.initial_learning_rate * ((1 - alpha) * decayed + alpha), abs(
        s.initial_learning_rate) * max(peak, 1.0)


@pytest.mark.parametrize("schedule", RECORDED, ids=repr)
def test_the_host_rate_is_keras_formula_within_two_ulps(schedule: Any) -> None:
    """The cosine is within an ulp of math.cos (test_cosine_math.py); the rest is Keras'
    arithmetic, so the rates differ by at most a couple of ulps of the largest rate. Steps
    where Keras' log formula puts a period's first step in the period before are the
    exception, checked against the periods summed one by one."""
    keras = (_keras_cosine_decay if isinstance(schedule, S.CosineDecay) else _keras_restarts)
    differ = 0
    for step in STEPS[:-1]:
        got, (want, top) = schedule(step), keras(schedule, step)
        if isinstance(schedule, S.CosineDecayRestarts) and schedule._t_mul != 1.0 \
                and abs(got - want) > top * 1e-3:
            assert got == pytest.approx(_summed_restarts(schedule, step), rel=1e-12, abs=1e-15)
            continue
        assert got == want or abs(got - want) <= 2 * math.ulp(top), (step, got, want)
        differ += got != want
    assert differ <= len(STEPS) // 3


def _summed_restarts(s: S.CosineDecayRestarts, step: int) -> float:
    """The restart found by summing the periods one by one (Keras' own test's reference)."""
    fraction, length, peak = step / s.first_decay_steps, 1.0, 1.0
    while fraction >= length:
        fraction -= length
        length *= s._t_mul
        peak *= s._m_mul
    decayed = peak * 0.5 * (1.0 + math.cos(math.pi * fraction / length))
    return s.initial_learning_rate * ((1 - s.alpha) * decayed + s.alpha)


def test_a_boundary_step_starts_its_period_where_keras_log_formula_slips() -> None:
    s = S.CosineDecayRestarts(1.0, 1, t_mul=3.0)
    step = (3**5 - 1) // 2                 # period 5 starts: log(243) / log(3) = 4.999...
    assert _keras_restarts(s, step)[0] == pytest.approx(0.0, abs=1e-12)  # Keras: period 4 ends
    assert s(step) == 1.0                  # mpcore: period 5's first step, its peak


@pytest.mark.parametrize("schedule, reason", [
    (S.CosineDecayRestarts(0.1, 10, t_mul=0.5), "t_mul=0.5 < 1: the periods shrink"),
    (S.CosineDecayRestarts(0.1, 10, t_mul=1.0001), "more than 65536 restarts"),
    (S.CosineDecayRestarts(0.1, 10, t_mul=1.0, m_mul=0.999), "m_mul=0.999 with t_mul=1"),
    (S.CosineDecayRestarts(0.1, 10, t_mul=1.0, m_mul=-1.0), "m_mul=-1.0 < 0"),
    # rates that leave [0, inf): the host refuses them by name at their step
    (S.CosineDecayRestarts(0.1, 1, t_mul=1.0, m_mul=2.0), "m_mul**restart = inf) is inf"),
    (S.CosineDecayRestarts(0.1, 3, t_mul=2.0, m_mul=-0.5), "(m_mul**restart = -0.5) is -0.05"),
    (S.CosineDecayRestarts(0.1, 3, m_mul=2.0, alpha=2.0), "the rate at the largest peak"),
    (S.CosineDecayRestarts(-0.1, 3), "initial_learning_rate is -0.1")])
def test_untabled_restarts_are_kept_whole_and_say_why(schedule: Any, reason: str) -> None:
    why = device_schedules.why_not(schedule, mp.get_backend("cpu"))
    assert why is not None and why.startswith("learning-rate schedule CosineDecayRestarts: ")
    assert reason in why


def test_a_shrinking_schedule_past_its_last_restart_is_nan_as_in_keras() -> None:
    s = S.CosineDecayRestarts(0.1, 10, t_mul=0.5)
    assert s(15) == pytest.approx(_summed_restarts(s, 15))
    assert math.isnan(s(20)) and math.isnan(s(25))
    opt = mp.optimizers.SGD(s)
    opt.iterations = 25
    with pytest.raises(ValueError, match=r"returned nan at step 25"):
        _ = opt.learning_rate


class _ComposedCos(CpuBackend):
    """The CPU backend without its ieee_cos kernel: the cosine as basic operations."""

    name = "cpu_composed_cos"
    ieee_cos = None


@pytest.mark.parametrize("schedule", RECORDED[:3] + RECORDED[-4:], ids=repr)
def test_the_fused_and_the_composed_cosine_give_the_host_rate(schedule: Any) -> None:
    """The CPU's ieee_cos kernel (one call) and the basic operations it stands for (about 80
    calls, what a backend without the kernel records) both give the host's rate bit for bit;
    a traced step records the fused one as a single step."""
    fused, composed = mp.get_backend("cpu"), _ComposedCos()
    assert "ieee_cos" in fused.kernels() and "ieee_cos" not in composed.kernels()
    for be in (fused, composed):
        it = mp.Variable(mp.ops.constant(0, "int64", backend=be), dtype="int64")
        for step in STEPS[::7]:
            it.assign(mp.ops.constant(step, "int64", backend=be))
            got = device_schedules.device_rate(schedule, it).numpy()[0]
            assert got.tobytes() == np.float64(schedule(step)).tobytes(), (be.name, step)

    it = mp.Variable(mp.ops.constant(3, "int64", backend=fused), dtype="int64")
    rate = mp.function(lambda: device_schedules.device_rate(schedule, it))
    rate()
    names = [step.name for step in rate.graph.steps if hasattr(step, "op")]
    assert names.count("ieee_cos") == 1 and "multiply" in names
    it.assign(mp.ops.constant(5, "int64", backend=fused))
    assert rate().numpy()[0].tobytes() == np.float64(schedule(5)).tobytes()
