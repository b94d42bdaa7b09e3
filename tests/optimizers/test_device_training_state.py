"""Training state on the device (issue 34, item 1): a dynamic loss scale's scale and counters
and the optimizer's step count are variables updated by kernels, so a traced step records the
whole LossScaleOptimizer step kernel by kernel and reads nothing back to the host."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import available_backends, custom_training_step
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import mpcore as mp
from mpcore import layers
from mpcore.plugins.registry import backend_scope

F32_MAX = float(np.finfo(np.float32).max)


BACKENDS = available_backends("cpu", "opencl")


def _state(ls: mp.DynamicLossScale) -> tuple[float, int, int, int, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # stuck at the floor: tested apart
        return ls._read()


# --- the device rule == the Python rule, bit for bit ---------------------------------------
class DeviceRuleMachine(RuleBasedStateMachine):
    """The Python rule (an unplaced DynamicLossScale) against the same scale on the device:
    the CPU kernel, the composite of ops, and the OpenCL kernel where PoCL is installed."""

    @initialize(
        initial=st.one_of(st.sampled_from([1.0, 2.0**15, 2.0**126, F32_MAX, 3.0]),
                          st.floats(1.0, 1e38)),
        period=st.integers(1, 4),
        multiplier=st.one_of(st.sampled_from([2.0, 4.0, 1.5, 3.0]), st.floats(1.0001, 1e6)),
        floor=st.sampled_from([1.0, 0.25, 3.0]), capped=st.booleans(),
        hysteresis=st.integers(1, 3))
    def start(self, initial: float, period: int, multiplier: float, floor: float,
              capped: bool, hysteresis: int) -> None:
        initial = max(initial, floor)
        ceiling = min(F32_MAX, initial * 8.0) if capped else None
        config = {"initial_loss_scale": initial, "increment_period": period,
                  "multiplier": multiplier, "min_loss_scale": floor,
                  "max_loss_scale": ceiling, "hysteresis": hysteresis}
        self.host = mp.DynamicLossScale(**config)
        self.devices = []
        for name in BACKENDS:
            for fused in (True, False) if name == "cpu" else (True,):
                ls = mp.DynamicLossScale(**config)
                ls.place(mp.get_backend(name))
                self.devices.append((ls, name, fused))

    @rule(finite=st.booleans())
    def step(self, finite: bool) -> None:
        self.steps([finite])

    @rule(n=st.integers(1, 12), finite=st.booleans())
    def run(self, n: int, finite: bool) -> None:
        self.steps([finite] * n)

    def steps(self, flags: list[bool]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for finite in flags:
                self.host.update(finite)
                for ls, name, fused in self.devices:
                    be = mp.get_backend(name)
                    ls.update_on_device(mp.ops.constant(finite, backend=be), fused)

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "host"):
            return
        want = _state(self.host)
        for ls, name, fused in self.devices:
            got = _state(ls)
            assert got == want, (name, fused)
            inv = float(ls.variables[1].numpy())
            assert inv == float(np.float32(1.0) / np.float32(got[0])), (name, fused)


TestDeviceRuleMachine = DeviceRuleMachine.TestCase
TestDeviceRuleMachine.settings = settings(max_examples=40, stateful_step_count=20,
                                          deadline=None)


def test_the_stuck_warning_comes_from_the_device_counters() -> None:
    ls = mp.DynamicLossScale(2.0)
    ls.place(mp.get_backend("cpu"))
    bad = mp.ops.constant(False, backend=mp.get_backend("cpu"))
    for _ in range(ls.STUCK_AT_FLOOR + 1):
        ls.update_on_device(bad)     # no host read, no warning yet
    with pytest.warns(RuntimeWarning, match="at its floor"):
        ls()
    assert ls.skipped_steps == ls.STUCK_AT_FLOOR + 1


# --- replays equal eager steps -----------------------------------------------------------
def _model(seed: int = 0) -> mp.Model:
    mp.random.set_seed(seed)
    inputs = mp.Input(shape=(6,))
    x = layers.Dense(5, activation="relu")(inputs)
    outputs = layers.Activation("softmax", dtype="float32")(layers.Dense(3)(x))
    return mp.Model(inputs, outputs)


_OPTIMIZERS = {"sgd": lambda: mp.optimizers.SGD(0.05, momentum=0.9),
               "rmsprop": lambda: mp.optimizers.RMSprop(0.01),
               "adam": lambda: mp.optimizers.Adam(0.01)}


def _train(backend: str, optimizer: str, scale: object, traced: bool, policy: str,
           steps: int = 7) -> tuple[list[np.ndarray], tuple[object, ...], mp.Function | None]:
    with mp.policy_scope(policy), backend_scope(backend):
        model = _model()
        opt = mp.LossScaleOptimizer(_OPTIMIZERS[optimizer](), scale)
        rng = np.random.default_rng(1)
        batches = []
        for i in range(steps):
            x = rng.normal(size=(8, 6)).astype(np.float32)
            if i == 3:
                x[0, 0] = np.inf     # Inf/NaN gradients: a skipped step
            batches.append((mp.constant(x), mp.constant(rng.integers(0, 3, 8))))

        step = custom_training_step(model, opt)
        fn = mp.function(step) if traced else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for x, y in batches:
                (fn or step)(x, y)
        state = [v.numpy() for v in model.weights + opt.variables()]
        ls = opt.loss_scale
        summary = (float(ls()), opt.iterations, opt.skipped_steps,
                   ls.num_good_steps if opt.dynamic else None)
        return state, summary, fn


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
@pytest.mark.parametrize("scale", ["dynamic", 64.0])
def test_a_replayed_step_equals_the_eager_step_bit_for_bit(backend: str, optimizer: str,
                                                           scale: object) -> None:
    eager, eager_summary, _ = _train(backend, optimizer, scale, False, "mixed_float16")
    traced, traced_summary, fn = _train(backend, optimizer, scale, True, "mixed_float16")
    assert traced_summary == eager_summary
    # Keras 3: a skipped step is not counted in iterations (its LossScaleOptimizer never
    # applies the inner optimizer then)
    assert eager_summary[1] == 6 and eager_summary[2] == 1
    for a, b in zip(eager, traced):
        np.testing.assert_array_equal(a, b)
    assert fn is not None and fn.tracing_count <= 2               # the others replayed
    graph = str(fn.graph)
    assert "[kept whole]" not in graph
    assert f"{optimizer}_update(" in graph
    if optimizer == "adam":     # its step size from the device step count
        assert "adam_rates(" in graph
    if scale == "dynamic":
        assert "loss_scale_update(" in graph and "unscale_and_check_by(" in graph


# --- no host read in a replay --------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replayed_custom_loop_step_reads_nothing_back(backend: str,
                                                        host_reads: list[str]) -> None:
    _, _, fn = _train(backend, "rmsprop", "dynamic", True, "mixed_float16", steps=3)
    assert fn is not None
    x = mp.constant(np.ones((8, 6), np.float32), backend=backend)
    y = mp.constant(np.zeros(8, np.int64), backend=backend)
    fn(x, y)                    # (a replay: traced by _train)
    count = fn.tracing_count
    host_reads.clear()
    for _ in range(5):
        fn(x, y)
    assert host_reads == [] and fn.tracing_count == count


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["mixed_float16", "float32"])
def test_fit_reads_back_per_epoch_not_per_step(backend: str, policy: str,
                                               host_reads: list[str]) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype(np.float32)
    y = rng.integers(0, 3, 256)
    counts = []
    with mp.policy_scope(policy), backend_scope(backend):
        model = _model()
        model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy",
                      jit_compile=True)
        model.fit(x[:32], y[:32], batch_size=16, verbose=0)    # traced
        for n in (64, 256):      # 4 and 16 replays of the step
            host_reads.clear()
            model.fit(x[:n], y[:n], batch_size=16, verbose=0)
            counts.append(len(host_reads))
    assert counts[0] == counts[1], counts                      # nothing per step
    if policy == "mixed_float16":
        assert model.optimizer.skipped_steps == 0 and model.optimizer.iterations == 2 + 4 + 16


def test_reading_the_scale_as_a_tensor_in_a_traced_step_replays() -> None:
    opt = mp.LossScaleOptimizer(mp.optimizers.SGD(0.1), initial_scale=8.0,
                                dynamic_growth_steps=1)
    w = mp.Variable([1.0])

    @mp.function
    def step(g: mp.Tensor) -> mp.Tensor:
        opt.apply_gradients([(opt.get_unscaled_gradients([g])[0], w)])
        return opt.dynamic_scale * 1.0

    seen = [float(step(mp.constant([v]))) for v in (1.0, 1.0, np.inf, 1.0)]
    assert seen == [16.0, 32.0, 16.0, 32.0] and step.tracing_count == 1
    with pytest.raises(mp.TraceError, match="host"):
        mp.function(lambda: float(opt.loss_scale))()


def test_iterations_is_the_device_count() -> None:
    opt = mp.optimizers.SGD(0.1)
    w = mp.Variable([1.0])
    step = mp.function(lambda g: opt.apply_gradients([(g, w)]))
    for _ in range(4):
        step(mp.constant([1.0]))
    assert opt.iterations == 4 and int(opt.iterations_variable.numpy()) == 4
    assert opt.iterations_variable.dtype == "int64"
    opt.iterations = 10
    step(mp.constant([1.0]))
    assert opt.iterations == 11 and math.isclose(float(w.numpy()[0]), 0.5, abs_tol=1e-6)



@pytest.mark.parametrize("optimizer", ["sgd", "lso"])
def test_an_eager_step_after_iterations_variable_is_assigned_counts_from_it(
        optimizer: str) -> None:
    """Keras 3's ``optimizer.iterations.assign(n)`` is ``opt.iterations_variable.assign`` here:
    an eager step after it counted on from the host's stale copy (and checkpoints saved that
    count), while the device counted from n."""
    opt = mp.optimizers.SGD(0.1)
    if optimizer == "lso":
        opt = mp.LossScaleOptimizer(opt, loss_scale=1.0)
    w = mp.Variable([1.0])
    for _ in range(3):
        opt.minimize(lambda: mp.ops.sum(w), [w])
    assert opt.iterations == 3
    opt.iterations_variable.assign(mp.ops.constant(7, "int64"))
    opt.minimize(lambda: mp.ops.sum(w), [w])
    assert int(opt.iterations_variable.numpy()) == 8
    assert opt.iterations == 8
    state = opt.get_state([w])
    assert state.get("inner", state)["iterations"] == 8

def test_reading_iterations_in_a_traced_step_says_to_use_iterations_variable() -> None:
    """``opt.iterations`` is the host's int: in a traced step it would be the tracing call's
    at every replay (before an update) or a host read (after a recorded one, the host's copy
    is dropped). Refused, naming what to use; Keras 3's own ``optimizer.iterations`` is the
    variable, ``opt.iterations_variable`` here, which replays."""
    w = mp.Variable([1.0])
    for opt in (mp.optimizers.SGD(0.1), mp.LossScaleOptimizer(mp.optimizers.Adam(0.1))):
        for read_after in (True, False):
            def step(g: mp.Tensor, opt: Any = opt, read_after: bool = read_after) -> Any:
                count = None if read_after else opt.iterations
                opt.apply_gradients([(g, w)])
                return opt.iterations if read_after else count

            with pytest.raises(mp.TraceError, match=r"Use opt\.iterations_variable instead"):
                mp.function(step)(mp.constant([1.0]))
        assert opt.iterations >= 1          # outside a step: the count, as before

        @mp.function
        def counted(g: mp.Tensor, opt: Any = opt) -> mp.Tensor:
            opt.apply_gradients([(g, w)])
            return mp.ops.cast(opt.iterations_variable, "float32") * 1.0

        start = opt.iterations
        seen = [float(counted(mp.constant([1.0]))) for _ in range(3)]
        assert seen == [start + 1.0, start + 2.0, start + 3.0] and counted.tracing_count == 1
    fallback = mp.function(lambda g: (opt.apply_gradients([(g, w)]), opt.iterations)[1],
                           fallback=True)
    with pytest.warns(RuntimeWarning, match=r"runs eagerly: .*opt\.iterations_variable"):
        assert fallback(mp.constant([1.0])) == opt.iterations


def test_fit_warns_at_the_epoch_end_when_the_scale_is_stuck_at_its_floor() -> None:
    x = np.full((64, 6), np.inf, np.float32)      # every step overflows
    y = np.zeros(64, np.int64)
    with mp.policy_scope("mixed_float16"):
        model = _model()
        model.compile(optimizer=mp.LossScaleOptimizer(mp.optimizers.SGD(), initial_scale=2.0),
                      loss="sparse_categorical_crossentropy", jit_compile=True)
        with pytest.warns(RuntimeWarning, match="at its floor"):
            model.fit(x, y, batch_size=4, verbose=0)
    assert model.optimizer.skipped_steps == 16 and model.optimizer.loss_scale() == 1.0
