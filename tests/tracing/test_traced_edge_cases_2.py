"""Traced steps at the edges of their contract, second round: each case from a review of the
first round's fixes (its defect numbers, R1-R7) and a replay compared with the eager call on
every backend here, or a refusal with its message."""

from __future__ import annotations

import collections
import gc
from typing import Any

import numpy as np
import pytest

import mpcore as mp

F32 = np.float32


def _c(*values: float) -> mp.Tensor:
    return mp.constant(np.array(values, F32))


def _both(make: Any, calls: int = 3, arg: Any = None) -> dict[bool, list[list[float]]]:
    """``make()`` gives a fresh (step, state) pair; the step's results eagerly and traced."""
    out = {}
    for traced in (False, True):
        step = make()
        f = mp.function(step) if traced else step
        out[traced] = [np.asarray(f(arg if arg is not None else mp.ops.ones((3,)))).tolist()
                       for _ in range(calls)]
    return out


@pytest.mark.parametrize("clipped", [False, True])
def test_a_value_read_before_a_composite_update_is_each_replays(backend: mp.Backend,
                                                                clipped: bool) -> None:
    """R2: the composite (not fused) SGD update assigns the variable, recorded kernel by kernel
    or, with clipping, inside a call kept whole; a value taken before it was the trace's."""
    def make() -> Any:
        v = mp.Variable(np.array([1, 2, 3], F32))
        opt = mp.optimizers.SGD(0.1, clipnorm=100.0) if clipped else mp.optimizers.SGD(0.1)
        opt.use_fused_kernels = False

        def step(x: mp.Tensor) -> mp.Tensor:
            old = v.current_value()
            with mp.GradientTape() as tape:
                loss = mp.ops.sum(mp.ops.multiply(v, x))
            opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
            return mp.ops.subtract(v, old)
        return step

    out = _both(make)
    assert out[True] == out[False]
    np.testing.assert_allclose(out[True], [[-0.1] * 3] * 3, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_an_update_in_place_after_an_assignment_writes_the_variable(backend: mp.Backend,
                                                                    fused: bool) -> None:
    """R6: after ``v.assign``, a fused update wrote the replay's slot, not the variable."""
    finals = {}
    for traced in (False, True):
        v = mp.Variable(np.zeros(3, F32))
        opt = mp.optimizers.SGD(0.5)
        opt.use_fused_kernels = fused

        def step(x: mp.Tensor, v: Any = v, opt: Any = opt) -> mp.Tensor:
            v.assign(mp.ops.multiply(x, 2.0))
            with mp.GradientTape() as tape:
                loss = mp.ops.sum(mp.ops.multiply(v, x))
            opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
            return mp.ops.multiply(v, 1.0)

        f = mp.function(step) if traced else step
        results = [np.asarray(f(_c(n, n, n))).tolist() for n in (1, 2, 3)]
        finals[traced] = (results, v.numpy().tolist())
    assert finals[True] == finals[False]
    assert finals[True][1] == [4.5, 4.5, 4.5]            # 2 * 3 - 0.5 * 3


def test_tensors_and_numpy_scalars_as_keys_or_set_members_are_each_calls() -> None:
    """R3: the signature took them by value but the step read them as constants."""
    f = mp.function(lambda s: mp.ops.add(next(iter(s)), 0.0))
    g = mp.function(lambda x, weights: mp.ops.multiply(
        x, float(next(iter(weights.values()))) * float(next(iter(weights)))))
    x = _c(1, 1)
    for n in (1, 2, 3):
        assert np.asarray(f(frozenset({_c(n, n)}))).tolist() == [n, n]
        assert np.asarray(g(x, {np.int64(n): 1.0})).tolist() == [n, n]
    assert f.tracing_count == 3 and g.tracing_count == 3
    h = mp.function(lambda x, k: mp.ops.add(x, 1.0))
    for _ in range(3):
        h(x, complex(float("nan"), 1.0))                 # one trace, not one a call
    assert h.tracing_count == 1


def test_output_containers_come_back_as_they_went_or_are_refused(backend: mp.Backend) -> None:
    """R4: an OrderedDict came back as a dict; a tuple subclass failed at its first replay."""
    f = mp.function(lambda x: collections.OrderedDict([("b", x), ("a", mp.ops.add(x, 1.0))]))
    for n in range(3):
        out = f(_c(n))
        assert type(out) is collections.OrderedDict and list(out) == ["b", "a"]
        assert np.asarray(out["a"]).tolist() == [n + 1]

    class Pair(tuple):
        def __new__(cls, a: Any, b: Any) -> Pair:
            return super().__new__(cls, (a, b))

    for value, kind in ((lambda x: Pair(x, x), "Pair"),
                        (lambda x: collections.defaultdict(list, {"x": x}), "defaultdict")):
        with pytest.raises(mp.TraceError, match=f"returned a {kind}: a traced step returns"):
            mp.function(value)(_c(1))


def test_a_namedtuple_subclass_with_its_own_new_goes_in_and_out(backend: mp.Backend) -> None:
    """R4b: rebuilt with the type's _make, not its __new__."""
    class Scaled(collections.namedtuple("Scaled", "x scale")):
        def __new__(cls, x: Any, scale: float = 2.0) -> Scaled:
            return super().__new__(cls, x, scale)

    f = mp.function(lambda s: Scaled(mp.ops.multiply(s.x, s.scale), s.scale))
    for n in range(1, 4):
        out = f(Scaled(_c(n)))
        assert type(out) is Scaled and np.asarray(out.x).tolist() == [2 * n]


def test_shared_inside_a_step_restores_the_callers_flag(backend: mp.Backend) -> None:
    """R5: a replay restored the trace's flag when it left the step's shared() block."""
    x = mp.ops.ones((32,))

    def step(x: mp.Tensor) -> mp.Tensor:
        with mp.random.shared():
            return mp.ops.dropout(x, 0.5)

    try:
        results = {}
        for traced in (False, True):
            mp.random.set_stream(1)
            mp.random.set_seed(0)
            f = mp.function(step) if traced else step
            f(x)                                          # traced outside shared()
            with mp.random.shared():
                inside = np.asarray(f(x)).tolist()
                after = mp.random.next_seed()             # still shared: stream 0's
            results[traced] = (inside, after, np.asarray(f(x)).tolist(),
                               mp.random.next_seed())
        assert results[True] == results[False]
    finally:
        mp.random.set_stream(0)


def test_random_state_reads_and_seed_arithmetic_are_refused() -> None:
    """R1 and R7: a replay cannot follow get_state() nor a seed computed from a drawn one."""
    def rewinding(x: mp.Tensor) -> mp.Tensor:
        saved = mp.random.get_state()
        a = mp.ops.random_uniform((3,))
        mp.random.set_state(saved)
        return mp.ops.add(a, mp.ops.random_uniform((3,)))

    def derived(x: mp.Tensor) -> mp.Tensor:
        return mp.ops.random_uniform((3,), seed=mp.random.next_seed() + 1)

    with pytest.raises(mp.TraceError, match=r"cannot read mp.random's state \(get_state\(\)\)"):
        mp.function(rewinding)(_c(1))
    with pytest.raises(mp.TraceError, match=r"cannot compute with, compare or test a seed "
                                            r"from mp.random.next_seed\(\) in Python"):
        mp.function(derived)(_c(1))
    with pytest.warns(RuntimeWarning, match="runs eagerly: a traced step cannot compute"):
        auto = mp.function(derived, fallback=True)
        first = np.asarray(auto(_c(1)))
    assert not np.array_equal(first, np.asarray(auto(_c(1))))   # eager: fresh draws
    # a converted seed read its draw (matched by value) until the fifth round: a constant
    # equal to a drawn seed was then read as the draw too; both are refused now
    converted = mp.function(lambda x: mp.ops.random_uniform((3,), seed=int(mp.random.next_seed())))
    with pytest.raises(mp.TraceError, match="not that seed itself"):
        converted(_c(1))


def test_reading_a_dynamic_loss_scale_in_a_step_is_refused() -> None:
    """R9 (third round): float(opt.loss_scale) in a step replayed the trace's scale."""
    opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(0.1), initial_scale=8)
    with pytest.raises(mp.TraceError, match="a dynamic loss scale's value"):
        mp.function(lambda x: mp.ops.multiply(x, float(opt.loss_scale)))(_c(1))
    fixed = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(0.1), dynamic=False,
                                                  initial_scale=8)
    f = mp.function(lambda x: mp.ops.multiply(x, float(fixed.loss_scale)))
    assert [np.asarray(f(_c(n))).tolist() for n in (1, 2)] == [[8], [16]]   # a constant


def test_a_replay_that_raises_inside_shared_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """R10 (third round): the flag and a token stayed behind when a replay raised inside the
    step's shared() block."""
    be = mp.get_backend()
    table = be.kernels()
    take = table["take"]

    def strict_take(x: Any, i: Any, axis: int) -> Any:
        # raises at the replay on every backend (CUDA's own take reads NaN, OpenCL's raises
        # at the read); a kernel from outside the backend stays a host step under CUDA graphs
        if (np.asarray(be.to_host(i)) >= x.shape[axis]).any():
            raise IndexError("index out of range")
        return take(x, i, axis)

    monkeypatch.setitem(table, "take", strict_take)

    def step(x: mp.Tensor, i: mp.Tensor) -> mp.Tensor:
        with mp.random.shared():
            return mp.ops.take(x, i, 0)

    f = mp.function(step)
    x = _c(1, 2, 3)
    f(x, mp.constant(np.array([0], np.int64)))
    f(x, mp.constant(np.array([1], np.int64)))
    with pytest.raises(IndexError, match="index out of range"):
        f(x, mp.constant(np.array([7], np.int64)))
    assert mp.random.shared_depth() == 0 and not mp.random._shared.get()


def test_each_signature_has_its_own_guards() -> None:
    """R11 (third round): the guards of recorded optimizer updates were one list per function,
    so every new optimizer changed every program's key (the kept one retraced each time) and
    the list grew for ever."""
    def step(opt: Any, v: Any, x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.multiply(v, x))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        return loss

    f = mp.function(step)
    kept, kept_v = mp.optimizers.SGD(0.1), mp.Variable(np.ones(3, F32))
    for _ in range(20):
        opt, v = mp.optimizers.SGD(0.1), mp.Variable(np.ones(3, F32))
        f(opt, v, _c(1, 1, 1))
        f(kept, kept_v, _c(1, 1, 1))
        del opt, v
    gc.collect()
    assert f.tracing_count == 21 and len(f.runners()) == 1
    kept.learning_rate = 0.2                          # its own guard: one more trace
    f(kept, kept_v, _c(1, 1, 1))
    assert f.tracing_count == 22 and len(f.runners()) == 2


def test_a_first_call_that_creates_variables_is_not_held_to_the_seed_rules() -> None:
    """Fourth round: the seed checks refused a layer's build that gave one seed to two
    initializers, in the first call, which creates variables and is never replayed."""
    class Twin(mp.layers.Layer):
        def build(self, shape: Any) -> None:
            seed = mp.random.next_seed()
            init = mp.ops.random_normal((shape[-1], 2), seed=seed)
            self.a = mp.Variable(init)
            self.b = mp.Variable(mp.ops.random_normal((shape[-1], 2), seed=seed))

        def call(self, x: mp.Tensor) -> mp.Tensor:
            return mp.ops.add(mp.ops.matmul(x, self.a), mp.ops.matmul(x, self.b))

    layer = Twin()
    f = mp.function(lambda x: layer(x))
    for _ in range(3):
        f(mp.constant(np.ones((2, 3), F32)))
    assert f.eager_reason is None and f.tracing_count == 2
    np.testing.assert_array_equal(layer.a.numpy(), layer.b.numpy())


def test_a_dynamic_scales_state_read_in_a_step_is_refused() -> None:
    """Fourth round: state_dict() and num_good_steps read the scale past the refusal."""
    opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(0.1), initial_scale=8)
    for read in (lambda: opt.loss_scale.state_dict()["current_loss_scale"],
                 lambda: opt.loss_scale.num_good_steps):
        with pytest.raises(mp.TraceError, match="a dynamic loss scale's value"):
            mp.function(lambda x, read=read: mp.ops.multiply(x, float(read())))(_c(1))
    assert opt.loss_scale.state_dict()["current_loss_scale"] == 8.0   # outside: as ever


def test_tf_function_arguments_are_accepted_and_checked() -> None:
    """``tf.function(fn, jit_compile=..., reduce_retracing=...)`` code runs unchanged: every
    mp.function records and replays (what jit_compile=True asks for; False and None keep it
    too); reduce_retracing=True warns that new shapes still trace; other values name the
    valid ones."""
    w = mp.Variable([1.0, 2.0])
    for jit in (True, False, None):
        fn = mp.function(lambda x: x * w, jit_compile=jit)
        assert [float(fn(mp.constant([v, v]))[1]) for v in (1.0, 2.0)] == [2.0, 4.0]
        assert fn.tracing_count == 1 and "multiply(" in str(fn.graph)

    @mp.function(jit_compile=True)
    def decorated(x: mp.Tensor) -> mp.Tensor:
        return x + 1.0

    decorated(mp.constant([1.0]))
    assert float(decorated(mp.constant([2.0]))[0]) == 3.0 and decorated.tracing_count == 1
    with pytest.warns(UserWarning, match="traces each input shape once"):
        relaxed = mp.function(lambda x: x * 2.0, reduce_retracing=True)
    relaxed(mp.constant([1.0]))
    relaxed(mp.constant([1.0, 2.0]))
    assert relaxed.tracing_count == 2
    with pytest.raises(TypeError, match=r"jit_compile must be True, False or None, got 'yes'"):
        mp.function(lambda x: x, jit_compile="yes")
    with pytest.raises(TypeError, match=r"got 'auto'; 'auto' is Model.compile's"):
        mp.function(jit_compile="auto")
    with pytest.raises(TypeError, match=r"reduce_retracing must be True or False, got 1"):
        mp.function(lambda x: x, reduce_retracing=1)
