"""The CPU backend's grouped updates in traced steps (backends/cpu/grouped_updates.py): the
small variables' updates run as one over gathered buffers and give the eager step's bits; a
group falls back to its members' own kernels wherever what it assumes does not hold."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np
import pytest
from conftest import assert_same_bits, custom_training_step
from mpcore_cpu.compile import runs_cpu_kernel
from mpcore_cpu.grouped_updates import GATHER_MAX_ELEMENTS, UpdateGroup, group_updates

import mpcore as mp
from mpcore import layers
from mpcore.tracing.program import NONE, Const, KernelCall, Node, Op, Program, Slot, VariableRead

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

RNG = np.random.default_rng(5)
XS = [RNG.random((16, 300), dtype=np.float32) for _ in range(4)]
YS = [RNG.integers(0, 3, 16) for _ in range(4)]

OPTIMIZERS = {
    "rmsprop": lambda: mp.optimizers.RMSprop(0.01),
    "rmsprop_momentum": lambda: mp.optimizers.RMSprop(0.01, momentum=0.5),
    "sgd": lambda: mp.optimizers.SGD(0.1),
    "sgd_momentum": lambda: mp.optimizers.SGD(0.1, momentum=0.9),
    "sgd_nesterov": lambda: mp.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
}


def model_and_optimizer(policy: str, optimizer: str) -> tuple[mp.Model, Any]:
    """A model with one variable too large to gather (300 x 64) and five small ones."""
    mp.set_global_policy(policy)
    mp.random.set_seed(2)
    inputs = mp.Input((300,))
    x = layers.Dense(64, activation="relu")(inputs)
    x = layers.Dense(8, activation="relu")(x)
    x = layers.Dense(3)(x)
    model = mp.Model(inputs, layers.Activation("softmax", dtype="float32")(x))
    assert model.trainable_variables[0].size > GATHER_MAX_ELEMENTS
    opt = OPTIMIZERS[optimizer]()
    if policy == "mixed_float16":
        opt = mp.mixed_precision.LossScaleOptimizer(opt)
    return model, opt


def groups(step: Any) -> list[UpdateGroup]:
    return [value for runner in step.runners()
            for value in runner.__globals__.values() if isinstance(value, UpdateGroup)]


def train(policy: str, optimizer: str, traced: bool,
          between: Any = None) -> tuple[list[np.ndarray], Any, Any]:
    model, opt = model_and_optimizer(policy, optimizer)
    step = custom_training_step(model, opt)
    if traced:
        step = mp.function(step)
    for n, (x, y) in enumerate(zip(XS, YS, strict=True)):
        step(mp.constant(x), mp.constant(y))
        if between is not None:
            between(n, model, opt)
    state = [*model.get_weights(), *(np.asarray(v.numpy()) for v in opt.variables())]
    return state, step, opt


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_a_grouped_update_gives_the_eager_steps_bits(policy: str, optimizer: str) -> None:
    want, _, _ = train(policy, optimizer, traced=False)
    got, step, _ = train(policy, optimizer, traced=True)
    for a, b in zip(got, want, strict=True):
        assert_same_bits(a, b)
    found = groups(step)
    # (under mixed_float16 too: the LossScaleOptimizer's update is recorded kernel by kernel)
    assert len(found) == 1 and len(found[0].sizes) == 5      # the five small variables
    # every replay gathered (with slots to make, the first call made them: the second traced),
    # but a step the loss scale skipped (float16 overflow at the first scale)
    replays = len(XS) - step.tracing_count
    if policy == "mixed_float16":
        assert 1 <= found[0].gathered <= replays
    else:
        assert found[0].gathered == replays


def test_a_skipped_step_leaves_every_grouped_variable_and_slot_as_it_was() -> None:
    model, opt = model_and_optimizer("float32", "rmsprop")
    step = mp.function(custom_training_step(model, opt))
    step(mp.constant(XS[0]), mp.constant(YS[0]))
    before = [v.numpy() for v in [*model.trainable_variables, *opt.variables()]]
    bad = XS[1].copy()
    bad[0, 0] = np.inf                       # an inf input: non-finite gradients
    step(mp.constant(bad), mp.constant(YS[1]))
    assert step.tracing_count == 2 and groups(step)      # a replay (the first call made slots)
    for v, b in zip([*model.trainable_variables, *opt.variables()], before, strict=True):
        assert_same_bits(v.numpy(), b)


def test_variables_assigned_between_replays_are_gathered_from_their_new_arrays() -> None:
    """A checkpoint restore (assign) gives a variable a new array: the group takes it."""
    def restore(n: int, model: mp.Model, opt: Any) -> None:
        if n == 1:
            model.set_weights([w * 0.5 for w in model.get_weights()])
            for v in opt.variables():
                v.assign(np.asarray(v.numpy()) + 0.25)

    want, _, _ = train("float32", "rmsprop", traced=False, between=restore)
    got, step, _ = train("float32", "rmsprop", traced=True, between=restore)
    for a, b in zip(got, want, strict=True):
        assert_same_bits(a, b)
    assert groups(step)[0].gathered == len(XS) - step.tracing_count


def traced_group() -> tuple[UpdateGroup, list[np.ndarray], list[np.ndarray]]:
    """The group of a traced RMSprop step, with state and gradient arrays like its own."""
    _, step, _ = train("float32", "rmsprop", traced=True)
    group = groups(step)[0]
    rng = np.random.default_rng(0)
    states = []
    for size in group.sizes:
        states += [rng.standard_normal(size).astype(np.float32),
                   rng.random(size, dtype=np.float32)]
    grads = [rng.standard_normal(size).astype(np.float32) for size in group.sizes]
    return group, states, grads


def one_by_one(group: UpdateGroup, states: list[np.ndarray], grads: list[np.ndarray],
               flag: Any = None) -> None:
    """What the plain replay runs: each member's update through the CPU kernel."""
    kernel = mp.get_backend("cpu").kernels()["rmsprop_update"]
    for m, grad in enumerate(grads):
        var, ms = states[2 * m], states[2 * m + 1]
        kernel(var, grad, ms, None, *group.hyper, flag)


def copies(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in arrays]


def test_the_gathered_update_equals_the_members_kernels_on_awkward_values() -> None:
    group, states, grads = traced_group()
    grads[0][:4] = [np.inf, np.nan, -0.0, 3e38]
    states[1][:2] = [0.0, np.inf]
    want_states = copies(states)
    gathered = group.gathered
    with np.errstate(all="ignore"):          # (as the members' kernels: no flag, no check)
        one_by_one(group, want_states, copies(grads))
        group(states, grads, None)
    assert group.gathered == gathered + 1
    for a, b in zip(states, want_states, strict=True):
        assert_same_bits(a, b)


@pytest.mark.parametrize("flag", [False, True])
def test_the_flag_gates_a_gathered_update(flag: bool) -> None:
    group, states, grads = traced_group()
    want = copies(states)
    one_by_one(group, want, copies(grads), np.asarray(flag))
    gathered = group.gathered
    group(states, grads, np.asarray(flag))
    assert group.gathered == gathered + flag
    for a, b in zip(states, want, strict=True):
        assert_same_bits(a, b)


def alias_gradient(states: list[np.ndarray], grads: list[np.ndarray]) -> None:
    grads[0] = states[2][:grads[0].size]       # member 0's gradient is a view of member 1's var


def share_state(states: list[np.ndarray], grads: list[np.ndarray]) -> None:
    states[3] = states[2]                      # member 1's slot is its variable's array


def strided_state(states: list[np.ndarray], grads: list[np.ndarray]) -> None:
    states[0] = np.repeat(states[0], 2)[::2]


def float64_gradient(states: list[np.ndarray], grads: list[np.ndarray]) -> None:
    grads[2] = grads[2].astype(np.float64)


@pytest.mark.parametrize("spoil", [alias_gradient, share_state, strided_state, float64_gradient])
def test_a_group_runs_its_members_one_by_one_where_gathering_would_differ(spoil: Any) -> None:
    group, states, grads = traced_group()
    spoil(states, grads)
    want_states, want_grads = copies(states), copies(grads)
    if spoil is alias_gradient:
        want_grads[0] = want_states[2][:grads[0].size]
    if spoil is share_state:
        want_states[3] = want_states[2]
    gathered = group.gathered
    with np.errstate(all="ignore"):
        one_by_one(group, want_states, want_grads)
        group(states, grads, None)
    assert group.gathered == gathered                  # not gathered
    for a, b in zip(states, want_states, strict=True):
        assert_same_bits(a, b)


def test_two_optimizers_updates_are_grouped_apart() -> None:
    model, opt = model_and_optimizer("float32", "rmsprop")
    other = mp.optimizers.RMSprop(-0.0)              # -0.0: not the 0.0 of another run
    variables = model.trainable_variables
    loss_fn = mp.losses.SparseCategoricalCrossentropy()

    @mp.function
    def step(x: Any, y: Any) -> Any:
        with mp.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads[:3], variables[:3]))
        other.apply_gradients(zip(grads[3:], variables[3:]))
        return loss

    for x, y in zip(XS, YS, strict=True):
        step(mp.constant(x), mp.constant(y))
    found = groups(step)
    assert sorted(len(g.sizes) for g in found) == [2, 3]
    rates = [g.hyper[0] for g in found if len(g.sizes) == 3]
    assert rates == [0.0] and math.copysign(1.0, rates[0]) == -1.0


FLAG = Slot(0)


def update_step(var: mp.Variable, lr: float, flag: Node = FLAG) -> KernelCall:
    grad = Slot(1)
    slot = VariableRead(mp.Variable(np.zeros(var.shape, np.float32)))
    return KernelCall(Op("rmsprop_update", lambda *a: None),
                      (VariableRead(var), grad, slot, NONE, Const(lr), Const(0.9), Const(0.0),
                       Const(1e-7), flag), NONE, "")


def grouped_sizes(steps: list[Any]) -> list[int]:
    program = Program(steps, 2, [0, 1], NONE)
    grouped = group_updates(program)
    if grouped is None:
        return []
    return [len(s.kernel.sizes) for s in grouped.steps if isinstance(s.kernel, UpdateGroup)]


def test_only_runs_of_like_updates_of_distinct_small_variables_are_grouped() -> None:
    small = [mp.Variable(np.zeros((4, 4), np.float32)) for _ in range(4)]
    big = mp.Variable(np.zeros(GATHER_MAX_ELEMENTS + 1, np.float32))
    assert grouped_sizes([update_step(v, 0.1) for v in small]) == [4]
    assert grouped_sizes([update_step(small[0], 0.1), update_step(small[1], 0.1),
                          update_step(small[2], -0.1), update_step(small[3], 0.1)]) == [2]
    assert grouped_sizes([update_step(small[0], 0.0), update_step(small[1], -0.0)]) == []
    assert grouped_sizes([update_step(small[0], 0.1), update_step(big, 0.1),
                          update_step(small[1], 0.1)]) == []
    assert grouped_sizes([update_step(small[0], 0.1), update_step(small[1], 0.1, Slot(1))]) == []
    assert grouped_sizes([update_step(small[0], 0.1), update_step(small[0], 0.1)]) == []
    assert grouped_sizes([update_step(mp.Variable(np.zeros(3, np.float64)), 0.1),
                          update_step(small[0], 0.1)]) == []


@pytest.mark.parametrize("assigns", [1, 2, 4])
def test_a_variable_assigned_again_and_again_is_updated_in_its_new_array(assigns: int) -> None:
    """An assignment may free a variable's array and the next may get its id back: the group
    holds what it accepted, so an id it knows is always the same array (an adversarial
    trial: with 2 or 4 assignments between steps the weights stopped moving)."""
    def run(traced: bool) -> tuple[np.ndarray, np.ndarray]:
        w = mp.Variable(np.full((64, 64), 1.0, np.float32))
        b = mp.Variable(np.full((64,), 1.0, np.float32))
        opt = mp.optimizers.SGD(0.5)

        def step(x: Any) -> Any:
            with mp.GradientTape() as tape:
                loss = mp.ops.sum(mp.ops.square(mp.ops.matmul(x, w) + b))
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
            return loss

        if traced:
            step = mp.function(step)
        x = mp.constant(np.ones((2, 64), np.float32))
        for _ in range(5):
            step(x)
            for _ in range(assigns):
                w.assign(np.full((64, 64), 1.0, np.float32))
        step(x)
        return w.numpy(), b.numpy()

    for got, want in zip(run(True), run(False), strict=True):
        assert_same_bits(got, want)


def test_an_update_a_plugin_wraps_is_not_grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider's update may do more than the CPU's body (here: a decay): its calls stay."""
    table = mp.get_backend("cpu").kernels()
    original = table["sgd_update"]
    calls = []

    def decayed(var: Any, grad: Any, velocity: Any, *rest: Any) -> None:
        calls.append(var.shape)
        var *= np.float32(0.9)
        original(var, grad, velocity, *rest)

    monkeypatch.setitem(table, "sgd_update", decayed)
    want, _, _ = train("float32", "sgd", traced=False)
    eager_calls = len(calls)
    got, step, _ = train("float32", "sgd", traced=True)
    assert groups(step) == [] and len(calls) == 2 * eager_calls
    for a, b in zip(got, want, strict=True):
        assert_same_bits(a, b)


def test_onednns_updates_leave_the_small_variables_to_the_cpu_kernel() -> None:
    backend = mp.get_backend("cpu")
    table = backend.kernels()
    if not hasattr(table["rmsprop_update"], "calls_original_below"):
        pytest.skip("oneDNN does not provide the updates here")
    below = table["rmsprop_update"].calls_original_below
    assert runs_cpu_kernel(backend, "rmsprop_update", GATHER_MAX_ELEMENTS)
    assert not runs_cpu_kernel(backend, "rmsprop_update", below)
    assert not runs_cpu_kernel(backend, "rmsprop_update")


def test_a_group_another_thread_is_running_runs_its_members_one_by_one() -> None:
    group, states, grads = traced_group()
    want = copies(states)
    one_by_one(group, want, copies(grads))
    gathered = group.gathered
    with group._lock:                       # as while another thread replays the step
        group(states, grads, None)
    assert group.gathered == gathered
    for a, b in zip(states, want, strict=True):
        assert_same_bits(a, b)


def test_a_skipped_replay_in_one_thread_never_reaches_the_weights_of_another() -> None:
    """Two threads replay one step, one of them with non-finite gradients (a review found
    that they shared the group's buffers)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)             # threads switch often: the race shows
    try:
        w = mp.Variable(np.full((64, 64), 0.01, np.float32))
        b = mp.Variable(np.zeros(64, np.float32))
        opt = mp.optimizers.SGD(1e-3)

        @mp.function
        def step(x: Any) -> Any:
            with mp.GradientTape() as tape:
                loss = mp.ops.sum(mp.ops.square(mp.ops.matmul(x, w) + b))
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
            return loss

        good = mp.constant(np.full((2, 64), 0.1, np.float32))
        bad_x = np.ones((2, 64), np.float32)
        bad_x[0, 0] = np.inf
        bad = mp.constant(bad_x)
        step(good)
        step(bad)
        assert groups(step)

        def run(x: Any) -> None:
            for _ in range(1000):
                step(x)

        threads = [threading.Thread(target=run, args=(x,)) for x in (good, bad)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    finally:
        sys.setswitchinterval(previous)
    assert np.isfinite(w.numpy()).all() and np.isfinite(b.numpy()).all()


def test_a_gradient_passed_in_as_a_variables_array_is_not_gathered() -> None:
    """A step's input may be a variable's own array, which the signature does not tell apart
    (a review: the second variable's update read the first's updated values)."""
    def run(traced: bool) -> list[np.ndarray]:
        v1 = mp.Variable(np.ones(8, np.float32))
        v2 = mp.Variable(np.ones(8, np.float32))
        opt = mp.optimizers.SGD(0.5)

        def step(g1: Any, g2: Any) -> Any:
            opt.apply_gradients([(g1, v1), (g2, v2)])
            return mp.ops.sum(g1)

        if traced:
            step = mp.function(step)
        for i in range(3):
            g1 = mp.constant(np.full(8, 1.0, np.float32))
            g2 = mp.constant(np.full(8, 2.0, np.float32)) if i < 2 else v1.current_value()
            step(g1, g2)
        return [v1.numpy(), v2.numpy()]

    for got, want in zip(run(True), run(False), strict=True):
        assert_same_bits(got, want)


def test_an_update_whose_slot_is_a_captured_array_compiles_and_runs() -> None:
    """A slot given as a plain array is a constant of the program (a review: comparing it
    with None raised while compiling)."""
    def run(traced: bool) -> list[np.ndarray]:
        v1, v2 = (mp.Variable(np.ones(4, np.float32)) for _ in range(2))
        vel1, vel2 = np.zeros(4, np.float32), np.zeros(4, np.float32)

        def step(g: Any) -> Any:
            kernel = mp.get_backend("cpu").kernels()["sgd_update"]
            kernel(v1.data, g.data, vel1, 0.1, 0.9, False, None)
            kernel(v2.data, g.data, vel2, 0.1, 0.9, False, None)
            return g

        if traced:
            step = mp.function(step)
        for _ in range(3):
            step(mp.constant(np.ones(4, np.float32)))
        return [v1.numpy(), v2.numpy(), vel1, vel2]

    for got, want in zip(run(True), run(False), strict=True):
        assert_same_bits(got, want)
