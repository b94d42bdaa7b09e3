"""What a traced step's program runs: kernel calls whose operands are all constants are folded
once at compile time (and never the in-place updates, the inputs, variables or fresh seeds), a
fresh random permutation per replay, and the fused cross-entropy backward on the CPU, all bit
for bit the eager results."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore.tracing.program import KernelCall, fold_constants

RNG = np.random.default_rng(5)


def _calls(program: object) -> list[str]:
    return [s.name for s in program.steps if type(s) is KernelCall]  # type: ignore[attr-defined]


def test_calls_on_constants_are_folded_and_the_replay_still_equals_eager() -> None:
    mp.set_global_policy("float32")
    c = mp.constant(RNG.random(4, dtype=np.float32))

    def step(x: mp.Tensor) -> mp.Tensor:
        scale = mp.ops.divide(mp.ops.broadcast_to(mp.ops.reshape(mp.ops.full((), 3.0), (1,)),
                                                  (4,)), 4.0)       # constants only: folded
        return mp.ops.exp(x * scale + c)                              # reads the input: kept

    f = mp.function(step)
    for _ in range(3):
        x = mp.constant(RNG.random(4, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(step(x)))
    assert f.tracing_count == 1
    recorded, folded = _calls(f.graph), _calls(fold_constants(f.graph))
    assert recorded[:4] == ["full", "reshape", "broadcast_to", "divide"]
    assert folded == ["multiply", "add", "exp"]
    assert len(str(f.graph).splitlines()) == len(recorded)   # the graph shows what was recorded


def test_variables_seeds_and_in_place_updates_are_never_folded() -> None:
    mp.set_global_policy("float32")
    v = mp.Variable(np.ones(3, np.float32))
    ms = mp.Variable(np.zeros(3, np.float32))

    def step() -> mp.Tensor:
        noise = mp.ops.random_uniform((3,))                           # a fresh seed each call
        grad = mp.ops.full((3,), 0.5)                                 # constant: folded
        mp.ops.rmsprop_update(v, grad, ms, None, 0.1, 0.9, 0.0, 1e-7)   # writes v and ms
        return mp.ops.add(v.current_value(), noise)

    f = mp.function(step)
    outs = [np.asarray(f()) for _ in range(3)]
    assert _calls(fold_constants(f.graph)) == ["random_uniform", "rmsprop_update", "add"]
    assert not np.array_equal(outs[1], outs[2])                      # fresh noise, moving v
    mp.set_global_policy("float32")
    v2, ms2 = mp.Variable(np.ones(3, np.float32)), mp.Variable(np.zeros(3, np.float32))
    for _ in range(3):
        mp.ops.rmsprop_update(v2, mp.ops.full((3,), 0.5), ms2, None, 0.1, 0.9, 0.0, 1e-7)
    np.testing.assert_array_equal(v.numpy(), v2.numpy())              # three real updates
    np.testing.assert_array_equal(ms.numpy(), ms2.numpy())


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_random_permutation_is_a_seeded_order_of_range_n(backend: mp.Backend, n: int) -> None:
    a = np.asarray(mp.ops.random_permutation(n, seed=3, backend=backend))
    assert a.dtype == np.int64 and sorted(a.tolist()) == list(range(n))
    np.testing.assert_array_equal(a, np.asarray(mp.ops.random_permutation(n, seed=3,
                                                                          backend=backend)))
    if n == 1000:   # every built-in backend draws the CPU's order
        np.testing.assert_array_equal(a, np.asarray(mp.ops.random_permutation(n, seed=3,
                                                                              backend="cpu")))


@pytest.mark.parametrize("n", [-1, 2.0, True, "3", None])
def test_random_permutation_refuses_what_is_not_a_count(n: object) -> None:
    with pytest.raises(ValueError, match="n of random_permutation must be an integer >= 0"):
        mp.ops.random_permutation(n)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [-1, 3.7, True, "3", [1, 2]])
def test_random_permutation_refuses_a_seed_that_is_not_a_whole_number(seed: object) -> None:
    with pytest.raises(ValueError, match="seed of random_permutation must be an integer >= 0"):
        mp.ops.random_permutation(4, seed=seed)  # type: ignore[arg-type]


def test_random_permutation_takes_numpy_integers() -> None:
    a = mp.ops.random_permutation(np.int64(5), seed=np.uint32(2))
    assert sorted(np.asarray(a).tolist()) == list(range(5))


def test_a_traced_permutation_draws_a_fresh_order_at_each_replay() -> None:
    mp.random.set_seed(9)
    f = mp.function(lambda x: mp.ops.take(x, mp.ops.random_permutation(50), 0))
    x = mp.constant(np.arange(50, dtype=np.float32))
    traced = [np.asarray(f(x)) for _ in range(3)]
    mp.random.set_seed(9)
    eager = [np.asarray(mp.ops.take(x, mp.ops.random_permutation(50), 0)) for _ in range(3)]
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(traced[1], traced[2])


def test_the_fused_cross_entropy_backward_equals_the_composite_bit_for_bit() -> None:
    be = mp.get_backend("cpu")
    fused = be.kernels()["sparse_softmax_cross_entropy_grad"]
    logits = RNG.normal(0, 4, (33, 7)).astype(np.float32)
    labels = RNG.integers(0, 7, 33)
    g = RNG.random(33, dtype=np.float32)
    g[3] = np.inf                                       # a non-finite upstream row too
    _, probs = be.kernels()["sparse_softmax_cross_entropy"](logits, labels)
    want = (probs - (labels[:, None] == np.arange(7)).astype(np.float32)) * g[:, None]
    np.testing.assert_array_equal(fused(probs, labels, g), want)


# --- an optimizer's update recorded kernel by kernel ------------------------------------------
def _mlp(policy: str, opt: mp.optimizers.Optimizer) -> tuple[mp.Model, mp.optimizers.Optimizer]:
    from conftest import mlp_and_optimizer

    model, _ = mlp_and_optimizer(policy)      # the traced-step tests' MLP, dropout included
    return model, opt


def _train(policy: str, make_opt: object, traced: bool, steps: int = 4,
           change_lr_at: int | None = None, bad_step: int | None = None
           ) -> tuple[list[float], list[np.ndarray], mp.optimizers.Optimizer, object]:
    from conftest import custom_training_step

    model, opt = _mlp(policy, make_opt())  # type: ignore[operator]
    step = custom_training_step(model, opt)
    if traced:
        step = mp.function(step)
    rng = np.random.default_rng(2)
    losses = []
    for i in range(steps):
        if i == change_lr_at:
            opt.learning_rate = 0.05
        x = rng.random((16, 20), dtype=np.float32)
        if i == bad_step:
            x[0, 0] = np.inf
        losses.append(float(np.asarray(step(mp.constant(x), mp.constant(rng.integers(0, 4, 16))))))
    return losses, model.get_weights(), opt, step


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("make_opt", [lambda: mp.optimizers.RMSprop(0.01),
                                      lambda: mp.optimizers.SGD(0.1, momentum=0.9)],
                         ids=["rmsprop", "sgd-momentum"])
def test_a_plain_update_is_recorded_kernel_by_kernel_and_equals_eager(policy: str,
                                                                       make_opt: object) -> None:
    eager = _train(policy, make_opt, traced=False)
    traced = _train(policy, make_opt, traced=True)
    assert traced[0] == eager[0]
    for a, b in zip(traced[1], eager[1], strict=True):
        np.testing.assert_array_equal(a, b)
    opt, step = traced[2], traced[3]
    assert opt.iterations == eager[2].iterations == 4
    graph = str(step.graph)  # type: ignore[attr-defined]
    assert "[kept whole]" not in graph and "finish_recorded_update(...)  [on each replay]" in graph
    assert len(opt.last_gradients) == len(opt.last_variables) == 4
    assert opt.last_gradients[0].shape == (20, 16)


def test_changing_a_hyperparameter_after_the_trace_retraces_and_takes_effect() -> None:
    make = lambda: mp.optimizers.RMSprop(0.01)  # noqa: E731
    eager = _train("float32", make, traced=False, change_lr_at=2)
    traced = _train("float32", make, traced=True, change_lr_at=2)
    assert traced[0] == eager[0]
    for a, b in zip(traced[1], eager[1], strict=True):
        np.testing.assert_array_equal(a, b)
    # the first call made the slots (run eagerly), the second traced, the new rate retraced
    assert traced[3].tracing_count == 3  # type: ignore[attr-defined]
    assert "0.05" in str(traced[3].graph)  # type: ignore[attr-defined]


@pytest.mark.parametrize("make_opt", [
    lambda: mp.optimizers.RMSprop(lambda step: 0.01 / (1 + step)),  # a schedule: step-dependent
], ids=["schedule"])
def test_updates_that_hold_per_step_state_stay_whole_and_equal_eager(make_opt: object) -> None:
    eager = _train("float32", make_opt, traced=False)
    traced = _train("float32", make_opt, traced=True)
    assert traced[0] == eager[0]
    for a, b in zip(traced[1], eager[1], strict=True):
        np.testing.assert_array_equal(a, b)
    graph = str(traced[3].graph)  # type: ignore[attr-defined]
    assert "[kept whole]" in graph and "its __call__ runs in Python" in graph


@pytest.mark.parametrize("make_opt", [
    lambda: mp.optimizers.Adam(0.01),              # its step size from the device step count
    lambda: mp.optimizers.RMSprop(0.01, clipnorm=1.0),
    lambda: mp.optimizers.RMSprop(0.01, gradient_accumulation_steps=2),   # on the device
    lambda: mp.optimizers.SGD(mp.optimizers.schedules.ExponentialDecay(0.01, 2, 0.5)),
], ids=["adam", "clipping", "accumulation", "device-schedule"])
def test_adam_and_clipping_are_recorded_and_equal_eager(make_opt: object) -> None:
    eager = _train("float32", make_opt, traced=False)
    traced = _train("float32", make_opt, traced=True)
    assert traced[0] == eager[0]
    for a, b in zip(traced[1], eager[1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert "[kept whole]" not in str(traced[3].graph)  # type: ignore[attr-defined]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # Inf * 0
def test_a_non_finite_step_of_a_recorded_update_is_skipped_as_eagerly() -> None:
    make = lambda: mp.optimizers.RMSprop(0.01)  # noqa: E731
    eager = _train("float32", make, traced=False, bad_step=2)
    traced = _train("float32", make, traced=True, bad_step=2)
    for a, b in zip(traced[1], eager[1], strict=True):
        np.testing.assert_array_equal(a, b)
        assert np.isfinite(a).all()
    assert not bool(np.asarray(_train("float32", make, traced=True, steps=3,
                                      bad_step=2)[2].last_flag))


def test_casts_cached_before_a_recorded_update_are_not_read_after_it() -> None:
    """The update writes the weights in place at each replay; a bfloat16 copy a layer cached
    eagerly must not survive it (an eager predict after traced steps sees the new weights)."""
    make = lambda: mp.optimizers.RMSprop(0.01)  # noqa: E731
    x = np.random.default_rng(4).random((8, 20), dtype=np.float32)
    # eager and traced training alike: an eager call of the model before and after each step
    results = []
    for traced in (False, True):
        from conftest import custom_training_step

        model, opt = _mlp("mixed_bfloat16", make())
        step = custom_training_step(model, opt)
        step = mp.function(step) if traced else step
        rng = np.random.default_rng(6)
        seen = []
        for _ in range(3):
            seen.append(np.asarray(model(mp.constant(x))))   # caches the bfloat16 weights
            step(mp.constant(rng.random((16, 20), dtype=np.float32)),
                 mp.constant(rng.integers(0, 4, 16)))
        seen.append(np.asarray(model(mp.constant(x))))
        results.append(seen)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(results[1][0], results[1][-1])


# --- defects found by a trial of the above (each names what it checks) ------------------------
def _sgd_step(opt: mp.optimizers.Optimizer, v: mp.Variable) -> object:
    def step(x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.matmul(x, v))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        return mp.ops.multiply(v, 1.0)              # read after the update, in the same step

    return step


def _run(make_opt: object, traced: bool, steps: int, per_step: object = None
         ) -> tuple[list[np.ndarray], object]:
    mp.set_global_policy("float32")
    v = mp.Variable(np.linspace(0.5, 1.5, 16, dtype=np.float32).reshape(4, 4))
    opt = make_opt()  # type: ignore[operator]
    step = _sgd_step(opt, v)
    fn = mp.function(step) if traced else step
    x = mp.constant(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    outs = []
    for i in range(steps):
        if per_step is not None:
            per_step(opt, i)  # type: ignore[operator]
        outs.append(np.asarray(fn(x)))
    return outs, fn


def test_a_rate_set_at_every_step_retraces_a_few_times_then_runs_whole() -> None:
    def warm_up(opt: mp.optimizers.Optimizer, i: int) -> None:
        opt.learning_rate = 0.1 * min(1.0, (i + 1) / 10)
        opt.learning_rate = opt.learning_rate      # the same value again: no new setting
        opt.note = "unrelated"                      # not a hyperparameter

    make = lambda: mp.optimizers.SGD(0.1, momentum=0.9)  # noqa: E731
    eager, _ = _run(make, False, 20, warm_up)
    traced, fn = _run(make, True, 20, warm_up)
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    # 4 settings recorded (the first by the call that made the slots, run eagerly), then one
    # trace with the update kept whole, which every later rate reuses
    assert fn.tracing_count == 4 + 1  # type: ignore[attr-defined]
    assert "[kept whole]" in str(fn.graph)  # type: ignore[attr-defined]


class _WarmupSGD(mp.optimizers.SGD):
    def _update_variable(self, var: mp.Variable, grad: mp.Tensor, slots: dict, lr: float,
                         step: int, flag: object) -> None:
        super()._update_variable(var, grad, slots, lr * min(1.0, step / 10), step, flag)


class _DecaySGD(mp.optimizers.SGD):
    @property
    def learning_rate(self) -> float:
        return 0.1 * 0.5 ** self.iterations

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        pass


@pytest.mark.parametrize("cls", [_WarmupSGD, _DecaySGD])
def test_a_subclass_that_computes_its_rate_per_step_is_kept_whole(cls: type) -> None:
    eager, _ = _run(lambda: cls(0.1), False, 6)
    traced, fn = _run(lambda: cls(0.1), True, 6)
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    assert "[kept whole]" in str(fn.graph)  # type: ignore[attr-defined]


@pytest.mark.parametrize("make_opt", [
    lambda: mp.optimizers.Adam(0.1),
    lambda: mp.optimizers.RMSprop(0.1, clipnorm=0.5),
], ids=["adam", "rmsprop-clipped"])
@pytest.mark.parametrize("fused", [True, False])
def test_a_variable_read_after_an_update_kept_whole_is_the_new_value(make_opt: object,
                                                                    fused: bool) -> None:
    def make() -> mp.optimizers.Optimizer:
        opt = make_opt()  # type: ignore[operator]
        opt.use_fused_kernels = fused          # unfused: the update assigns new arrays
        return opt

    eager, _ = _run(make, False, 4)
    traced, _ = _run(make, True, 4)
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(traced[2], traced[3])


def test_a_captured_host_array_is_read_as_it_is_at_each_call() -> None:
    mp.set_global_policy("float32")
    w = np.array([1.0, 2.0, 3.0], np.float32)

    def f(x: mp.Tensor) -> mp.Tensor:
        return x * mp.constant(w) + mp.ops.sum(mp.constant(w))

    traced = mp.function(f)
    x = mp.constant(np.ones(3, np.float32))
    for value in (1.0, 10.0, -2.0):
        w[:] = value
        np.testing.assert_array_equal(np.asarray(traced(x)), np.asarray(f(x)))


def test_a_traced_function_does_not_keep_the_optimizers_it_saw_alive() -> None:
    import gc
    import weakref

    mp.set_global_policy("float32")
    v = mp.Variable(np.ones((2, 2), np.float32))

    @mp.function
    def step(opt: mp.optimizers.Optimizer, x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.matmul(x, v))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        return loss

    refs = []
    for _ in range(3):
        opt = mp.optimizers.SGD(0.1)
        for _ in range(2):
            step(opt, mp.constant(np.ones((1, 2), np.float32)))
        refs.append(weakref.ref(opt))
    del opt
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    step(mp.optimizers.SGD(0.1), mp.constant(np.ones((1, 2), np.float32)))  # still works


@pytest.mark.usefixtures("on_cpu")   # the CPU's relu_grad_bias calls its matmul
def test_a_kernel_calling_another_through_the_table_is_recorded_once() -> None:
    """The CPU's 16-bit bias gradient sums with the matmul kernel it takes from the kernel
    table: only the outer call is the step's (the inner one was recorded too, and replayed on
    the trace's arrays, found in the mixed_bfloat16 guide step's graph)."""
    mp.set_global_policy("float32")
    rng = np.random.default_rng(8)

    def f(g: mp.Tensor, y: mp.Tensor) -> mp.Tensor:
        return mp.ops.relu_grad_bias(g, y)[1]

    traced = mp.function(f)
    for _ in range(3):
        g = mp.constant(rng.normal(size=(16, 8)).astype(np.float32), dtype="bfloat16")
        y = mp.constant(rng.normal(size=(16, 8)).astype(np.float32), dtype="bfloat16")
        np.testing.assert_array_equal(np.asarray(traced(g, y)), np.asarray(f(g, y)))
    assert _calls(traced.graph) == ["relu_grad_bias"]


def test_an_optimizer_replaced_without_compile_trains_in_traced_fit_as_eagerly() -> None:
    """A re-trial: the traced step kept updating the model's old optimizer."""
    rng = np.random.default_rng(12)
    x, y = rng.random((32, 20), dtype=np.float32), rng.integers(0, 4, 32)
    runs = []
    for jit in (False, True):
        model, _ = _mlp("float32", mp.optimizers.SGD(0.1))
        model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(0.1),
                      jit_compile=jit)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        old, model.optimizer = model.optimizer, mp.optimizers.RMSprop(0.01)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        runs.append((model.get_weights(), old.iterations, model.optimizer.iterations))
    assert runs[0][1:] == runs[1][1:] == (4, 4)
    for a, b in zip(runs[0][0], runs[1][0], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("on_cpu")  # the CPU's replay adopts
def test_a_replay_on_the_cpu_hands_an_assignment_its_copy_and_copies_nothing_else_twice(
        ) -> None:
    """A traced assignment records the copy ``Variable.assign`` makes; the CPU's replay hands
    that array to the variable (``Variable.adopt``) instead of copying it again. The values
    stay right when the assigned tensor is returned and when the variable is read after its
    assignment, and the variable's array is its own: changing it in place after the step
    changes nothing the step returned."""
    mp.set_global_policy("float32")
    counter = mp.Variable(np.zeros((), np.int64), trainable=False, name="counter")
    total = mp.Variable(np.zeros(3, np.float32), trainable=False, name="total")
    kept = mp.Variable(np.zeros(3, np.float32), trainable=False, name="kept")
    again = mp.Variable(np.zeros(3, np.float32), trainable=False, name="again")

    def step(x: mp.Tensor) -> tuple[mp.Tensor, mp.Tensor]:
        counter.assign_add(1)
        total.assign(total + x)
        y = x * 2.0
        kept.assign(y)            # its copy is kept's alone; y itself is returned
        again.assign(x)
        return y, again + 1.0     # again read after its assignment

    f = mp.function(step)
    outs = []
    for n in range(1, 4):
        x = mp.constant(np.full(3, n, np.float32))
        outs.append(f(x))
        assert counter.numpy() == n
        np.testing.assert_array_equal(outs[-1][1].numpy(), [n + 1.0] * 3)
    np.testing.assert_array_equal(total.numpy(), [6.0, 6.0, 6.0])
    np.testing.assert_array_equal(kept.numpy(), [6.0, 6.0, 6.0])
    source = f.runners()[0].source
    assert source.count(".adopt(") == 4 and ".assign(" not in source
    # the variable's array is its own: writing it leaves the outputs alone
    kept._data[...] = -1.0
    again._data[...] = -1.0
    np.testing.assert_array_equal(outs[-1][0].numpy(), [6.0, 6.0, 6.0])
    np.testing.assert_array_equal(outs[-1][1].numpy(), [4.0, 4.0, 4.0])
