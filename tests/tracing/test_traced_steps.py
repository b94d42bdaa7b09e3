"""Traced steps (``mp.function``): a replay equals the eager step bit for bit (float32,
mixed_float16 and mixed_bfloat16, dropout and loss scaling included, on every backend here),
retraces exactly when the signature changes, refuses what a replay could not reproduce with a
message that says what to do, replays a non-finite step as a skip, and resumes exactly from a
checkpoint taken in the middle of traced training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import custom_training_step, mlp_and_optimizer

import mpcore as mp
from mpcore import layers

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
RNG = np.random.default_rng(11)
XS = [RNG.random((32, 20), dtype=np.float32) for _ in range(5)]
YS = [RNG.integers(0, 4, 32) for _ in range(5)]


def build(policy: str, seed: int = 3) -> tuple[mp.Model, Any]:
    return mlp_and_optimizer(policy, seed)


make_step = custom_training_step


def train(policy: str, traced: bool, xs: list[np.ndarray] = XS,
          ys: list[np.ndarray] = YS) -> tuple[list[float], list[np.ndarray], Any, Any]:
    model, opt = build(policy)
    step = make_step(model, opt)
    if traced:
        step = mp.function(step)
    losses = [float(np.asarray(step(mp.constant(x), mp.constant(y)))) for x, y in zip(xs, ys)]
    return losses, model.get_weights(), opt, step


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_equals_eager_bit_for_bit(backend: mp.Backend, policy: str) -> None:
    eager_losses, eager_weights, eager_opt, _ = train(policy, traced=False)
    losses, weights, opt, step = train(policy, traced=True)
    # the first call made Adam's slots (run eagerly, not kept), the second traced: 3 replays
    assert step.tracing_count == 2 and step.graph is not None
    assert losses == eager_losses
    for a, b in zip(weights, eager_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    if policy == "mixed_float16":
        assert opt.loss_scale.state_dict() == eager_opt.loss_scale.state_dict()


def test_dropout_draws_fresh_numbers_at_each_replay() -> None:
    mp.random.set_seed(5)
    f = mp.function(lambda x: mp.ops.dropout(x, 0.5))
    x = mp.ops.ones((64,))
    first, second, third = (np.asarray(f(x)) for _ in range(3))
    assert f.tracing_count == 1
    assert not np.array_equal(second, third)
    mp.random.set_seed(5)
    eager = [np.asarray(mp.ops.dropout(x, 0.5)) for _ in range(3)]
    for a, b in zip((first, second, third), eager):
        np.testing.assert_array_equal(a, b)


def test_retraces_exactly_when_the_signature_changes() -> None:
    mp.set_global_policy("float32")
    f = mp.function(lambda x, scale: mp.ops.multiply(x, scale))
    f(mp.ops.ones((2, 3)), 2.0)
    f(mp.ops.ones((2, 3)), 2.0)
    f(mp.ops.zeros((2, 3)), 2.0)                  # new values, same signature
    assert f.tracing_count == 1
    np.testing.assert_array_equal(np.asarray(f(mp.ops.full((2, 3), 3.0), 2.0)),
                                  np.full((2, 3), 6.0))
    f(mp.ops.ones((4, 3)), 2.0)                   # a new shape
    assert f.tracing_count == 2
    np.testing.assert_array_equal(np.asarray(f(mp.ops.ones((2, 3)), 5.0)), np.full((2, 3), 5.0))
    assert f.tracing_count == 3               # a Python argument is part of the signature
    f(mp.ops.ones((2, 3), "float16"), 2.0)        # a new dtype
    assert f.tracing_count == 4
    with mp.policy_scope("mixed_float16"):    # the policy in effect
        f(mp.ops.ones((2, 3)), 2.0)
    assert f.tracing_count == 5
    f(mp.ops.ones((2, 3)), 2.0)
    assert f.tracing_count == 5


def test_tensors_nested_in_a_list_are_another_signature_than_the_same_tensors_flat() -> None:
    # plain tensor arguments take a quicker signature: it must be the general one's
    f = mp.function(lambda a, b: mp.ops.add(a[0] if isinstance(a, list) else a, b))
    a, b = mp.constant([1.0, 2.0]), mp.constant([5.0, 7.0])
    f(a, b)
    f([a], b)
    f(a, b=b)
    assert f.tracing_count == 3
    f(b, a)
    f([b], a)
    assert f.tracing_count == 3


def test_a_plain_tensor_signature_is_the_general_walks() -> None:
    import sys

    signature = sys.modules["mpcore.tracing.signature"].signature
    a, b = mp.constant([1.0, 2.0]), mp.constant(np.ones((2, 3), np.float16))
    for args in ((a, b), (a, a), (b,), ()):
        assert signature(args, {}, list(args), True) == signature(args, {}, list(args))


def test_a_python_zero_and_minus_zero_are_different_signatures() -> None:
    # 0.0 == -0.0, but x * -0.0 is -0 (a trial found the replay of the 0.0 trace: +0)
    f = mp.function(lambda x, s: mp.ops.multiply(x, s))
    x = mp.constant(np.ones(4, np.float32))
    f(x, 0.0)
    out = np.asarray(f(x, -0.0))
    assert f.tracing_count == 2 and np.signbit(out).all()
    f(x, 0.0)
    assert f.tracing_count == 2


@pytest.mark.parametrize("size", [1000, 32768])
@pytest.mark.parametrize("make", [mp.optimizers.SGD, mp.optimizers.RMSprop],
                         ids=["sgd", "rmsprop"])
@pytest.mark.parametrize("traced", [False, True])
def test_a_learning_rate_of_minus_zero_is_not_taken_for_zero(size: int, make: Any,
                                                              traced: bool) -> None:
    """-0.0 passes the rate's check (>= 0): w = -0 - 1 * (-0.0) is +0 where the 0.0 update
    keeps -0. A trial found both a traced step (its guard took -0.0 for 0.0) and oneDNN's
    eager update (its hyperparameter operands) keeping the 0.0 setting's result."""
    v = mp.Variable(np.full(size, -0.0, np.float32))
    opt = make(0.0)
    step = lambda g: opt.apply_gradients([(g, v)])  # noqa: E731
    if traced:
        step = mp.function(step)
    g = mp.constant(np.ones(size, np.float32))
    step(g)
    step(g)
    assert np.signbit(v.numpy()).all()
    opt.learning_rate = -0.0
    step(g)
    assert not np.signbit(v.numpy()).any()


def test_a_kernel_binding_that_fails_is_reported_and_the_step_replays_unbound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = mp.get_backend("cpu")

    def broken(name: str, kernel: Any, args: tuple[Any, ...]) -> Any:
        raise RuntimeError("no luck")

    monkeypatch.setattr(backend, "bind_kernel", broken)
    f = mp.function(lambda a, b: mp.ops.matmul(a, b))
    a = mp.constant(np.eye(3, dtype=np.float32) * 2, backend=backend)
    with pytest.warns(RuntimeWarning, match="could not bind kernel 'matmul'.*no luck"):
        f(a, a)
    np.testing.assert_array_equal(np.asarray(f(a, a)), np.eye(3) * 4)
    assert f.tracing_count == 1


def test_one_array_passed_twice_is_its_own_signature() -> None:
    f = mp.function(lambda a, b: mp.ops.subtract(a, b))
    a, b = mp.constant([1.0, 2.0]), mp.constant([5.0, 7.0])
    assert np.asarray(f(a, a)).tolist() == [0.0, 0.0]
    assert np.asarray(f(b, a)).tolist() == [4.0, 5.0]      # traced again, not read as (a, a)
    assert np.asarray(f(a, b)).tolist() == [-4.0, -5.0]    # replays the (b, a) trace
    assert f.tracing_count == 2


def test_the_graph_lists_each_kernel_call_with_its_category() -> None:
    mp.set_global_policy("float32")
    f = mp.function(lambda a, b: mp.ops.sum(mp.ops.exp(mp.ops.matmul(a, b))))
    f(mp.ops.ones((2, 3)), mp.ops.ones((3, 4)))
    lines = str(f.graph).splitlines()
    assert [line.split("(")[0] for line in lines] == ["matmul", "exp", "sum"]
    assert lines[0].endswith("[allow]") and lines[1].endswith("[deny]")
    assert "float32[2, 3]" in lines[0] and "-> float32[2, 4]" in lines[0]


@pytest.mark.parametrize(("body", "what"), [
    (lambda t: float(mp.ops.sum(t)), "float(t)"),
    (lambda t: mp.ops.sum(t).numpy(), "t.numpy()"),
    (lambda t: t * 2 if mp.ops.sum(t) > 0 else t, "bool(t)"),
    (lambda t: mp.ops.sum(t).item(), "float(t)"),
])
def test_a_host_read_is_refused_while_tracing(body: Any, what: str) -> None:
    f = mp.function(body)
    with pytest.raises(mp.TraceError, match="cannot read a tensor's value on the host") as err:
        f(mp.ops.ones((3,)))
    assert what in str(err.value) and "mp.ops.where" in str(err.value)
    assert np.asarray(mp.ops.ones((2,))).tolist() == [1.0, 1.0]   # nothing left switched on


def test_variables_are_made_on_the_first_call_only() -> None:
    made: list[mp.Variable] = []

    def lazy(x: mp.Tensor) -> mp.Tensor:
        if not made:
            made.append(mp.Variable(np.ones(3, np.float32)))
        return mp.ops.multiply(x, made[0])

    f = mp.function(lazy)
    f(mp.ops.ones((3,)))                      # creates the variable: run eagerly, not kept
    f(mp.ops.ones((3,)))                      # traces
    made[0].assign(np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(f(mp.ops.ones((3,)))), [2.0, 2.0, 2.0])
    assert f.tracing_count == 2

    g = mp.function(lambda x: mp.ops.multiply(x, mp.Variable(np.ones(3, np.float32))))
    g(mp.ops.ones((3,)))
    with pytest.raises(mp.TraceError, match=r"created variables .* after its first trace"):
        g(mp.ops.ones((3,)))


def test_a_non_finite_step_replays_as_a_skip() -> None:
    xs = [x.copy() for x in XS]
    xs[3][0, 0] = np.inf
    eager_losses, eager_weights, eager_opt, _ = train("mixed_float16", False, xs)
    losses, weights, opt, step = train("mixed_float16", True, xs)
    assert step.tracing_count == 2       # the first call made Adam's slots
    assert not np.isfinite(losses[3]) and losses == [
        v if np.isfinite(v) else losses[3] for v in eager_losses]
    for a, b in zip(weights, eager_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert opt.loss_scale.state_dict() == eager_opt.loss_scale.state_dict()
    assert opt.loss_scale() < 2.0 ** 15          # the skip halved the scale


def test_a_checkpoint_in_the_middle_of_traced_training_resumes_exactly(tmp_path: Path) -> None:
    _, full_weights, _, _ = train("mixed_float16", traced=True)
    model, opt = build("mixed_float16")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt)
    step = mp.function(make_step(model, opt))
    for x, y in zip(XS[:2], YS[:2]):
        step(mp.constant(x), mp.constant(y))
    path = tmp_path / "traced.mpck"
    model.save_checkpoint(str(path))
    mp.random.set_seed(77)

    resumed, opt2 = build("mixed_float16", seed=9)
    resumed.compile(loss="sparse_categorical_crossentropy", optimizer=opt2)
    resumed.load_checkpoint(str(path))
    step2 = mp.function(make_step(resumed, opt2))
    for x, y in zip(XS[2:], YS[2:]):
        step2(mp.constant(x), mp.constant(y))
    for a, b in zip(resumed.get_weights(), full_weights, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy", POLICIES)
def test_fit_evaluate_predict_with_jit_compile_equal_eager(backend: mp.Backend,
                                                           policy: str) -> None:
    x = np.concatenate(XS)[:150]              # 150 rows, batch 32: a smaller last batch
    y = np.concatenate(YS)[:150]
    runs = {}
    for jit in (False, True):
        model, opt = build(policy)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=opt,
                      metrics=["accuracy"], jit_compile=jit)
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, validation_split=0.2)
        runs[jit] = (history.history, model.get_weights(),
                     model.evaluate(x, y, batch_size=32, verbose=0),
                     model.predict(x, batch_size=64), model)
    for a, b in zip(runs[False][:4], runs[True][:4], strict=True):
        if isinstance(a, dict):
            a = {k: v for k, v in a.items() if k != "time_per_sample"}
            b = {k: v for k, v in b.items() if k != "time_per_sample"}
        np.testing.assert_equal(a, b)
    traced = runs[True][4]._traced
    # one trace per batch shape: training on 120 rows, batches of 32 and 24; the 30
    # validation rows, one batch of 30; evaluate on 150 rows, 32 and 22; predict, 64 and 22
    assert traced["train"].tracing_count == 2
    assert traced["test"].tracing_count == 3
    assert traced["predict"].tracing_count == 2
    # the metrics are computed in the replay (accuracy's argmax), only added after it
    assert "argmax" in str(traced["train"].graph) and "argmax" in str(traced["test"].graph)


class _CountingMetric(mp.metrics.Metric):
    """A metric with its own update_state: updated after the traced step, eagerly."""

    def __init__(self) -> None:
        super().__init__("rows")
        self.reset_state()

    def reset_state(self) -> None:
        self.rows = 0

    def update_state(self, y_true: Any, y_pred: Any) -> None:
        self.rows += y_pred.shape[0]

    def result(self) -> float:
        return float(self.rows)


def test_a_metric_with_its_own_update_state_is_updated_after_a_traced_step() -> None:
    x, y = np.concatenate(XS)[:96], np.concatenate(YS)[:96]
    model, opt = build("float32")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt,
                  metrics=["accuracy", _CountingMetric()], jit_compile=True)
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    assert history.history["rows"] == [96.0, 96.0]


def test_jit_compile_is_true_false_or_auto() -> None:
    model, opt = build("float32")
    with pytest.raises(ValueError, match="jit_compile must be True, False or 'auto'"):
        model.compile(loss="mse", optimizer=opt, jit_compile="yes")


def _host_reading_loss(y_true: Any, y_pred: Any) -> mp.Tensor:
    loss = mp.losses.sparse_categorical_crossentropy(y_true, y_pred)
    if float(mp.ops.max(loss)) > 1e6:         # a host read: cannot be traced
        raise AssertionError("unreachable")
    return loss


def test_auto_runs_an_untraceable_step_eagerly_with_one_warning() -> None:
    x, y = np.concatenate(XS)[:96], np.concatenate(YS)[:96]
    weights = {}
    for jit in ("auto", False):
        model, opt = build("float32")
        model.compile(loss=_host_reading_loss, optimizer=opt, jit_compile=jit)
        if jit == "auto":
            with pytest.warns(RuntimeWarning, match="runs eagerly: a traced step cannot read"):
                model.fit(x, y, batch_size=32, epochs=2, verbose=0)
            assert model._traced["train"].eager_reason is not None
        else:
            model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        weights[jit] = model.get_weights()
    for a, b in zip(weights["auto"], weights[False], strict=True):
        np.testing.assert_array_equal(a, b)
    model, opt = build("float32")
    model.compile(loss=_host_reading_loss, optimizer=opt, jit_compile=True)
    with pytest.raises(mp.TraceError, match="cannot read a tensor's value on the host"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)


def test_the_default_is_auto_and_traces() -> None:
    model, opt = build("float32")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt)
    assert model.jit_compile == "auto"
    model.fit(np.concatenate(XS)[:64], np.concatenate(YS)[:64], batch_size=32, verbose=0)
    assert model._traced["train"].tracing_count == 1
    assert model._traced["train"].eager_reason is None


def test_a_backend_may_compile_the_program_its_own_way(monkeypatch: pytest.MonkeyPatch) -> None:
    mp.set_global_policy("float32")
    backend = mp.get_backend("cpu")
    seen: list[Any] = []

    def compile_program(program: Any) -> Any:
        generic = program.compile()
        seen.append(program)

        def run(inputs: list[Any]) -> Any:
            seen.append(len(inputs))
            return generic(inputs)

        return run

    monkeypatch.setattr(backend, "compile_program", compile_program)
    f = mp.function(lambda a, b: mp.ops.add(mp.ops.multiply(a, b), 1.0))
    a = mp.constant([1.0, 2.0], backend=backend)
    f(a, mp.constant([5.0, 6.0], backend=backend))
    out = f(mp.constant([3.0, 4.0], backend=backend), a)
    assert np.asarray(out).tolist() == [4.0, 9.0]
    assert [type(x).__name__ for x in seen] == ["Program", "int"] and seen[1] == 2
    assert [line.split("(")[0] for line in str(seen[0]).splitlines()] == ["multiply", "add"]


def test_the_generic_replay_is_one_python_line_per_kernel() -> None:
    mp.set_global_policy("float32")
    f = mp.function(lambda a: mp.ops.sum(mp.ops.exp(a)))
    f(mp.ops.ones((3,)))
    source = f.graph.compile().source
    calls = [line for line in source.splitlines() if " = k" in line]
    assert len(calls) == 2 and "return _Tensor(" in source, source


DATA = {"lazy": RNG.random((64, 20), dtype=np.float32),
        "conv": RNG.random((64, 8, 8, 2), dtype=np.float32),
        "named_input": {"digits": RNG.random((64, 6), dtype=np.float32)}}
LABELS = RNG.integers(0, 4, 64)


def _model(kind: str) -> mp.Model:
    if kind == "lazy":                        # built by its first call, inside the first step
        return mp.Sequential([layers.Dense(8, activation="relu"), layers.Dropout(0.2),
                              layers.Dense(4), layers.Activation("softmax", dtype="float32")])
    if kind == "conv":
        inputs = mp.Input((8, 8, 2))
        x = layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        x = layers.MaxPooling2D(2)(x)
        x = layers.LayerNormalization()(layers.Flatten()(x))
        return mp.Model(inputs, layers.Activation("softmax", dtype="float32")(layers.Dense(4)(x)))
    inputs = mp.Input((6,), name="digits")        # fed as a dict, matched by name
    x = layers.Dense(8, activation="relu")(inputs)
    return mp.Model(inputs, layers.Activation("softmax", dtype="float32")(layers.Dense(4)(x)))


@pytest.mark.parametrize("kind", list(DATA))
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_traced_fit_of_other_models_equals_eager(kind: str, policy: str) -> None:
    x, y = DATA[kind], LABELS
    runs = []
    for jit in (False, "auto"):
        mp.set_global_policy(policy)
        mp.random.set_seed(21)
        model = _model(kind)
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      metrics=["accuracy"], jit_compile=jit)
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                            validation_data=(x, y))
        runs.append(({k: v for k, v in history.history.items() if k != "time_per_sample"},
                     model.get_weights(), model.predict(x)))
        if jit == "auto":
            assert model._traced["train"].eager_reason is None
            assert model._traced["train"].tracing_count <= 2   # 2: built inside the step
    np.testing.assert_equal(runs[0], runs[1])


# --- defects a new user found (each was silently wrong) ------------------------------------
def test_gradients_flow_through_a_traced_function_called_under_a_tape() -> None:
    w = mp.Variable([2.0])
    f = mp.function(lambda x: x * w)
    for _ in range(3):
        with mp.GradientTape() as tape:
            y = f(mp.constant([3.0]))
        assert np.asarray(tape.gradient(y, w)).tolist() == [3.0]


def test_a_loss_scale_optimizer_step_says_at_each_replay_whether_it_applied() -> None:
    opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD(0.1))
    w = mp.Variable([1.0])
    step = mp.function(lambda g: opt.apply_gradients([(opt.get_unscaled_gradients([g])[0], w)]))
    results = [bool(step(mp.constant([v]))) for v in (1.0, np.inf, 1.0, np.nan)]
    assert results == [True, False, True, False] and step.tracing_count == 1


def test_freezing_a_layer_after_a_traced_fit_takes_effect() -> None:
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
    model = mp.Sequential([mp.Input((4,)), layers.Dense(3), layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    model.fit(x, y, verbose=0)
    model.layers[0].trainable = False
    before = model.layers[0].weights[0].numpy()
    model.fit(x, y, verbose=0)
    np.testing.assert_array_equal(model.layers[0].weights[0].numpy(), before)


def test_instances_that_compare_equal_do_not_share_a_method_trace() -> None:
    class Scaler:
        def __init__(self, name: str, k: float) -> None:
            self.name, self.k = name, mp.Variable(k)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scaler) and self.name == other.name

        def __hash__(self) -> int:
            return hash(self.name)

        @mp.function
        def go(self, x: mp.Tensor) -> mp.Tensor:
            return x * self.k

    assert float(np.asarray(Scaler("s", 2.0).go(mp.constant(1.0)))) == 2.0
    assert float(np.asarray(Scaler("s", 3.0).go(mp.constant(1.0)))) == 3.0


def test_dict_arguments_with_keys_of_several_types() -> None:
    f = mp.function(lambda d: d[1] + d["a"])
    assert float(np.asarray(f({1: mp.constant(1.0), "a": mp.constant(2.0)}))) == 3.0
    assert float(np.asarray(f({1: mp.constant(5.0), "a": mp.constant(2.0)}))) == 7.0
