"""The whole optimizer recorded kernel by kernel (issue 34, item 1, the rest): Adam and AdamW
(their step size from the device step count), the built-in learning-rate schedules, clipping
and gradient accumulation. For each configuration: the traced step lists its kernels and
keeps nothing whole, its replays equal eager steps bit for bit (mixed_float16, a dynamic loss
scale, an Inf step skipped) on cpu and opencl, read nothing back to the host, and a
checkpoint taken between traced steps resumes exactly."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import available_backends, custom_training_step

import mpcore as mp
from mpcore import layers
from mpcore.optimizers import schedules
from mpcore.plugins.registry import backend_scope

BACKENDS = available_backends("cpu", "opencl")
S = schedules

#: name -> (the optimizer, kernels its recorded step must list)
CONFIGS: dict[str, tuple[Callable[[], mp.optimizers.Optimizer], tuple[str, ...]]] = {
    "adam": (lambda: mp.optimizers.Adam(0.01), ("adam_rates(", "adam_update(")),
    "adamw": (lambda: mp.optimizers.AdamW(0.01, weight_decay=0.1),
              ("adam_rates(", "adam_update(")),
    "adam-unfused": (lambda: _unfused(mp.optimizers.Adam(0.01)), ("power(", "sqrt(")),
    # clipping: ops on the device, recorded with the update
    "adam-clipnorm": (lambda: mp.optimizers.Adam(0.01, clipnorm=0.05),
                      ("sum(", "maximum(", "adam_update(")),
    "sgd-global_clipnorm": (lambda: mp.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1),
                            ("sum(", "maximum(", "sgd_update(")),
    "rmsprop-clipvalue": (lambda: mp.optimizers.RMSprop(0.01, clipvalue=0.01),
                          ("minimum(", "rmsprop_update(")),
    # built-in schedules: the rate computed on the device from iterations (float64 ops)
    "sgd-exponential": (lambda: mp.optimizers.SGD(S.ExponentialDecay(0.05, 2, 0.7),
                                                  momentum=0.9),
                        ("power(", "sgd_update(")),
    "sgd-exponential-staircase-unfused": (
        lambda: _unfused(mp.optimizers.SGD(S.ExponentialDecay(0.05, 3, 0.5, staircase=True))),
        ("power(", "where(")),
    "rmsprop-piecewise": (lambda: mp.optimizers.RMSprop(
        S.PiecewiseConstantDecay([2, 5], [0.01, 0.005, 0.001]), momentum=0.5),
        ("less_equal(", "rmsprop_update(")),
    "rmsprop-polynomial-cycle-unfused": (lambda: _unfused(mp.optimizers.RMSprop(
        S.PolynomialDecay(0.01, 3, 0.001, power=2.0, cycle=True))), ("power(", "sqrt(")),
    "adam-inverse-time": (lambda: mp.optimizers.Adam(S.InverseTimeDecay(0.01, 2, 0.5)),
                          ("adam_rates(", "adam_update(")),
    "adamw-polynomial": (lambda: mp.optimizers.AdamW(S.PolynomialDecay(0.01, 5, power=0.5),
                                                     weight_decay=0.1),
                         ("power(", "adam_rates(", "adam_update(")),
    # the cosine schedules: a cosine of basic float64 ops, restarts from tables on the device
    "sgd-cosine": (lambda: mp.optimizers.SGD(S.CosineDecay(0.05, 6), momentum=0.9),
                   ("minimum(", "where(", "sgd_update(")),
    "adam-cosine-warmup-alpha": (lambda: mp.optimizers.Adam(
        S.CosineDecay(0.001, 4, alpha=0.1, warmup_target=0.01, warmup_steps=3)),
        ("less(", "adam_rates(", "adam_update(")),
    "rmsprop-restarts-t1-mmul-unfused": (lambda: _unfused(mp.optimizers.RMSprop(
        S.CosineDecayRestarts(0.01, 3, t_mul=1.0, m_mul=0.5))), ("take(", "sqrt(")),
    "sgd-restarts-t2": (lambda: mp.optimizers.SGD(S.CosineDecayRestarts(0.05, 1)),
                        ("less_equal(", "take(", "sgd_update(")),
    "adamw-restarts-t3-mmul-alpha": (lambda: mp.optimizers.AdamW(
        S.CosineDecayRestarts(0.01, 1, t_mul=3.0, m_mul=0.8, alpha=0.1), weight_decay=0.1),
        ("less_equal(", "take(", "adam_update(")),
    # gradient accumulation: the micro-step count and the accumulators on the device, the
    # update gated by (last micro-step and finite); 8 steps end in mid-accumulation
    "sgd-accumulate-3": (lambda: mp.optimizers.SGD(0.05, momentum=0.9,
                                                   gradient_accumulation_steps=3),
                         ("equal(", "logical_and(", "sgd_update(")),
    "adam-accumulate-2-clipnorm": (lambda: mp.optimizers.Adam(
        0.01, clipnorm=0.05, gradient_accumulation_steps=2), ("equal(", "adam_update(")),
    "rmsprop-exponential-accumulate-3-unfused": (lambda: _unfused(mp.optimizers.RMSprop(
        S.ExponentialDecay(0.01, 2, 0.7), gradient_accumulation_steps=3)),
        ("equal(", "power(", "sqrt(")),
}


def _unfused(opt: mp.optimizers.Optimizer) -> mp.optimizers.Optimizer:
    opt.use_fused_kernels = False
    return opt


def _model() -> mp.Model:
    mp.random.set_seed(0)
    inputs = mp.Input(shape=(6,))
    x = layers.Dense(5, activation="relu")(inputs)
    outputs = layers.Activation("softmax", dtype="float32")(layers.Dense(3)(x))
    return mp.Model(inputs, outputs)


def _batches(backend: str, steps: int) -> list[tuple[mp.Tensor, mp.Tensor]]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(steps):
        x = rng.normal(size=(8, 6)).astype(np.float32)
        if i == 3:
            x[0, 0] = np.inf     # Inf/NaN gradients: a skipped step
        out.append((mp.constant(x, backend=backend),
                    mp.constant(rng.integers(0, 3, 8), backend=backend)))
    return out


class Run:
    """A model, a LossScaleOptimizer (dynamic) around ``config``'s optimizer and a custom
    step, eager or traced, on ``backend`` under mixed_float16."""

    def __init__(self, backend: str, config: str, traced: bool) -> None:
        self.backend = backend
        with mp.policy_scope("mixed_float16"), backend_scope(backend):
            self.model = _model()
            self.opt = mp.LossScaleOptimizer(CONFIGS[config][0](), "dynamic")
        step = custom_training_step(self.model, self.opt)
        self.fn = mp.function(step) if traced else None
        self.step = step

    def run(self, batches: list[tuple[mp.Tensor, mp.Tensor]]) -> None:
        with mp.policy_scope("mixed_float16"), backend_scope(self.backend), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for x, y in batches:
                (self.fn or self.step)(x, y)

    def state(self) -> tuple[list[np.ndarray], tuple[Any, ...]]:
        opt = self.opt
        arrays = [v.numpy() for v in self.model.weights + opt.variables()]
        inner = opt.inner_optimizer
        arrays += [a.numpy() for a in inner._accumulators.values()]
        return arrays, (float(opt.loss_scale()), opt.iterations, opt.skipped_steps,
                        opt.loss_scale.num_good_steps, inner._micro_steps)


def _same(a: tuple[list[np.ndarray], tuple[Any, ...]],
          b: tuple[list[np.ndarray], tuple[Any, ...]]) -> None:
    assert a[1] == b[1]
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_recorded_and_replays_equal_eager_bit_for_bit(backend: str, config: str) -> None:
    batches = _batches(backend, 8)
    eager, traced = Run(backend, config, False), Run(backend, config, True)
    eager.run(batches)
    traced.run(batches)
    _same(eager.state(), traced.state())
    assert eager.opt.skipped_steps >= 1
    fn = traced.fn
    assert fn is not None and fn.tracing_count <= 2            # the others replayed
    graph = str(fn.graph)
    assert "[kept whole]" not in graph, graph
    for kernel in (*CONFIGS[config][1], "loss_scale_update(", "unscale_and_check_by("):
        assert kernel in graph, (kernel, graph)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_replay_reads_nothing_back(backend: str, config: str,
                                     host_reads: list[str]) -> None:
    traced = Run(backend, config, True)
    batches = _batches(backend, 9)
    traced.run(batches[:3])
    count = traced.fn.tracing_count  # type: ignore[union-attr]
    host_reads.clear()
    traced.run(batches[3:])          # the skipped step among them
    assert host_reads == []
    assert traced.fn.tracing_count == count  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_checkpoint_between_traced_steps_resumes_exactly(backend: str, config: str) -> None:
    batches = _batches(backend, 8)
    whole = Run(backend, config, True)
    whole.run(batches)
    first = Run(backend, config, True)
    first.run(batches[:5])
    variables = first.model.trainable_variables
    state = first.opt.get_state(variables)
    weights = first.model.get_weights()
    resumed = Run(backend, config, True)
    resumed.model.set_weights(weights)
    resumed.opt.set_state(resumed.model.trainable_variables, state)
    resumed.run(batches[5:])
    _same(whole.state(), resumed.state())


def test_adam_rates_equal_the_python_formula() -> None:
    """The device step size (float64, rounded once) is the value the host computed before."""
    for name in BACKENDS:
        be = mp.get_backend(name)
        it = mp.Variable(mp.ops.constant(0, "int64", backend=be), dtype="int64")
        for fused in (True, False):
            for step in (*range(0, 40), 999, 10**5, 10**7):
                it.assign(mp.ops.constant(step, "int64", backend=be))
                got = mp.ops.adam_rates(it, 1e-3, 0.9, 0.999, 0.004, fused).numpy()
                t = step + 1
                want = np.array([1e-3 * math.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t), 4e-6],
                                np.float32)
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {fused} {step}")


SCHEDULES = [S.ExponentialDecay(0.1, 7, 0.93), S.ExponentialDecay(1e-3, 1000, 0.96),
             S.ExponentialDecay(0.1, 7, 0.93, staircase=True),
             S.InverseTimeDecay(0.1, 3, 0.5), S.InverseTimeDecay(0.1, 3, 0.5, staircase=True),
             S.PiecewiseConstantDecay([3, 10.5], [0.1, 0.05, 0.01]),
             S.PolynomialDecay(0.1, 1000, power=0.5), S.PolynomialDecay(0.1, 7, cycle=True),
             S.PolynomialDecay(0.1, 10, 0.001, 2.0, cycle=True)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_device_schedules_equal_the_host_rates(backend: str, schedule: Any) -> None:
    """The device rate rounded to float32 (SGD's and RMSprop's) and Adam's step size from it
    are the host's values (Python floats, rounded once), fused and composite."""
    from mpcore.optimizers import device_schedules
    be = mp.get_backend(backend)
    it = mp.Variable(mp.ops.constant(0, "int64", backend=be), dtype="int64")
    for step in (*range(0, 300), 999, 1000, 1001, 7 * 10**4, 10**6 + 3, 12345678):
        it.assign(mp.ops.constant(step, "int64", backend=be))
        rate = device_schedules.device_rate(schedule, it)
        host = schedule(step)
        assert np.float32(rate.numpy()[0]) == np.float32(host), (step, rate.numpy(), host)
        t = step + 1
        want = np.array([host * math.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t), host * 0.004],
                        np.float32)
        for fused in (True, False):
            got = mp.ops.adam_rates(it, rate, 0.9, 0.999, 0.004, fused).numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{fused} {step}")


class _Halving(S.LearningRateSchedule):
    def __call__(self, step: int) -> float:
        return 0.01 / (1 + step // 2)

    def get_config(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("schedule, reason", [
    (_Halving(), "not a built-in one"),
    (S.CosineDecayRestarts(0.01, 10, t_mul=0.5), "t_mul=0.5 < 1"),
    (S.CosineDecayRestarts(0.01, 10, t_mul=1.0, m_mul=0.999), "m_mul=0.999 with t_mul=1")])
def test_other_schedules_stay_kept_whole_and_say_why(schedule: Any, reason: str) -> None:
    model = _model()
    opt = mp.LossScaleOptimizer(mp.optimizers.SGD(schedule), "dynamic")
    loss_fn = mp.losses.SparseCategoricalCrossentropy()

    @mp.function
    def step(x: mp.Tensor, y: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = opt.get_scaled_loss(loss_fn(y, model(x, training=True)))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    eager = mp.optimizers.SGD(schedule)
    for x, y in _batches(mp.get_backend().name, 3):
        step(x, y)
    graph = str(step.graph)
    assert "[kept whole]" in graph and reason in graph, graph
    assert opt.iterations == 3 and eager.learning_rate == schedule(0)
