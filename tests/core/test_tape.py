"""GradientTape semantics: what is watched, persistence, stop_recording, nested tapes
(second-order derivatives), accumulation, structures, and Variable.read_as caching."""

from __future__ import annotations

import numpy as np
import pytest

import mpcore as mp
from mpcore import ops


def values(t: mp.Tensor | None) -> list[float]:
    assert t is not None
    return np.asarray(t).astype(float).ravel().tolist()


def test_variables_are_watched_constants_are_not(backend: mp.Backend) -> None:
    v = mp.Variable([1.0, 2.0])
    c = mp.constant([3.0, 4.0])
    with mp.GradientTape() as tape:
        y = ops.sum(v * c)
    gv, gc = tape.gradient(y, [v, c])
    assert values(gv) == [3.0, 4.0]
    assert gc is None


def test_watch(backend: mp.Backend) -> None:
    c = mp.constant([3.0, 4.0])
    with mp.GradientTape() as tape:
        tape.watch(c)
        y = ops.sum(c * c)
    assert values(tape.gradient(y, c)) == [6.0, 8.0]
    with pytest.raises(TypeError, match="tensors"):
        mp.GradientTape().watch([1.0])


def test_watch_accessed_variables_false_and_non_trainable(backend: mp.Backend) -> None:
    v = mp.Variable([1.0])
    frozen = mp.Variable([2.0], trainable=False)
    with mp.GradientTape(watch_accessed_variables=False) as tape:
        y = ops.sum(v * 3.0)
    assert tape.gradient(y, v) is None
    with mp.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(v)
        y = ops.sum(v * frozen)
    assert values(tape.gradient(y, v)) == [2.0]
    with mp.GradientTape() as tape:
        y = ops.sum(v * frozen)
    assert tape.gradient(y, frozen) is None
    assert tape.watched_variables() == [v]


def test_unconnected_sources(backend: mp.Backend) -> None:
    a = mp.Variable([1.0, 2.0])
    b = mp.Variable([[5.0]])
    with mp.GradientTape(persistent=True) as tape:
        y = ops.sum(a * a)
    assert tape.gradient(y, b) is None
    zero = tape.gradient(y, [a, b], unconnected_gradients="zero")[1]
    assert zero.shape == (1, 1) and values(zero) == [0.0]
    with pytest.raises(ValueError, match="unconnected_gradients"):
        tape.gradient(y, a, unconnected_gradients="nan")


def test_non_persistent_tape_is_single_use(backend: mp.Backend) -> None:
    v = mp.Variable([2.0])
    with mp.GradientTape() as tape:
        y = ops.sum(v * v)
    assert values(tape.gradient(y, v)) == [4.0]
    with pytest.raises(RuntimeError, match="persistent"):
        tape.gradient(y, v)


def test_persistent_tape(backend: mp.Backend) -> None:
    v = mp.Variable([2.0])
    with mp.GradientTape(persistent=True) as tape:
        y = ops.sum(v * v)
        z = ops.sum(v * 3.0)
    assert values(tape.gradient(y, v)) == [4.0]
    assert values(tape.gradient(z, v)) == [3.0]
    assert values(tape.gradient([y, z], v)) == [7.0]     # several targets: their sum


def test_stop_recording(backend: mp.Backend) -> None:
    v = mp.Variable([2.0])
    with mp.GradientTape() as tape:
        a = v * 3.0
        with tape.stop_recording():
            b = v * 5.0
        y = ops.sum(a + b)
    assert values(tape.gradient(y, v)) == [3.0]
    assert not mp.tape.recording()


def test_nested_tapes_second_derivative_of_x_cubed(backend: mp.Backend) -> None:
    x = mp.constant(2.0)
    with mp.GradientTape() as outer:
        outer.watch(x)
        with mp.GradientTape() as inner:
            inner.watch(x)
            y = x ** 3
        dy = inner.gradient(y, x)
    assert float(dy) == pytest.approx(12.0)              # 3x^2
    assert float(outer.gradient(dy, x)) == pytest.approx(12.0)   # 6x


def test_nested_tapes_with_a_variable(backend: mp.Backend) -> None:
    v = mp.Variable(2.0)
    with mp.GradientTape() as outer:
        with mp.GradientTape() as inner:
            y = v * v * v
        dy = inner.gradient(y, v)
    assert float(dy) == pytest.approx(12.0)
    assert float(outer.gradient(dy, v)) == pytest.approx(12.0)


def test_third_derivative(backend: mp.Backend) -> None:
    x = mp.constant(1.5)
    with mp.GradientTape() as t3:
        t3.watch(x)
        with mp.GradientTape() as t2:
            t2.watch(x)
            with mp.GradientTape() as t1:
                t1.watch(x)
                y = x * x * x * x
            d1 = t1.gradient(y, x)
        d2 = t2.gradient(d1, x)
    assert float(d2) == pytest.approx(12 * 1.5**2)
    assert float(t3.gradient(d2, x)) == pytest.approx(24 * 1.5)


def test_variable_used_twice_accumulates(backend: mp.Backend) -> None:
    v = mp.Variable([1.0, -3.0])
    with mp.GradientTape() as tape:
        y = ops.sum(v * v + v)
    assert values(tape.gradient(y, v)) == [3.0, -5.0]


def test_gradient_sees_the_value_an_op_used(backend: mp.Backend) -> None:
    v = mp.Variable([2.0])
    with mp.GradientTape() as tape:
        y = ops.sum(v * v)
    v.assign([10.0])  # an update after the forward pass does not change its gradient
    assert values(tape.gradient(y, v)) == [4.0]


def test_structures_and_output_gradients(backend: mp.Backend) -> None:
    a = mp.Variable([1.0, 2.0])
    b = mp.Variable([3.0])
    with mp.GradientTape(persistent=True) as tape:
        y = a * b
    g = tape.gradient(y, {"a": a, "pair": (b, [a])})
    assert set(g) == {"a", "pair"} and isinstance(g["pair"], tuple)
    assert values(g["a"]) == [3.0, 3.0] and values(g["pair"][0]) == [3.0]
    assert values(g["pair"][1][0]) == [3.0, 3.0]
    weighted = tape.gradient(y, a, output_gradients=mp.constant([10.0, 100.0]))
    assert values(weighted) == [30.0, 300.0]
    with pytest.raises(ValueError, match="output_gradients"):
        tape.gradient(y, a, output_gradients=[mp.constant([1.0]), mp.constant([1.0])])
    with pytest.raises(TypeError, match="sources"):
        tape.gradient(y, [1.0])


def test_intermediate_tensor_as_source(backend: mp.Backend) -> None:
    v = mp.Variable([2.0])
    with mp.GradientTape() as tape:
        h = v * 3.0
        y = ops.sum(h * h)
    gh, gv = tape.gradient(y, [h, v])
    assert values(gh) == [12.0] and values(gv) == [36.0]


def test_nothing_recorded_outside_a_tape(backend: mp.Backend) -> None:
    v = mp.Variable([1.0])
    y = v * 2.0
    with mp.GradientTape() as tape:
        z = ops.sum(y * 3.0)
    assert tape.gradient(z, v) is None


def test_read_as_caches_within_a_tape_not_across_tapes(backend: mp.Backend) -> None:
    v = mp.Variable([1.0, 2.0])
    assert v.read_as("float32") is v
    with mp.GradientTape() as tape:
        a = v.read_as("float16")
        b = v.read_as("float16")
        assert a is b and a.dtype == "float16"
        y = ops.sum(a * b)              # the cast used twice: the gradient accumulates
    g = tape.gradient(y, v)
    assert g.dtype == "float32" and values(g) == [2.0, 4.0]
    with mp.GradientTape() as tape2:
        c = v.read_as("float16")
        assert c is not a               # a cast recorded by another tape is not reused
        y2 = ops.sum(c * 3.0)
    assert values(tape2.gradient(y2, v)) == [3.0, 3.0]
    outside = v.read_as("float16")
    assert outside is v.read_as("float16")
    v.assign([5.0, 6.0])
    fresh = v.read_as("float16")
    assert fresh is not outside and values(fresh) == [5.0, 6.0]
    v.mark_updated()
    assert v.read_as("float16") is not fresh


def test_variable_basics(backend: mp.Backend) -> None:
    v = mp.Variable([1, 2])
    assert v.dtype == "float32"        # Python numbers make float32 variables
    assert mp.Variable(np.zeros(2, np.float16)).dtype == "float16"
    assert mp.Variable(lambda: [3.0]).numpy().tolist() == [3.0]
    src = mp.constant([1.0, 2.0])
    w = mp.Variable(src)
    w.assign_add([1.0, 1.0])
    assert values(src) == [1.0, 2.0]   # a variable never aliases what it was made from
    assert values(w) == [2.0, 3.0]
    w.assign_sub(mp.constant([2.0, 2.0]))
    assert values(w) == [0.0, 1.0]
    snapshot = w.value()
    w.assign([7.0, 7.0])
    assert values(snapshot) == [0.0, 1.0]
    with pytest.raises(ValueError, match="shape"):
        w.assign([1.0, 2.0, 3.0])
    assert "Variable" in repr(w)


def test_variable_pickles(backend: mp.Backend) -> None:
    import pickle

    v = mp.Variable([1.5, 2.5], name="w", trainable=False)
    u = pickle.loads(pickle.dumps(v))
    assert (u.name, u.trainable, u.dtype, values(u)) == ("w", False, "float32", [1.5, 2.5])
    assert u.backend is v.backend
