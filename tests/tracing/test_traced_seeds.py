"""Seeds in traced steps (mpcore.core.trace_seeds): each seed a step draws is drawn again at each
replay where eager execution draws it, so random ops get the seeds eager execution would give
them, in the same order, whatever else the step draws or sets in between. Each case compares
the replays with eager calls from the same seed, on every backend here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpcore as mp

F32 = np.float32


def _host(out: Any) -> list[Any]:
    return [np.asarray(t).tolist() for t in (out if isinstance(out, tuple) else (out,))]


def _eager_and_traced(step: Callable[..., Any], calls: int = 4) -> None:
    """``step`` eagerly and traced, each call from the same seed, then four calls in a row
    (the stream goes on as eagerly): equal bit for bit."""
    f = mp.function(step)
    x = mp.ops.ones((16,))
    for n in range(calls):
        mp.random.set_seed(100 + n)
        eager = _host(step(x))
        mp.random.set_seed(100 + n)
        assert _host(f(x)) == eager, f"call {n}"
    mp.random.set_seed(7)
    eager = [_host(step(x)) for _ in range(calls)]
    mp.random.set_seed(7)
    assert [_host(f(x)) for _ in range(calls)] == eager
    assert f.tracing_count == 1 and f.eager_reason is None


def test_a_seed_drawn_before_another_random_op_is_drawn_first(backend: mp.Backend) -> None:
    """Fifth round: a replay drew each seed at the random op that took it, so a seed drawn
    with next_seed() before another op drew its own was given the other's number (the two
    draws swapped from the second call on)."""
    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        a = mp.ops.random_uniform((16,))             # draws its own seed, after s
        b = mp.ops.random_uniform((16,), seed=s)
        return mp.ops.add(a, x), mp.ops.add(b, x)

    _eager_and_traced(step)


def test_one_seed_for_two_random_ops_gives_them_one_mask(backend: mp.Backend) -> None:
    """Was refused (third round): one seed for the masks of every time step, as a recurrent
    dropout draws it. Each replay draws it once and both ops read it."""
    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        first, second = mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=s)
        return first, second, mp.ops.dropout(x, 0.5)

    _eager_and_traced(step)
    first, second, third = _host(mp.function(step)(mp.ops.ones((16,))))
    assert first == second and first != third


def test_seeds_around_set_seed_and_shared_come_in_eager_order(backend: mp.Backend) -> None:
    """A seed drawn before set_seed() in the step and used after it, and one drawn inside
    shared(): each replay draws them where eager execution does."""
    def step(x: mp.Tensor) -> Any:
        early = mp.random.next_seed()
        mp.random.set_seed(3)
        with mp.random.shared():
            common = mp.random.next_seed()
        late = mp.ops.random_normal((16,))
        return (mp.ops.add(mp.ops.random_normal((16,), seed=early), x),
                mp.ops.add(mp.ops.random_normal((16,), seed=common), late))

    _eager_and_traced(step)


def test_the_graph_shows_where_each_seed_is_drawn(backend: mp.Backend) -> None:
    def step(x: mp.Tensor) -> mp.Tensor:
        s = mp.random.next_seed()
        return mp.ops.add(mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=s))

    f = mp.function(step)
    f(mp.ops.ones((4,)))
    lines = str(f.graph).splitlines()
    draws = [n for n, line in enumerate(lines) if "mp.random.next_seed()  [on each replay]" in line]
    assert len(draws) == 1
    slot = lines[draws[0]].split(" = ")[0]
    readers = [line for line in lines if f"<seed {slot}>" in line]
    assert len(readers) == 2 and lines.index(readers[0]) > draws[0]


def test_a_seed_computed_from_a_drawn_one_is_still_refused() -> None:
    """What a replay cannot follow stays refused: a seed converted and changed in Python."""
    def step(x: mp.Tensor) -> mp.Tensor:
        s = mp.random.next_seed()
        return mp.ops.add(mp.ops.random_uniform((4,), seed=int(s) + 1), x)

    with pytest.raises(mp.TraceError, match="reached no random op as drawn"):
        mp.function(step)(mp.ops.ones((4,)))
    with pytest.raises(mp.TraceError, match="cannot compute with, compare or test a seed"):
        mp.function(lambda x: mp.ops.random_uniform((4,), seed=mp.random.next_seed() + 1))(
            mp.ops.ones((4,)))


# --- from the review of the change above (helper-43) -----------------------------------------
def test_a_constant_seed_equal_to_a_drawn_one_is_refused(backend: mp.Backend) -> None:
    """Defect 1: a constant seed equal in value to a seed the step drew read the draw (the
    seeds were matched by value); so did int(s). Both are refused: a replay cannot tell them
    apart."""
    mp.random.set_seed(42)
    fixed = mp.random.next_seed()

    def step(x: mp.Tensor) -> Any:
        return mp.ops.dropout(x, 0.5), mp.ops.dropout(x, 0.5, seed=fixed)

    mp.random.set_seed(42)                # the step's first draw equals ``fixed``
    with pytest.raises(mp.TraceError, match="not that seed itself"):
        mp.function(step)(mp.ops.ones((8,)))

    def converted(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        return mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=np.int64(s))

    with pytest.raises(mp.TraceError, match="converted with int"):
        mp.function(converted)(mp.ops.ones((8,)))


def test_two_draws_of_equal_value_are_two_draws(backend: mp.Backend) -> None:
    """Defect 2: set_seed(k) between two draws made them equal at the trace, and both ops read
    the second draw at every replay."""
    def step(x: mp.Tensor) -> Any:
        a = mp.random.next_seed()
        mp.random.set_seed(0)
        b = mp.random.next_seed()
        return mp.ops.dropout(x, 0.5, seed=a), mp.ops.dropout(x, 0.5, seed=b)

    mp.random.set_seed(0)                 # the trace: a == b
    f = mp.function(step)
    f(mp.ops.ones((16,)))
    for n in (5, 6):
        mp.random.set_seed(n)
        eager = _host(step(mp.ops.ones((16,))))
        mp.random.set_seed(n)
        assert _host(f(mp.ops.ones((16,)))) == eager and eager[0] != eager[1]


def test_a_drawn_seed_returned_or_given_to_a_call_kept_whole_is_the_replays(
        backend: mp.Backend) -> None:
    """Defects 3 and 4: a seed the step returned, or gave to a call kept whole, was the
    trace's value at every replay; set_seed(next_seed()) in a step (defect 5) was refused as
    arithmetic."""
    from mpcore.tracing.function import kept_whole

    @kept_whole
    def noisy(t: mp.Tensor, seed: int) -> mp.Tensor:
        return mp.ops.add(t, mp.ops.random_uniform((16,), seed=seed))

    def returned(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        return mp.ops.dropout(x, 0.5, seed=s), s

    def whole(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        return mp.ops.dropout(x, 0.5, seed=s), noisy(x, s)

    def reseeding(x: mp.Tensor) -> Any:
        mp.random.set_seed(mp.random.next_seed())
        return mp.ops.dropout(x, 0.5)

    for step in (returned, whole, reseeding):
        _eager_and_traced(step)


def test_a_next_seed_imported_by_name_is_recorded(backend: mp.Backend) -> None:
    """Defect 6: ``from mpcore.random import next_seed`` bypassed the trace's hook (the module
    attribute was swapped), and its seed was the trace's forever."""
    from mpcore.core.random import next_seed

    _eager_and_traced(lambda x: mp.ops.dropout(x, 0.5, seed=next_seed()))


def test_branching_on_a_drawn_seed_is_refused_and_a_leaked_one_is_a_plain_int() -> None:
    """Defects 7 and 8: an ordering or truth test on a drawn seed was the trace's; a drawn
    seed kept after its trace was refused arithmetic in a later trace, where it is a
    constant."""
    box: dict[str, int] = {}

    def branching(x: mp.Tensor) -> mp.Tensor:
        s = mp.random.next_seed()
        y = mp.ops.dropout(x, 0.5, seed=s)
        box["seed"] = s
        return mp.ops.multiply(y, 2.0) if s > (1 << 61) else y

    with pytest.raises(mp.TraceError, match="compare or test a seed"):
        mp.function(branching)(mp.ops.ones((4,)))
    kept = mp.function(lambda x: mp.ops.random_uniform((4,), seed=box["seed"] + 1))
    first = np.asarray(kept(mp.ops.ones((4,)))).tolist()
    assert np.asarray(kept(mp.ops.ones((4,)))).tolist() == first      # a constant seed
    assert kept.eager_reason is None


def test_a_callable_object_without_a_name_is_traced() -> None:
    """From the same review: mp.function(obj) on an object with no __name__ crashed."""
    class Step:
        def __call__(self, x: mp.Tensor) -> mp.Tensor:
            return mp.ops.add(x, 1.0)

    f = mp.function(Step())
    assert np.asarray(f(mp.ops.ones((2,)))).tolist() == [2.0, 2.0] and f.__name__ == "Step"
    with pytest.raises(mp.TraceError, match=r"^Drawing drew a seed"):
        mp.function(type("Drawing", (), {"__call__": lambda self, x: (
            mp.random.next_seed(), x)[1]})())(mp.ops.ones((2,)))


def test_a_drawn_seed_given_to_any_kernel_is_the_replays(backend: mp.Backend) -> None:
    """Second review: a drawn seed given as it is to a kernel other than a random op
    (constant(s), full(shape, s), a variable assigned it) was the trace's value at every
    replay while the same seed also went to a random op: silently wrong."""
    v = mp.Variable(np.zeros((), np.int64), dtype="int64", trainable=False)

    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        v.assign(mp.ops.constant(s, dtype="int64"))
        return mp.ops.dropout(x, 0.5, seed=s), mp.ops.constant(s, dtype="int64"), \
            mp.ops.full((2,), s), mp.ops.add(v, 0)

    _eager_and_traced(step)


def test_a_first_call_that_creates_variables_may_test_a_drawn_seed() -> None:
    """Second review, a regression of the change: NumPy's SeedSequence tests ``seed < 0``; a
    layer built in the first traced call (never replayed) that seeds NumPy from next_seed()
    worked before ordering tests were refused, and was refused with them. A kept trace that
    tests a drawn seed is still refused."""
    w: list[mp.Variable] = []

    def step(x: mp.Tensor) -> Any:
        if not w:
            init = np.random.default_rng(mp.random.next_seed()).normal(size=(16,))
            w.append(mp.Variable(init.astype(F32)))
        return mp.ops.dropout(mp.ops.multiply(x, w[0]), 0.5)

    f = mp.function(step)
    x = mp.ops.ones((16,))
    mp.random.set_seed(3)
    first = _host(f(x))
    w.clear()
    mp.random.set_seed(3)
    assert _host(step(x)) == first
    for n in range(3):                                  # later calls: the kept trace
        mp.random.set_seed(10 + n)
        eager = _host(step(x))
        mp.random.set_seed(10 + n)
        assert _host(f(x)) == eager
    assert f.eager_reason is None

    def kept(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        np.random.default_rng(s)
        return mp.ops.dropout(x, 0.5, seed=s)

    with pytest.raises(mp.TraceError, match="compare or test"):
        mp.function(kept)(x)


def test_rounding_a_drawn_seed_is_refused() -> None:
    def step(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        return mp.ops.dropout(x, 0.5, seed=s), mp.ops.dropout(x, 0.5, seed=round(s, -3))

    with pytest.raises(mp.TraceError, match="compute with"):
        mp.function(step)(mp.ops.ones((4,)))


def test_a_permutation_drawn_in_python_is_refused(on_cpu: mp.Backend,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Second review: on a backend with no random_permutation kernel (a plugin's), the order
    is shuffled in Python and was recorded as a constant, the trace's at every replay. With a
    drawn seed it is refused; with a constant seed it is the same order at every call."""
    on_cpu.kernels()
    table = {k: v for k, v in on_cpu._kernel_table.items() if k != "random_permutation"}
    monkeypatch.setattr(on_cpu, "_kernel_table", table)

    def drawn(x: mp.Tensor) -> mp.Tensor:
        return mp.ops.add(mp.ops.cast(mp.ops.random_permutation(8), "float32"), x)

    with pytest.raises(mp.TraceError, match="has no random_permutation kernel"):
        mp.function(drawn)(mp.ops.ones((8,)))
    fixed = mp.function(lambda x: mp.ops.add(
        mp.ops.cast(mp.ops.random_permutation(8, seed=5), "float32"), x))
    orders = [np.asarray(fixed(mp.ops.ones((8,)))).tolist() for _ in range(3)]
    assert orders[0] == orders[1] == orders[2] and fixed.eager_reason is None

    def one(x: mp.Tensor) -> mp.Tensor:   # n <= 1: one order whatever the seed, so not refused
        return mp.ops.add(mp.ops.cast(mp.ops.random_permutation(1), "float32"), x)

    f = mp.function(one, fallback=False)
    mp.random.set_seed(4)
    eager = [mp.random.next_seed() for _ in range(3)]
    mp.random.set_seed(4)
    assert [np.asarray(f(mp.ops.ones((1,)))).tolist() for _ in range(2)] == [[1.0], [1.0]]
    assert f.tracing_count == 1 and mp.random.next_seed() == eager[2]  # the draws replayed


def test_a_converted_seed_in_a_first_call_that_creates_variables(
        backend: mp.Backend) -> None:
    """Third review: a random op given np.int64(s) was refused at once, also in a first call
    that creates variables (never replayed), as arithmetic was before the second review."""
    state: dict[str, Any] = {}

    def step(x: mp.Tensor) -> Any:
        if "v" not in state:
            s = mp.random.next_seed()
            state["v"] = mp.Variable(mp.ops.random_normal((16,), seed=np.int64(s)), name="v")
        return mp.ops.add(state["v"], mp.ops.dropout(x, 0.5))

    f = mp.function(step)
    mp.random.set_seed(3)
    f(mp.ops.ones((16,)))
    _eager_and_traced(step)


def test_a_permutation_in_python_with_a_converted_seed_is_refused(
        on_cpu: mp.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Third review: with no random_permutation kernel, a permutation given int(s) (the seed
    itself going to a random op too) was the trace's order at every replay, silently; with a
    kernel it is refused. A first call that creates variables may draw one (never replayed)."""
    on_cpu.kernels()
    table = {k: v for k, v in on_cpu._kernel_table.items() if k != "random_permutation"}
    monkeypatch.setattr(on_cpu, "_kernel_table", table)

    def converted(x: mp.Tensor) -> Any:
        s = mp.random.next_seed()
        order = mp.ops.random_permutation(8, seed=int(s))
        return mp.ops.cast(order, "float32"), mp.ops.dropout(x, 0.5, seed=s)

    with pytest.raises(mp.TraceError, match="but not that seed itself"):
        mp.function(converted)(mp.ops.ones((8,)))
    state: dict[str, Any] = {}

    def build(x: mp.Tensor) -> mp.Tensor:
        if "v" not in state:
            order = mp.ops.cast(mp.ops.random_permutation(8), "float32")
            state["v"] = mp.Variable(order, name="order")
        return mp.ops.add(state["v"], x)

    f = mp.function(build)
    f(mp.ops.ones((8,)))
    f(mp.ops.ones((8,)))
    assert f.tracing_count == 2 and f.eager_reason is None


def test_set_stream_of_a_drawn_seed(backend: mp.Backend) -> None:
    """Third review: set_stream(next_seed()) was refused as arithmetic (set_stream compared
    the seed and kept it, next_seed xored it); each replay sets the replay's draw."""
    def step(x: mp.Tensor) -> Any:
        mp.random.set_stream(mp.random.next_seed())
        try:
            return mp.ops.add(mp.ops.random_uniform((16,)), x)
        finally:
            mp.random.set_stream(0)

    _eager_and_traced(step)


def test_a_later_trace_refuses_a_seed_use_before_the_steps_later_effects() -> None:
    """Fourth review: with every seed check made at the end of the trace, a refused step had
    already assigned its variables when TraceError came (a caller retrying eagerly applied the
    step twice). A later trace refuses where the use happens; a function's first trace still
    refuses at its end (only the end of the call tells whether it created variables, which
    makes it a call that is never replayed), after the call's effects."""
    v = mp.Variable(mp.ops.zeros((4,)), name="v")
    made: list[mp.Variable] = []

    def step(x: mp.Tensor, build: bool) -> mp.Tensor:
        if build and not made:
            made.append(mp.Variable(mp.ops.zeros((4,)), name="built"))
        s = mp.random.next_seed()
        d = mp.ops.dropout(x, 0.5, seed=np.int64(s))
        v.assign_add(x)
        return d

    f = mp.function(step)
    f(mp.ops.ones((4,)), True)                 # creates a variable: not kept, not refused
    assert v.numpy().tolist() == [1.0] * 4
    with pytest.raises(mp.TraceError, match="not that seed itself"):
        f(mp.ops.ones((4,)), False)            # a later trace: refused before assign_add
    assert v.numpy().tolist() == [1.0] * 4
    first = mp.function(step)
    with pytest.raises(mp.TraceError, match="not that seed itself"):
        first(mp.ops.ones((4,)), False)        # a first trace: refused at its end
    assert v.numpy().tolist() == [2.0] * 4


def test_a_refusal_the_step_swallows_is_raised_at_the_traces_end() -> None:
    """Final review: a refusal raised where it happens (a later trace's seed use, a host read)
    that the step's own try/except caught left nothing behind, and the trace was kept with the
    traced call's value (silently wrong). It is raised again when the trace ends."""
    made: list[mp.Variable] = []

    def seeded(x: mp.Tensor, build: bool) -> Any:
        if build and not made:
            made.append(mp.Variable(mp.ops.zeros((4,)), name="built"))
        s = mp.random.next_seed()
        try:
            k = s % 1000
        except Exception:
            k = int(s) % 1000
        return mp.ops.dropout(x, 0.5, seed=k), mp.ops.dropout(x, 0.5, seed=s)

    def reading(x: mp.Tensor) -> mp.Tensor:
        try:
            scale = float(mp.ops.sum(x))
        except Exception:
            scale = 1.0
        return mp.ops.multiply(x, scale)

    f = mp.function(seeded)
    f(mp.ops.ones((4,)), True)                  # a first call that creates a variable
    with pytest.raises(mp.TraceError, match="cannot compute with"):
        f(mp.ops.ones((4,)), False)
    with pytest.raises(mp.TraceError, match="cannot read a tensor's value on the host"):
        mp.function(reading)(mp.ops.ones((4,)))
    auto = mp.function(reading, fallback=True)
    with pytest.warns(RuntimeWarning, match="runs eagerly"):
        assert np.asarray(auto(mp.ops.ones((4,)))).tolist() == [4.0] * 4
    assert np.asarray(auto(mp.ops.full((4,), 2.0))).tolist() == [16.0] * 4    # eagerly
