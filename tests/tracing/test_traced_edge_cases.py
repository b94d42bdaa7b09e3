"""Traced steps at the edges of their contract, each case from an adversarial trial of
``mp.function`` (defect numbers of that trial): an input that is also a variable's or a captured
tensor's array (D1), a step without tensor inputs on another backend (D2), a variable's array
read after the step assigns it (D3), a loss replaced after compile (D5), Python arguments by
value (D6), the random state changed inside a step (D8), structured outputs (D9, D10),
namedtuple arguments (D11) and argument objects kept alive by a program (D4). Each replay
equals the eager call, on every backend here."""

from __future__ import annotations

import collections
import dataclasses
import enum
import gc
import weakref
from typing import Any

import numpy as np
import pytest

import mpcore as mp

F32 = np.float32


def _c(*values: float) -> mp.Tensor:
    return mp.constant(np.array(values, F32))


def test_an_input_that_is_also_a_captured_tensor_replays_with_the_next_input(
        backend: mp.Backend) -> None:
    c = _c(1, 2, 3)
    f = mp.function(lambda x: mp.ops.add(x, c))
    np.testing.assert_array_equal(np.asarray(f(c)), [2, 4, 6])
    np.testing.assert_array_equal(np.asarray(f(_c(10, 20, 30))), [11, 22, 33])
    assert f.tracing_count == 1


def test_an_input_that_is_a_variables_array_stays_an_input(backend: mp.Backend) -> None:
    v = mp.Variable(np.array([1, 2, 3], F32))
    g = mp.function(lambda x: mp.ops.multiply(x, v))
    np.testing.assert_array_equal(np.asarray(g(v.current_value())), [1, 4, 9])
    np.testing.assert_array_equal(np.asarray(g(_c(10, 20, 30))), [10, 40, 90])


def test_an_update_of_a_variable_passed_as_its_own_input_writes_the_variable(
        backend: mp.Backend) -> None:
    v = mp.Variable(np.ones(3, F32))
    opt = mp.optimizers.SGD(0.5)

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.multiply(v, x))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        return loss

    step(v.current_value())                      # the trace: v - 0.5 * v = 0.5
    user = np.full(3, 4.0, F32)
    step(mp.constant(user))                      # a replay: 0.5 - 0.5 * 4
    np.testing.assert_array_equal(v.numpy(), [-1.5, -1.5, -1.5])
    np.testing.assert_array_equal(user, [4, 4, 4])   # the caller's array is not written
    assert step.tracing_count == 1


def test_a_step_without_tensor_inputs_retraces_on_another_backend() -> None:
    from conftest import backend_problem

    from mpcore.plugins import registry

    if backend_problem("opencl") is not None:
        pytest.skip(backend_problem("opencl"))
    previous, note = registry._current, registry._detection_note
    f = mp.function(lambda: mp.ops.multiply(mp.ops.ones((3,)), 2.0))
    try:
        mp.set_backend("cpu")
        assert f().backend.name == "cpu"
        mp.set_backend("opencl")
        out = f()
        assert out.backend.name == "opencl" and f.tracing_count == 2
        np.testing.assert_array_equal(np.asarray(out), [2, 2, 2])
    finally:
        registry._current, registry._detection_note = previous, note


def test_a_value_read_before_an_assignment_is_each_replays(backend: mp.Backend) -> None:
    def step(v: Any, x: mp.Tensor) -> mp.Tensor:
        old = v.current_value()
        v.assign(mp.ops.add(old, x))
        return mp.ops.multiply(old, 1.0)

    results = {}
    for traced in (False, True):
        v = mp.Variable(np.zeros(3, F32))
        f = mp.function(lambda x, v=v: step(v, x)) if traced else (lambda x, v=v: step(v, x))
        results[traced] = [np.asarray(f(_c(n, n, n))).tolist() for n in range(1, 5)]
        assert v.numpy().tolist() == [10, 10, 10]
    assert results[True] == results[False] == [[0] * 3, [1] * 3, [3] * 3, [6] * 3]


def test_a_loss_replaced_after_compile_is_used_by_traced_fit(backend: mp.Backend) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8), dtype=F32), rng.integers(0, 3, 64)
    losses = {}
    for jit in (False, True):
        mp.random.set_seed(1)
        model = mp.Sequential([mp.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=mp.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                      jit_compile=jit)
        model.fit(x, y, batch_size=16, verbose=0)
        model.loss = mp.losses.SparseCategoricalCrossentropy(from_logits=True)
        losses[jit] = model.fit(x, y, batch_size=16, verbose=0).history["loss"]
    assert losses[True] == losses[False]


def test_python_arguments_are_keyed_by_value() -> None:
    f = mp.function(lambda x, scale: mp.ops.multiply(x, float(len(scale))))
    x = _c(1, 1)
    s = {1, 2}
    assert np.asarray(f(x, s)).tolist() == [2, 2]
    s.add(3)                                          # a set is read by value: retraced
    assert np.asarray(f(x, s)).tolist() == [3, 3] and f.tracing_count == 2
    g = mp.function(lambda x, table: mp.ops.add(x, table[(0, 1)]))
    for _ in range(3):                                # equal tuple keys, built afresh
        g(x, {(0, 1): 1.0})
    h = mp.function(lambda x, value: mp.ops.add(x, 1.0))
    for _ in range(3):
        h(x, float("nan"))                            # NaN: one trace, not one a call
    assert g.tracing_count == 1 and h.tracing_count == 1


def test_random_state_set_inside_a_step_is_set_at_each_replay(backend: mp.Backend) -> None:
    x = mp.ops.ones((64,))

    def reseeding(x: mp.Tensor) -> mp.Tensor:
        mp.random.set_seed(42)
        return mp.ops.dropout(x, 0.5)

    def shared(x: mp.Tensor) -> mp.Tensor:
        with mp.random.shared():
            return mp.ops.dropout(x, 0.5)

    try:
        for fn in (reseeding, shared):
            masks = {}
            for traced in (False, True):
                mp.random.set_stream(1)                  # rank 1: shared() draws differ
                mp.random.set_seed(0)
                f = mp.function(fn) if traced else fn
                masks[traced] = [np.asarray(f(x)).tolist() for _ in range(3)]
            assert masks[True] == masks[False], fn.__name__
    finally:
        mp.random.set_stream(0)


def test_namedtuples_in_and_out_keep_their_type(backend: mp.Backend) -> None:
    Batch = collections.namedtuple("Batch", "x y")
    Out = collections.namedtuple("Out", "loss aux")
    f = mp.function(lambda b: Out(mp.ops.add(b.x, b.y), [b.x]))
    for n in range(3):
        out = f(Batch(_c(n), _c(1)))
        assert type(out) is Out and np.asarray(out.loss).tolist() == [n + 1]
        assert np.asarray(out.aux[0]).tolist() == [n]
    assert f.tracing_count == 1


def test_dict_outputs_with_any_keys_replay(backend: mp.Backend) -> None:
    class Key(enum.Enum):
        LOSS = 1

    v = mp.Variable(np.zeros(1, F32))

    def step(x: mp.Tensor) -> dict[Any, Any]:
        v.assign(mp.ops.add(v, x))
        return {Key.LOSS: mp.ops.sum(v), float("inf"): x, "n": 3}

    f = mp.function(step)
    for n in range(1, 4):
        out = f(_c(1))
        assert list(out) == [Key.LOSS, float("inf"), "n"] and out["n"] == 3
        assert float(np.asarray(out[Key.LOSS])) == n
    assert f.tracing_count == 1


def test_an_object_holding_tensors_as_output_is_refused() -> None:
    @dataclasses.dataclass
    class Result:
        loss: Any

    f = mp.function(lambda x: Result(mp.ops.add(x, 1.0)))
    with pytest.raises(mp.TraceError, match=r"<lambda> returned a Result: a traced step "
                                            r"returns tensors and plain Python values .* "
                                            r"Return its fields"):
        f(_c(1))
    auto = mp.function(lambda x: Result(mp.ops.add(x, 1.0)), fallback=True)
    with pytest.warns(RuntimeWarning, match="runs eagerly: <lambda> returned a Result"):
        first = auto(_c(1))
    assert np.asarray(auto(_c(5)).loss).tolist() == [6]
    assert np.asarray(first.loss).tolist() == [2]


def test_a_traced_function_keeps_no_argument_object_alive(backend: mp.Backend) -> None:
    """D4: a program held the optimizer it called whole (Adam) and the variables it read, so a
    traced function given a new optimizer and variable at each call kept every one alive."""
    @mp.function
    def step(opt: Any, variables: list[Any], x: mp.Tensor) -> mp.Tensor:
        with mp.GradientTape() as tape:
            loss = mp.ops.sum(mp.ops.multiply(variables[0], x))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        variables[1].assign(mp.ops.add(variables[1], 1.0))
        return loss

    refs: list[weakref.ref[Any]] = []
    for make in (lambda: mp.optimizers.Adam(lambda step: 0.1), lambda: mp.optimizers.SGD(0.1)):
        for _ in range(2):
            w, n = mp.Variable(np.ones(4, F32)), mp.Variable(np.zeros(1, F32))
            opt = make()    # Adam with a Python schedule is kept whole, SGD recorded
            eager = make()
            w_eager, n_eager = mp.Variable(np.ones(4, F32)), mp.Variable(np.zeros(1, F32))
            for _ in range(3):
                step(opt, [w, n], _c(1, 2, 3, 4))
                step._fn(eager, [w_eager, n_eager], _c(1, 2, 3, 4))
            np.testing.assert_array_equal(w.numpy(), w_eager.numpy())
            assert n.numpy().tolist() == [3]
            refs += [weakref.ref(w), weakref.ref(n), weakref.ref(opt)]
            del w, n, opt
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert not step._runners                   # their programs went with them
    assert step.tracing_count == 4
